"""reft: in-memory snapshots of a training job's state through the node's
reft agent (pure Python, standard library only).

    import reft
    s = reft.Session()                  # rank, world, socket from srun --reft
    s.register("weights", buf)          # writable C-contiguous buffers
    step = s.restore()                  # None: start fresh
    h = s.save(step)                    # returns at once; copies in the background
    h.wait()                            # raises reft.Error on failure
    s.close()

The protocol is docs/PROTOCOL.md in the reft repository. The torch adapter
is reft.torch (imported only on request: this package never imports torch).
"""

from ._errors import Error
from .layout import Layout
from .session import CLIENT_VERSION as __version__
from .session import SaveHandle, Session, common_newest

__all__ = ["Error", "Layout", "SaveHandle", "Session", "common_newest", "__version__"]
