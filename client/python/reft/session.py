"""reft.Session: one rank's connection to its node's agent, its registered
buffers, and asynchronous snapshots into the agent's shared-memory arenas.

The contract is docs/PROTOCOL.md, "Snapshots".
"""

import atexit
import bisect
import ctypes
import os
import signal
import sys
import threading
import time
import warnings
import weakref

from . import _msglog as L
from . import _wire as W
from ._arena import ArenaCache
from ._crc32c import crc32c
from ._errors import Error
from .layout import default_layout

__all__ = ["Session", "SaveHandle", "common_newest"]

CLIENT_VERSION = "0.1.0"
DEFAULT_CHUNK_SIZE = 4 << 20
_MAX_NAME = 256  # bytes, the agent's limit

_live = weakref.WeakSet()  # open sessions of this process, for fork and exit


def _after_fork_in_child():
    # Only flags are set: the parent's threads do not exist here and its
    # locks may be held forever, so nothing else of a session is touched.
    for s in list(_live):
        s._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_at_exit():
    # The copier is a daemon thread (a hint-mode copier may wait for a
    # window that never comes); finish a pending save rather than let the
    # interpreter kill it mid-copy.
    for s in list(_live):
        if s._pid == os.getpid() and not s._forked and not s._closed:
            try:
                s.close()
            except Exception as e:  # noqa: BLE001 - exiting anyway, say why
                print("reft: closing the session at exit failed: %s" % e, file=sys.stderr)


def common_newest(lists):
    """The largest step present in every list, or None (no list, or no
    step common to all). This is the job-wide restore rule."""
    lists = [set(l) for l in lists]
    if not lists:
        return None
    common = set.intersection(*lists)
    return max(common) if common else None


# The outcome agreement of restore() names the failed ranks through
# agree's contract alone (it returns the values every rank passed): each
# round splits the ranges of ranks that hold a failure into up to
# _OUTCOME_BUCKETS parts, and every rank passes the indexes of the parts it
# does not fail in. The Go client (client/restore.go, agreeFailed) does
# the same, so the clients of one job agree with each other.
_OUTCOME_BUCKETS = 64
_MAX_NAMED_RANKS = 16


def _agree_values(agree, mine):
    got = agree(mine)
    try:
        return list(got)
    except TypeError:
        raise Error("restore(): agree returned %r; expected a list of steps" % (got,)) from None


def _agree_failed(agree, rank, world, failed):
    """The failed ranks (ascending, at most _MAX_NAMED_RANKS) and whether
    more failed, from every rank's call with its own outcome."""
    if 0 in _agree_values(agree, [] if failed else [0]):
        return [], False
    ranges, more = [(0, world)], False
    while any(hi - lo > 1 for lo, hi in ranges):
        parts = []
        for lo, hi in ranges:
            n = hi - lo
            k = min(_OUTCOME_BUCKETS, n)
            parts.extend((lo + i * n // k, lo + (i + 1) * n // k) for i in range(k))
        mine = [i for i, (lo, hi) in enumerate(parts) if not failed or not lo <= rank < hi]
        clean = set(_agree_values(agree, mine))
        ranges = [p for i, p in enumerate(parts) if i not in clean]
        if len(ranges) > _MAX_NAMED_RANKS:
            ranges, more = ranges[:_MAX_NAMED_RANKS], True
    return [lo for lo, _ in ranges], more


def _restore_failed_message(step, ranks, more):
    """What every rank says when a rank could not restore (the Go client's
    restoreFailedMessage says the same)."""
    who = "rank %d" % ranks[0] if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
    if more:
        who += " and more"
    what = ("restore failed on %s before a step was chosen" % who if step is None
            else "restore of step %d failed on %s" % (step, who))
    return (what + ": no rank may train from a state the others lack, so restore fails on every "
            "rank; the failed rank's error and its node's agent log say why; call restore again "
            "on every rank (a corrupt generation is dropped, so the ranks agree on an older step) "
            "or restart the job")


def _check_step(what, step):
    if isinstance(step, bool) or not isinstance(step, int):
        raise Error("%s: step must be an int, not %s" % (what, type(step).__name__))
    if step < 0:
        raise Error("%s: step %d is negative; steps are >= 0" % (what, step))


MAX_COMM_OP = 96  # bytes; the agent's proto.MaxCommOp


def check_comm_op(op):
    """op, if it can name a collective for the agent (proto.CheckCommOp): a
    str of at most MAX_COMM_OP bytes of UTF-8, printable (it reaches the
    agent's log and the recovery log, so no control character may forge a
    line). Else ValueError naming the cause."""
    if not isinstance(op, str):
        raise ValueError("comm op %r is not a str: name the collective in a few words" % (op,))
    n = len(op.encode("utf-8", "surrogatepass"))
    if n > MAX_COMM_OP:
        raise ValueError("comm op of %d bytes is longer than %d: name the collective in a few words" % (n, MAX_COMM_OP))
    for i, ch in enumerate(op):
        if not ch.isprintable() and ch != " ":
            raise ValueError("comm op %r has an unprintable character at character %d: name the collective in printable text" % (op, i))
    return op


def _stderr_log(msg):
    print("reft: " + msg, file=sys.stderr, flush=True)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class _LayoutError(Exception):
    pass


def _check_layout(buffers, arena_size, sections, regions, save):
    """Check regions and sections (lists of the reply's dicts) against the
    rules of docs/PROTOCOL.md, "Regions and sections", as agent/proto's
    CheckLayout does; buffers maps names to _Buffer. Returns the regions as
    (buffer, offset, size, arena_offset), in arena order. Sections have
    unique names, lie in the arena and never overlap; a region is non-empty,
    lies within its buffer and within one section, and overlaps no other in
    the arena; a save's regions fill their sections (a byte nobody copies
    would hold an older generation's), a restore's never overlap within a
    buffer."""
    if not isinstance(sections, list) or not isinstance(regions, list):
        raise _LayoutError("it sent regions %r and sections %r; send both lists or neither"
                           % (type(regions).__name__, type(sections).__name__))
    names, secs = set(), []
    for s in sections:
        name = s.get("name") if isinstance(s, dict) else None
        off = s.get("arena_offset") if isinstance(s, dict) else None
        size = s.get("size") if isinstance(s, dict) else None
        if not isinstance(name, str) or not name or name in names:
            raise _LayoutError("section name %r is empty or not unique" % (name,))
        if not _is_int(off) or not _is_int(size) or off < 0 or size < 0 or off + size > arena_size:
            raise _LayoutError("section %r at [%r, +%r) does not fit the arena of %d bytes"
                               % (name, off, size, arena_size))
        names.add(name)
        if size:
            secs.append((off, size, name))
    secs.sort()
    for (o1, s1, n1), (o2, _, n2) in zip(secs, secs[1:]):
        if o1 + s1 > o2:
            raise _LayoutError("sections %r and %r overlap in the arena" % (n1, n2))
    out = []
    for r in regions:
        r = r if isinstance(r, dict) else {}
        b, off, size, at = buffers.get(r.get("buffer")), r.get("offset"), r.get("size"), r.get("arena_offset")
        if b is None:
            raise _LayoutError("a region names buffer %r, which is not registered" % (r.get("buffer"),))
        if not all(_is_int(v) for v in (off, size, at)) or size <= 0:
            raise _LayoutError("a region of buffer %r is empty or not numbers: %r" % (b.name, r))
        if off < 0 or off + size > b.size:
            raise _LayoutError("region [%d, +%d) of buffer %r leaves the buffer of %d bytes"
                               % (off, size, b.name, b.size))
        if at < 0 or at + size > arena_size:
            raise _LayoutError("region [%d, +%d) of buffer %r at arena offset %d leaves the arena "
                               "of %d bytes" % (off, size, b.name, at, arena_size))
        out.append((at, size, b, off))
    out.sort(key=lambda x: x[0])
    starts = [o for o, _, _ in secs]
    filled = [0] * len(secs)
    for i, (at, size, b, off) in enumerate(out):
        if i and out[i - 1][0] + out[i - 1][1] > at:
            raise _LayoutError("regions of buffers %r and %r overlap in the arena at offset %d"
                               % (out[i - 1][2].name, b.name, at))
        j = bisect.bisect_right(starts, at) - 1
        if j < 0 or at + size > secs[j][0] + secs[j][1]:
            raise _LayoutError("region [%d, +%d) of buffer %r at arena offset %d is not inside one "
                               "section" % (off, size, b.name, at))
        filled[j] += size
    if save:
        for (_, size, name), n in zip(secs, filled):
            if n != size:
                raise _LayoutError("section %r: the regions fill %d of its %d bytes; a save's "
                                   "regions must fill every section" % (name, n, size))
    else:
        by_buf = sorted(out, key=lambda x: (x[2].name, x[3]))
        for p, q in zip(by_buf, by_buf[1:]):
            if p[2] is q[2] and p[3] + p[1] > q[3]:
                raise _LayoutError("two regions restore bytes %d.. of buffer %r; a restore's "
                                   "regions must not overlap in a buffer" % (q[3], q[2].name))
    return [(b, off, size, at) for at, size, b, off in out]


def _env_int(name, default):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise Error("%s=%r is not an integer; it is set by srun for every task" % (name, raw)) from None


def _by_mover(regions):
    """The external buffers' regions, as (mover, [(key, offset, size,
    arena_offset)]) in the order of the movers' first regions."""
    out = {}
    for b, off, size, at in regions:
        if b.mover is not None:
            out.setdefault(id(b.mover), (b.mover, []))[1].append((b.key, off, size, at))
    return list(out.values())


class _CopyFailed(Exception):
    """A fence's failure (args[0]), told apart from the connection's."""


def _wait_fences(fences):
    """Wait for every fence, ignoring their failures (cleanup after an
    earlier one)."""
    for f in fences:
        try:
            f.wait()
        except BaseException:  # noqa: BLE001 - the first failure is reported
            pass


class _Buffer:
    __slots__ = ("name", "size", "replicated", "view", "cview", "addr", "mover", "key")

    def __init__(self, name, view, replicated, mover=None, key=None, size=0):
        self.name, self.view, self.replicated = name, view, replicated
        self.mover, self.key = mover, key
        if mover is not None:  # an external buffer: its mover copies it
            self.size, self.cview, self.addr = size, None, 0
            return
        self.size = view.nbytes
        # A ctypes view gives the address for memmove; it is also a buffer
        # export, which stops a bytearray from being resized under us.
        self.cview = (ctypes.c_char * self.size).from_buffer(view) if self.size else None
        self.addr = ctypes.addressof(self.cview) if self.size else 0

    def release(self):
        self.cview = None
        if self.view is not None:
            self.view.release()


class SaveHandle:
    """One snapshot in progress. ``step``; after success ``seq`` (commit
    order), ``bytes`` and ``checksum_s`` from the agent's commit reply."""

    def __init__(self, session, step):
        self.step = step
        self.seq = self.bytes = self.checksum_s = None
        self._session = session
        self._event = threading.Event()
        self._error = None
        self._observed = False
        self._urgent = False  # the caller waits: copy without waiting for hints
        self._jit = False  # a JIT flush's save, of the buffers at Updating count _epoch
        self._epoch = 0

    @classmethod
    def _finished(cls, session, step):
        h = cls(session, step)
        h._event.set()
        return h

    def done(self):
        """True when the save has finished, successfully or not. Does not
        block and does not hurry the copy."""
        self._session._check_process()
        return self._event.is_set()

    def wait(self, timeout=None):
        """Wait for the save to commit. Returns True when it committed;
        returns False if ``timeout`` seconds passed first (the save goes on;
        wait again). Raises reft.Error when it failed (``e.code`` is the
        agent's error code, or None for a client-side failure). In hint mode,
        waiting makes the copier copy the rest at once."""
        self._session._check_process()
        if not self._event.is_set():
            self._session._hurry(self)
            if not self._event.wait(timeout):
                return False
        if self._error is not None:
            self._observed = True
            raise self._error
        return True

    @property
    def error(self):
        """The reft.Error the save failed with, None while running or after
        success."""
        if self._event.is_set() and self._error is not None:
            self._observed = True
            return self._error
        return None

    def __repr__(self):
        state = "running" if not self._event.is_set() else ("failed" if self._error else "committed")
        return "<reft.SaveHandle step=%d %s>" % (self.step, state)


def spec_every(spec):
    """The every= of a normalized --reft SPEC (the agent's hello reply): 1
    when absent; 0 means no snapshot on the step path (every=0)."""
    for kv in str(spec).split(",")[1:]:
        k, _, v = kv.partition("=")
        if k.strip() == "every" and v.strip().isdigit():
            return int(v.strip())
    return 1


class Session:
    """A rank's reft session. See the package docstring for the API."""

    def __init__(self, layout=None, optional=False, socket_path=None,
                 chunk_size=DEFAULT_CHUNK_SIZE, agree=None, *, rank=None, world=None,
                 local_rank=None):
        self._pid = os.getpid()
        self._forked = False
        self._closed = False
        self._conn = None
        self._op_lock = threading.Lock()  # public operations, one at a time
        self._cv = threading.Condition()  # hint windows and hurry requests
        self._hinted = False
        self._window_end = 0.0
        self._buffers = []
        self._names = set()
        self._frozen = False  # registration was sent (or attempted)
        self._registered = False
        self._pending = None
        self._layout_cache = None  # the last layout checked, see _layout
        self._groups_cache = (None, None)  # regions -> _by_mover(regions)
        self._arenas = ArenaCache(lambda msg: self._log(msg))
        self._warned = False
        self._comm = False  # the last comm notice sent
        self._comm_lock = threading.Lock()
        # JIT flush (see flush()): where the trainer's state stands.
        self._jit_cv = threading.Condition()
        self._consistent = None  # the step the buffers hold; None: not declared
        self._updating = False
        self._epoch = 0  # counts updating() calls
        self._flushing = False
        self._committed = -1  # newest step committed or restored by this session
        self._jit_handle = None  # the newest flush's save
        self._interrupt = None  # set_update_interrupt's callback
        self._watch = None  # the notice connection (watch_failures)
        # The message log: its requests and copies take turns under
        # _log_lock, never held while taking _op_lock (see _log_ready).
        self._log_lock = threading.Lock()
        self._log_maps = L.LogMaps()  # under _log_lock
        self._log = _stderr_log
        self._degraded_said = ""  # the commit replies' degraded reasons last said
        self.optional = bool(optional)
        self.enabled = True
        self.disabled_reason = None
        self.agent = None  # the hello reply
        self.every = 1  # the SPEC's every= (hello reply); 0: save() keeps nothing
        self._every_said = False
        self.registration = None  # the register reply

        self.rank = _env_int("SLURM_PROCID", 0) if rank is None else rank
        self.world = _env_int("SLURM_NTASKS", 1) if world is None else world
        self.local_rank = _env_int("SLURM_LOCALID", 0) if local_rank is None else local_rank
        for what, v, lo in (("world", self.world, 1), ("rank", self.rank, 0),
                            ("local_rank", self.local_rank, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise Error("reft.Session: %s=%r must be an int >= %d" % (what, v, lo))
        if self.rank >= self.world:
            raise Error("reft.Session: rank %d is not below the world size %d (SLURM_PROCID, "
                        "SLURM_NTASKS)" % (self.rank, self.world))
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
            raise Error("reft.Session: chunk_size=%r must be a positive int (bytes)" % (chunk_size,))
        self.chunk_size = chunk_size
        if agree is not None and not callable(agree):
            raise Error("reft.Session: agree must be callable(list of steps) -> list of steps")
        self._agree = agree
        self.layout = default_layout(layout, self.world)

        path = socket_path or os.environ.get("REFT_AGENT_SOCKET", "")
        self.socket_path = path or None
        if not path:
            self._disable_or_raise(
                "reft is not enabled for this step: REFT_AGENT_SOCKET is not set; run with "
                "srun --reft=arc or pass optional=True")
        else:
            try:
                self._conn = W.Connection(path)
                self._hello()
            except Error as e:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self._disable_or_raise(str(e), e)
        _live.add(self)

    # --- setup ---------------------------------------------------------

    def _disable_or_raise(self, reason, err=None):
        if not self.optional:
            raise err if err is not None else Error(reason)
        self.enabled = False
        self.disabled_reason = reason

    def _hello(self):
        hello = {"client": "reft-py/" + CLIENT_VERSION, "pid": self._pid}
        step = os.environ.get("REFT_STEP_ID")
        if step:
            hello["step"] = step
        hello["rank"] = self.rank
        reply = self._conn.call(W.T_HELLO, hello)
        if reply.get("protocol") != W.VERSION:
            raise Error("the reft agent at %s speaks protocol %r; this client (reft-py %s) speaks "
                        "%d; install the Python client of the reft version the cluster runs"
                        % (self._conn.path, reply.get("protocol"), CLIENT_VERSION, W.VERSION))
        self.agent = reply
        self.every = spec_every(reply.get("spec", ""))

    def _warn_disabled(self):
        if not self._warned:
            self._warned = True
            warnings.warn("reft is disabled for this session, snapshots are not taken: %s"
                          % self.disabled_reason, RuntimeWarning, stacklevel=3)

    def _check_process(self):
        if self._forked or os.getpid() != self._pid:
            raise Error("this reft session belongs to process %d and cannot be used in its forked "
                        "child %d (a DataLoader worker or multiprocessing child?): the socket, "
                        "lock and copier thread are the parent's; use reft only in the training "
                        "process" % (self._pid, os.getpid()))

    def _check_usable(self, what):
        self._check_process()
        if self._closed:
            raise Error("reft session: %s after close()" % what)

    # --- registration ----------------------------------------------------

    def register(self, name, buf, replicated=True):
        """Register a writable C-contiguous buffer (bytearray, memoryview,
        numpy array, tensor.numpy(), ...) under a unique name. All buffers
        are registered before the first save(), restore() or generations().
        The buffer must keep its size and address for the session's life."""
        self._check_usable("register()")
        with self._op_lock:
            self._check_new_name(name)
            try:
                view = memoryview(buf)
            except TypeError:
                raise Error("register(%r): %s does not expose a buffer; pass a bytearray, a numpy "
                            "array or tensor.numpy() of a CPU tensor" % (name, type(buf).__name__)) from None
            if view.readonly:
                view.release()
                raise Error("register(%r): the buffer is read-only; restore() must write into it "
                            "(pass a bytearray or a writable array, not bytes)" % name)
            if not view.c_contiguous:
                view.release()
                raise Error("register(%r): the buffer is not C-contiguous; register a contiguous "
                            "copy (numpy.ascontiguousarray, tensor.contiguous()) and train on it" % name)
            try:
                flat = view.cast("B")
            except TypeError as e:
                view.release()
                raise Error("register(%r): cannot view the buffer as bytes: %s" % (name, e)) from None
            view.release()
            self._buffers.append(_Buffer(name, flat, bool(replicated)))
            self._names.add(name)

    def _check_new_name(self, name):
        if not isinstance(name, str) or not name:
            raise Error("register: the buffer name must be a non-empty str, not %r" % (name,))
        if len(name.encode("utf-8")) > _MAX_NAME:
            raise Error("register(%r): the name is longer than %d bytes" % (name[:40] + "...", _MAX_NAME))
        if self._frozen:
            raise Error("register(%r): buffers must be registered before the first save(), "
                        "restore() or generations(); the arena layout is fixed by then "
                        "(open a new Session to change it)" % name)
        if name in self._names:
            raise Error("register(%r): a buffer of that name is already registered" % name)

    def register_external(self, name, nbytes, mover, key=None, replicated=True):
        """Register ``nbytes`` bytes that ``mover`` copies itself, such as
        device memory (reft.torch's CUDA tensors), under a unique name.

        A save calls ``mover.issue(arena, jobs)`` on the saving thread (the
        trainer's, or a JIT flush's) with the writable arena mapping
        (``arena.addr``, ``arena.size``) and jobs ``(key, offset, size,
        arena_offset)``: it starts copying bytes ``offset..offset+size`` of
        the buffer ``key`` to the arena and returns a fence whose ``wait()``
        blocks (the GIL released) until they are there, raising if they
        never will be; the copier thread waits on it before committing, and
        before aborting a failed save, since the arena must not be handed
        back with copies still landing in it. A restore calls
        ``mover.fill(jobs)`` with jobs ``(key, offset, size, view)``, view a
        read-only memoryview of the arena's bytes, which copies them into
        the buffer before it returns."""
        self._check_usable("register_external()")
        with self._op_lock:
            self._check_new_name(name)
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise Error("register_external(%r): nbytes=%r must be an int >= 0" % (name, nbytes))
            if not callable(getattr(mover, "issue", None)) or not callable(getattr(mover, "fill", None)):
                raise Error("register_external(%r): the mover needs issue(arena, jobs) and "
                            "fill(jobs) methods" % name)
            self._buffers.append(_Buffer(name, None, bool(replicated), mover=mover,
                                         key=name if key is None else key, size=nbytes))
            self._names.add(name)

    def _ensure_registered(self):
        if self._registered:
            return
        self._frozen = True
        if not self._buffers:
            return
        req = {"rank": self.rank, "world": self.world, "local_rank": self.local_rank,
               "layout": str(self.layout), "chunk_size": self.chunk_size,
               "buffers": [{"name": b.name, "size": b.size, "replicated": b.replicated}
                           for b in self._buffers]}
        try:
            reply = self._conn.call(W.T_REGISTER, req)
        except Error as e:
            if e.code == "disabled" and self.optional:
                self._disable_or_raise("the agent has no snapshot store: %s" % e.message)
                return
            if e.code == "disabled":
                raise Error("register: the reft agent has no snapshot store (%s); run with "
                            "srun --reft=arc or pass optional=True" % e.message, code=e.code) from None
            raise
        self._check_buffers("register", reply.get("buffers"), reply.get("arena_size"))
        self.registration = reply
        self._registered = True

    def _check_buffers(self, what, places, arena_size):
        """The agent must list our buffers, in order, in an arena of a size."""
        if not _is_int(arena_size) or not isinstance(places, list) or \
                len(places) != len(self._buffers):
            raise Error("%s: the agent's reply lists %s buffers in an arena of %r bytes, this "
                        "session registered %d" % (what, len(places) if isinstance(places, list)
                                                   else "no", arena_size, len(self._buffers)))
        for b, p in zip(self._buffers, places):
            if not isinstance(p, dict) or p.get("name") != b.name or p.get("size") != b.size:
                raise Error("%s: the agent's layout has %r where this session registered "
                            "buffer %r of %d bytes" % (what, p, b.name, b.size))

    def _layout(self, what, reply, save):
        """The regions of a save or restore reply to copy, as (buffer,
        offset, size, arena_offset) in arena order, checked against the
        protocol's rules (docs/PROTOCOL.md, "Regions and sections"). An agent
        from before regions sends none: every buffer whole at its offset."""
        places, arena_size = reply.get("buffers"), reply.get("arena_size")
        regions, sections = reply.get("regions"), reply.get("sections")
        # The agent answers every save of a registration with the same
        # layout: a reply equal to the last one checked is not checked again
        # (list equality is a C loop; the checks below are Python per region).
        c = self._layout_cache
        if c is not None and c[0] == (save, arena_size) and c[1] == places and c[2] == regions and \
                c[3] == sections:
            return c[4]
        self._check_buffers(what, places, arena_size)
        if regions is None and sections is None:
            regions, sections = [], []
            for b, p in zip(self._buffers, places):
                off = p.get("offset")
                sections.append({"name": b.name, "arena_offset": off, "size": b.size})
                if b.size:
                    regions.append({"buffer": b.name, "offset": 0, "size": b.size, "arena_offset": off})
        try:
            out = _check_layout({b.name: b for b in self._buffers}, arena_size, sections, regions, save)
            self._layout_cache = ((save, arena_size), places, reply.get("regions"), reply.get("sections"), out)
            return out
        except _LayoutError as e:
            raise Error("%s: the agent's arena layout breaks the protocol: %s; install the Python "
                        "client of the reft version the cluster runs (agent %s)"
                        % (what, e, (self.agent or {}).get("agent_version"))) from None

    # --- save ------------------------------------------------------------

    def save(self, step):
        """Start a snapshot of every registered buffer as ``step`` and
        return its SaveHandle at once; a background thread copies and
        commits. Do not modify the buffers until the handle is done. A save
        while the previous one is still copying first waits for it. Under
        every=0 (``self.every``, the job's SPEC) it copies nothing: it
        sends the step's progress heartbeat and returns a finished handle;
        the JIT flush still saves (docs/UNDO.md, "every=0")."""
        self._check_usable("save()")
        _check_step("save", step)
        with self._op_lock:
            if self.enabled and self.every == 0:
                return self._heartbeat_locked(step)
            h = self._jit_duplicate(step)
            if h is not None:
                return h
            return self._save_locked(step)

    def _heartbeat_locked(self, step):
        """save() under every=0 (the SPEC): no snapshot on the step path,
        the progress heartbeat of ``step`` instead (hang detection counts
        saves); the JIT flush still saves at a failure. Said once."""
        if not self._every_said:
            self._every_said = True
            self._log("every=0 (%s): no snapshot on the step path; save() sends a progress heartbeat, "
                      "and a failure is covered by the JIT flush of the live state"
                      % (self.agent or {}).get("spec", ""))
        if not self._buffers:
            raise Error("save(%d): nothing is registered; register(name, buf) every buffer of "
                        "the rank's state before the first save" % step)
        self._finish_pending()
        self._ensure_registered()
        if self.enabled:
            self._conn.call(W.T_PROGRESS, {"step": step})
        return SaveHandle._finished(self, step)

    def _save_locked(self, step):
        """save() with the operation lock held."""
        if not self.enabled:
            self._warn_disabled()
            return SaveHandle._finished(self, step)
        if not self._buffers:
            raise Error("save(%d): nothing is registered; register(name, buf) every buffer of "
                        "the rank's state before the first save" % step)
        self._finish_pending()
        self._ensure_registered()
        if not self.enabled:  # the agent said it has no store (optional)
            self._warn_disabled()
            return SaveHandle._finished(self, step)
        reply = self._conn.call(W.T_SAVE, {"step": step})
        try:
            regions = self._layout("save(%d)" % step, reply, save=True)
            arena = self._arenas.get(reply.get("arena"), reply.get("arena_size"), writable=True)
        except Error:
            self._abort_quietly(step)
            raise
        handle = SaveHandle(self, step)
        jobs = [(arena.addr + at, b.addr + off, size) for b, off, size, at in regions
                if b.mover is None]
        fences = []
        try:
            if self._groups_cache[0] is not regions:
                # The same list each save while the layout holds: a mover
                # may prepare its copies once per list.
                self._groups_cache = (regions, _by_mover(regions))
            for mover, ext in self._groups_cache[1]:
                fences.append(mover.issue(arena, ext))
        except BaseException as e:
            _wait_fences(fences)  # copies already started must land before the abort
            self._abort_quietly(step)
            if isinstance(e, Error):
                raise Error("save(%d): %s" % (step, e.message), code=e.code) from None
            raise Error("save(%d): starting the copy failed: %r" % (step, e)) from e
        # The thread holds the mapping and the buffers, so that an
        # interrupted close() cannot unmap or release them under it.
        t = threading.Thread(target=self._copy, args=(handle, jobs, (arena, list(self._buffers)), fences),
                             name="reft-copy-%d" % step, daemon=True)
        self._pending = handle
        t.start()
        return handle

    def _copy(self, handle, jobs, keepalive, fences=()):
        """The copier: region by region in arena order, chunk by chunk, into
        the arena (ctypes.memmove drops the GIL, so training goes on), then
        the external buffers' fences, then commit."""
        step = handle.step
        try:
            cs = self.chunk_size
            try:
                for dst, src, size in jobs:
                    for off in range(0, size, cs):
                        self._await_window(handle)
                        ctypes.memmove(dst + off, src + off, min(cs, size - off))
            except BaseException:
                _wait_fences(fences)
                raise
            for i, f in enumerate(fences):
                try:
                    f.wait()
                except BaseException as e:
                    _wait_fences(fences[i + 1:])
                    raise _CopyFailed(e) from e
            reply = self._conn.call(W.T_COMMIT, {"step": step})
            handle.seq = reply.get("seq")
            handle.bytes = reply.get("bytes")
            handle.checksum_s = reply.get("checksum_s")
            self._note_committed(step)
            self._note_degraded(reply.get("degraded"))
        except _CopyFailed as e:  # an external buffer's copy: the connection is fine
            self._abort_quietly(step)
            cause = e.args[0]
            handle._error = Error("save(%d): %s" % (step, cause.message if isinstance(cause, Error)
                                                    else "the copy failed: %r" % (cause,)))
        except Error as e:
            if e.code is not None and e.code != "forbidden":
                self._abort_quietly(step)  # leave no save open on the agent
            handle._error = Error("save(%d): %s" % (step, e.message), code=e.code)
        except BaseException as e:  # noqa: BLE001 - report it on the handle
            self._abort_quietly(step)
            handle._error = Error("save(%d): the copy failed: %r" % (step, e))
        finally:
            handle._event.set()

    def _abort_quietly(self, step):
        try:
            self._conn.call(W.T_ABORT, {"step": step})
        except Error:
            pass  # the original failure is what the caller needs to see

    def _await_window(self, handle):
        with self._cv:
            while (self._hinted and not handle._urgent
                   and time.monotonic() >= self._window_end):
                self._cv.wait()  # until a hint or a waiter

    def _hurry(self, handle):
        with self._cv:
            handle._urgent = True
            self._cv.notify_all()

    def _finish_pending(self):
        h = self._pending
        if h is None:
            return
        self._hurry(h)
        h._event.wait()
        self._pending = None
        if h._error is not None and not h._observed:
            h._observed = True
            warnings.warn("reft: the snapshot of step %d failed and nobody waited on its "
                          "handle: %s" % (h.step, h._error), RuntimeWarning, stacklevel=4)

    @property
    def pending(self):
        """The SaveHandle of the save in progress, or None."""
        h = self._pending
        return h if h is not None and not h._event.is_set() else None

    def hint_idle(self, ms):
        """Announce that the caller will be idle for about ``ms`` ms from
        now (a pipeline bubble, a data-loading wait). After the first hint
        the copier copies only inside announced windows, and the rest at
        once when the save is waited on, the next save starts, or close()."""
        self._check_usable("hint_idle()")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0 or ms != ms:
            raise Error("hint_idle: ms=%r must be a number >= 0 (milliseconds)" % (ms,))
        if not self.enabled:
            return
        with self._cv:
            self._hinted = True
            self._window_end = max(self._window_end, time.monotonic() + ms / 1000.0)
            self._cv.notify_all()

    def comm_phase(self, active, op=None):
        """Say that this rank enters (True) or leaves (False) a communication
        phase, such as its gradient all-reduce. The agent pauses its background
        replication (the network copies of unreplicated buffers) while any
        rank of the node is in one, so that it uses the network in the gaps
        (GEMINI's interleaving). op, on entry, names the collective in a few
        words ("gradient all-reduce"): if a rank hangs, the agent's verdict
        says which collective it waited in. One small frame the agent does
        not answer, sent only when the phase changes: cheap enough around
        every collective. A broken connection shows at the next save or
        restore; an op that cannot name anything raises ValueError."""
        self._check_usable("comm_phase()")
        active = bool(active)
        msg = {"active": active}
        if op is not None:
            msg["op"] = check_comm_op(op)
        if not self.enabled:
            return
        with self._comm_lock:
            if self._comm == active:
                return
            try:
                self._conn.notify(W.T_COMM, msg)
            except Error:
                return  # the next request reports the broken connection
            self._comm = active

    # --- restore ---------------------------------------------------------

    def progress(self, step):
        """Tell the agent that this rank reached ``step`` (the progress
        heartbeat): a rank that reports no progress, nor saves, for the
        agent's ``detect.hang`` is declared hung. Trainers that save less
        often than every step call it every step (one round trip on the
        local socket). Registers the buffers first if needed."""
        self._check_usable("progress()")
        _check_step("progress", step)
        with self._op_lock:
            if not self.enabled:
                return
            if not self._buffers:
                raise Error("progress(%d): nothing is registered; register(name, buf) first "
                            "(the agent knows a rank by its registration)" % step)
            self._ensure_registered()
            if not self.enabled:
                return
            self._conn.call(W.T_PROGRESS, {"step": step})

    def generations(self, details=False):
        """This rank's committed steps, newest first: on this node, or only
        in the job's persistent directory (with ``details``: the agent's
        dicts {step, seq, bytes, source}, source "memory" or "persistent";
        later agents may add keys). Does not wait for a save in progress."""
        self._check_usable("generations()")
        with self._op_lock:
            if not self.enabled:
                self._warn_disabled()
                return []
            if not self._buffers:
                raise Error("generations(): nothing is registered; register(name, buf) first "
                            "(the agent knows the rank's snapshots once it is registered)")
            self._ensure_registered()
            if not self.enabled:
                self._warn_disabled()
                return []
            gens = self._generations()
            return gens if details else [g["step"] for g in gens]

    def _generations(self):
        reply = self._conn.call(W.T_GENERATIONS)
        gens = reply.get("generations") or []  # Go writes null for none
        if not isinstance(gens, list) or not all(isinstance(g, dict) and isinstance(g.get("step"), int)
                                                 for g in gens):
            raise Error("generations: unreadable reply from the agent: %r" % (reply,))
        return gens

    def restore(self, step=None):
        """Fill every registered buffer from a snapshot and return its step,
        or None when there is nothing to restore. Without ``step``: the
        newest step every rank holds (world > 1 needs ``agree``); with
        ``step``: exactly that one (reft.Error code not_found otherwise).
        A save in progress is finished first.

        Without ``step`` and with world > 1 it is a collective, and no rank
        returns unless every rank restored: after the copy the ranks call
        ``agree`` again (which must return exactly the values every rank
        passed, their intersection), and if any rank failed, every rank
        raises reft.Error naming the failed ranks (``ranks``; ``code`` is
        the rank's own failure's code, None on the ranks that restored,
        whose buffers may then hold the step's bytes). A corrupt generation
        is dropped by the agent: calling restore() again on every rank
        picks the newest step that is left."""
        self._check_usable("restore()")
        if step is not None:
            _check_step("restore", step)
        with self._op_lock:
            if not self.enabled:
                self._warn_disabled()
                return None
            if not self._buffers:
                raise Error("restore(): nothing is registered; register(name, buf) every buffer "
                            "to fill before restoring")
            if step is None and self.world > 1 and self._agree is None:
                raise Error("restore(): this job has %d ranks, and a snapshot is restorable only "
                            "if every rank holds it, so the ranks must agree on the step: pass "
                            "agree=callable(my_steps) -> steps every rank holds (e.g. an "
                            "all-gather and reft.common_newest), or use reft.torch.Checkpointer "
                            "with torch.distributed initialized, or restore(step=N)" % self.world)
            self._finish_pending()
            self._ensure_registered()
            if not self.enabled:
                self._warn_disabled()
                return None
            if step is not None:
                return self._restore(step)
            if self._agree is None:  # world 1: the newest generation
                mine = [g["step"] for g in self._generations()]
                return self._restore(mine[0]) if mine else None
            return self._restore_agreed()

    def _restore_agreed(self):
        # Take part in both agreements even after a local failure, so that
        # the other ranks are not left waiting in the collectives.
        err, chosen = None, None
        try:
            mine = [g["step"] for g in self._generations()]
        except Error as e:
            mine, err = [], e
        common = _agree_values(self._agree, list(mine))
        if err is None and common:
            try:
                chosen = max(common)
            except TypeError:
                raise Error("restore(): agree returned %r; expected a list of steps" % (common,)) from None
            if chosen not in mine:
                err = Error("restore(): agree chose step %r, which this rank (%d) does not hold "
                            "(it holds %s); agree must return steps every rank holds"
                            % (chosen, self.rank, mine))
            else:
                try:
                    self._restore(chosen)
                except Error as e:
                    err = e
        ranks, more = _agree_failed(self._agree, self.rank, self.world, err is not None)
        if err is not None and self.rank not in ranks:
            ranks = sorted(ranks + [self.rank])  # an agree that breaks its contract must not hide our failure
        if ranks:
            msg = _restore_failed_message(chosen, ranks, more)
            if err is not None:
                msg += " (this rank: %s)" % err
            e = Error(msg, code=err.code if err is not None else None)
            e.ranks, e.more, e.step = ranks, more, chosen
            raise e from err
        if chosen is None and mine:
            # Not a first launch: committed work is being thrown away.
            self._log("restore: this rank holds step(s) %s, but no step is held by every rank of the job: "
                      "starting from the beginning; the agents' logs say which generations each node kept"
                      % sorted(mine, reverse=True))
        return chosen

    def _restore(self, step):
        reply = self._conn.call(W.T_RESTORE, {"step": step})
        got = reply.get("step", step)
        try:
            regions = self._layout("restore(%d)" % step, reply, save=False)
            arena = self._arenas.get(reply.get("arena"), reply.get("arena_size"), writable=False)
            cs = self.chunk_size
            with memoryview(arena.mm) as src:
                for mover, ext in _by_mover(regions):
                    mover.fill([(key, off, size, src[at:at + size]) for key, off, size, at in ext])
                for b, off, size, at in regions:
                    if b.mover is not None:
                        continue
                    # Chunked, so other threads get the GIL between chunks.
                    for o in range(0, size, cs):
                        n = min(cs, size - o)
                        b.view[off + o:off + o + n] = src[at + o:at + o + n]
        except BaseException:
            try:
                self._conn.call(W.T_RELEASE, {"step": got})
            except Error:
                pass
            raise
        self._conn.call(W.T_RELEASE, {"step": got})
        self._note_committed(got)  # a JIT flush need not save it again
        return got

    # --- message log -----------------------------------------------------
    #
    # SWIFT-style message logging (docs/LOGGING.md; docs/PROTOCOL.md,
    # "Message log"; the Go client's LogAppend, LogRead, LogTruncate and
    # LogSteps): a pipeline stage stores each message it sends across a
    # machine boundary in its node's agent, in host memory, so that a
    # neighbour that fails can replay its steps from them while this stage
    # keeps its state. Each message is checksummed (CRC-32C) by the client
    # as it is appended and again after it is read (reft._crc32c: the
    # kernel's where it has one, else about 200 MB/s of pure Python).

    def log_append(self, stream, step, seq, data):
        """Store ``data``, one message this rank sent across a machine
        boundary, as (``stream``, ``step``, ``seq``) in the node's agent;
        returns True when the agent already held that message with the same
        bytes (the same size and CRC-32C: a replayed step sends it again),
        which it keeps, else False. Another size or other bytes under a key
        held: reft.Error with code "mismatch", the held message unchanged.

        ``stream``: the caller's name for the link, e.g. "act>3" or "grad>1"
        (the kind and the receiving rank): 1 to 64 bytes of printable ASCII
        without spaces. ``step`` >= 0; ``seq`` (the message's number within
        the step, e.g. the microbatch) in [0, 2**31-1]. ``data``: a non-empty
        bytes-like object (bytes, bytearray, memoryview, a numpy array;
        its bytes in C order) or a torch.Tensor (its bytes; a CUDA tensor is
        copied to the host first, which waits for the device's work on it).
        ``data`` must not change until log_append returns.

        The contract of every log call: a log belongs to the rank this
        session registered as, so the first log call registers the buffers
        as the first save() does: register() them before it. Only this
        rank reads or truncates its log, through its own node's agent; the
        messages outlive this process and a restart of the agent, not the
        node. The log calls may run on any thread, beside save(), its copy
        and restore(); they take turns with each other (an append reaches
        its commit with no other log request between). They raise
        reft.Error: an agent's refusal keeps its code (``e.code``:
        "no_space" for an append over the rank's cap or the node's memory
        budget, nothing held being dropped; "mismatch"; "corrupt" for a
        message whose bytes fail their CRC-32C; "not_found" for a key the
        agent does not hold; "disabled" when the job has no store), the
        client's own refusals have code None. A disabled session
        (optional=True without an agent, or an agent without a store)
        raises too, as the Go client does (ErrLogDisabled), where save()
        quietly does nothing: a stage that logs counts on its messages for
        a replay, so it learns at once that none are kept; check
        ``s.enabled`` and skip logging when it is False."""
        self._check_usable("log_append()")
        what = "message log append of " + L.key_name(stream, step, seq)
        try:
            bad = L.check_key(stream, step, seq)
            if bad:
                raise Error(bad)
            src, keep = L.source(data)
        except Error as e:
            raise L.wrap(what, e) from None
        try:
            n = src.nbytes
            if n <= 0:
                raise Error("size = 0 must be positive (log messages of at least one byte)")
            self._log_ready()
            with self._log_lock:
                self._check_usable("log_append()")
                key = {"stream": stream, "step": step, "seq": seq}
                reply = self._conn.call(W.T_LOG_APPEND, dict(key, size=n))
                # On a failure from here on, the agent drops the open
                # append at the connection's next log request.
                arena = self._log_maps.get(*L.append_reply(reply, n))
                with memoryview(arena.mm) as whole, whole[:n] as dst:
                    L.copy(dst, src, self.chunk_size)
                    # The CRC-32C of the bytes as the arena holds them: the
                    # agent checksums the same bytes and stores them only
                    # when the two agree.
                    crc = crc32c(dst)
                reply = self._conn.call(W.T_LOG_COMMIT, dict(key, crc32c=crc))
                return L.commit_reply(reply)
        except Error as e:
            raise L.wrap(what, e) from None
        finally:
            src.release()
            del keep

    def log_read(self, stream, step, seq, out=None):
        """The message (``stream``, ``step``, ``seq``) this rank appended:
        its bytes, or, with ``out`` (a writable C-contiguous buffer or a
        contiguous tensor, on the CPU or a device, of exactly the message's
        size), ``out`` filled with them. The agent verifies the message's
        CRC-32C before it replies, and log_read checks its copy against it
        again. A key the agent does not hold (never appended, truncated, or
        lost with the node) is reft.Error with code "not_found". The
        contract of log_append holds (registration, threads, a disabled
        session raising)."""
        self._check_usable("log_read()")
        what = "message log read of " + L.key_name(stream, step, seq)
        sink = None
        try:
            bad = L.check_key(stream, step, seq)
            if bad:
                raise Error(bad)
            if out is not None:
                sink = L.Sink(out)
            self._log_ready()
            with self._log_lock:
                self._check_usable("log_read()")
                reply = self._conn.call(W.T_LOG_READ, {"stream": stream, "step": step, "seq": seq})
                path, arena_size, size, want = L.read_reply(reply)
                if sink is not None and sink.nbytes != size:
                    raise Error("the stored message has %d bytes, out has %d: read it into a buffer "
                                "of its exact length (or pass no out)" % (size, sink.nbytes))
                arena = self._log_maps.get(path, arena_size)
                staged = None
                with memoryview(arena.mm) as whole, whole[:size] as src:
                    if sink is None:
                        staged = src.tobytes()
                        got = crc32c(staged)
                    elif sink.view is not None:
                        L.copy(sink.view, src, self.chunk_size)
                        got = crc32c(sink.view)
                    else:
                        staged = bytearray(src)
                        got = crc32c(staged)
                if got != want:
                    raise Error("the copy of the message fails its CRC-32C: the agent verified %#010x, "
                                "the copy has %#010x: its arena was rewritten during the copy (another "
                                "process of this rank truncated and appended meanwhile) or this host's "
                                "memory is failing; read it again" % (want, got))
            if sink is None:
                return staged
            if sink.device is not None:
                sink.finish(staged)
            return out
        except Error as e:
            raise L.wrap(what, e) from None
        finally:
            if sink is not None:
                sink.release()

    def log_truncate(self, up_to):
        """Drop every message of every stream of this rank with step <=
        ``up_to``; their memory serves the rank's next appends. Returns
        (messages, bytes) dropped. A message of step s is needed until its
        receiver holds a snapshot of a step >= s that survives a node's
        loss (docs/LOGGING.md, "Truncation"). The contract of log_append
        holds."""
        self._check_usable("log_truncate()")
        what = "message log truncation up to step %r" % (up_to,)
        try:
            bad = L.check_up_to(up_to)
            if bad:
                raise Error(bad)
            self._log_ready()
            with self._log_lock:
                self._check_usable("log_truncate()")
                reply = self._conn.call(W.T_LOG_TRUNCATE, {"up_to": up_to})
                dropped = L.truncate_reply(reply)
                self._log_maps.sweep()
                return dropped
        except Error as e:
            raise L.wrap(what, e) from None

    def log_steps(self, stream):
        """The steps of ``stream`` the agent holds at least one message of
        for this rank, ascending (empty when none). The contract of
        log_append holds."""
        self._check_usable("log_steps()")
        what = "message log steps of stream " + L.stream_name(stream)
        try:
            bad = L.check_stream(stream)
            if bad:
                raise Error(bad)
            self._log_ready()
            with self._log_lock:
                self._check_usable("log_steps()")
                return L.steps_reply(self._conn.call(W.T_LOG_STEPS, {"stream": stream}))
        except Error as e:
            raise L.wrap(what, e) from None

    def _log_ready(self):
        """Register the rank's buffers with the agent when no save(),
        restore() or progress() did yet: a log belongs to the rank the
        connection registered as. Takes _op_lock only then (a restore in
        a collective holds it for long)."""
        if not self.enabled:
            raise Error("reft is disabled for this session (%s): the message log needs the node's "
                        "agent, and nothing was logged or read" % self.disabled_reason)
        if self._registered:
            return
        with self._op_lock:
            if self._closed:
                raise Error("reft session: the message log after close()")
            if not self._buffers:
                raise Error("nothing is registered: a log belongs to the rank the session registered "
                            "as; register(name, buf) the rank's buffers first")
            self._ensure_registered()
            if not self.enabled:  # the agent said it has no store (optional)
                raise Error("reft is disabled for this session (%s): the message log is disabled "
                            "with snapshots, and nothing was logged or read" % self.disabled_reason)

    # --- JIT flush ---------------------------------------------------------
    #
    # When another node of the job fails, the surviving ranks are typically
    # blocked in a collective that the dead rank never joins, holding the
    # consistent state of their last finished step; flush() saves it at once
    # if it is newer than the last committed snapshot, so a failure loses at
    # most the step in progress whatever the snapshot interval (the JIT
    # checkpointing paper). The trainer declares consistent(step) once the
    # buffers hold the whole state of step (after optimizer.step()) and
    # updating() before it changes them again.
    #
    # Threads and the GIL: the flush runs on the notice thread (or the
    # signal thread), its copy on the copier thread with ctypes.memmove,
    # which releases the GIL. It needs the GIL only between chunks, so it
    # progresses while the training thread waits in a collective that
    # releases the GIL (torch.distributed's do) or in Python code, but not
    # while that thread runs a long C call that holds the GIL. The buffers
    # must be host memory (reft.torch: CPU tensors): a flush never touches
    # a device or its streams, which a hung collective may have blocked.

    def consistent(self, step):
        """Declare that the registered buffers hold the whole state of
        ``step`` (call it after the optimizer update of step) and will not
        change until updating(). A failure notice (watch_failures) or a
        signal (flush_on_signal) then saves step if it is newer than the
        newest committed snapshot."""
        self._check_usable("consistent()")
        _check_step("consistent", step)
        with self._jit_cv:
            self._consistent, self._updating = step, False
            self._jit_cv.notify_all()

    def updating(self):
        """Declare that the buffers are about to change (call it before the
        optimizer update). Waits while a flush copies them."""
        self._check_usable("updating()")
        with self._jit_cv:
            while self._flushing:
                self._jit_cv.wait()
            self._updating = True
            self._epoch += 1
            self._jit_cv.notify_all()

    def undone(self):
        """Declare that the update in progress was undone (reft.undo): the
        buffers hold the step declared consistent before updating() again,
        so a flush waiting for the update saves that step."""
        self._check_usable("undone()")
        with self._jit_cv:
            self._updating = False
            self._jit_cv.notify_all()

    def set_update_interrupt(self, fn):
        """``fn()`` (None: none) is called, from the flush's thread, when a
        flush finds the trainer updating: a trainer that can undo its
        update (reft.undo.UpdateUndo.request_stop) stops at its next
        tensor boundary, undoes the applied part and calls undone(), so the
        flush saves the previous step instead of waiting for the update."""
        with self._jit_cv:
            self._interrupt = fn

    def _note_degraded(self, why):
        """Say, once per change, what the agent's commit replies say of the
        node's protection: a warning when the reasons (the
        reft_protection_degraded metric's, docs/METRICS.md) appear or change,
        a notice when they are gone."""
        now = ", ".join(str(w) for w in why) if isinstance(why, list) else ""
        if now == self._degraded_said:
            return
        was, self._degraded_said = self._degraded_said, now
        if now:
            self._log("warning: the agent says this node's snapshots are less protected than the SPEC "
                      "asks (%s): a failure may cost more than the SPEC promises; `reft status` says why, "
                      "docs/METRICS.md explains each reason" % now)
        else:
            self._log("the agent says this node's snapshots are protected as the SPEC asks again "
                      "(it had said: %s)" % was)

    def _note_committed(self, step):
        with self._jit_cv:
            self._committed = max(self._committed, step)

    def _end_flush(self):
        with self._jit_cv:
            self._flushing = False
            self._jit_cv.notify_all()

    def flush(self, reason="requested", timeout=None):
        """Save the consistent step now if it is newer than the newest step
        committed (or restored) by this session, waiting up to ``timeout``
        seconds (None: no limit) for an update in progress to end. Returns
        (step, saved): the consistent step (None: none declared) and whether
        this call saved it; a step the trainer is already saving is waited
        for, not saved twice. Raises reft.Error when it gives up or the
        save fails. ``reason`` goes into the one line logged per save."""
        self._check_usable("flush()")
        if not self.enabled:
            return None, False
        deadline = None if timeout is None else time.monotonic() + timeout

        def left():
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._jit_cv:
            asked = False
            while self._flushing or self._updating:
                if self._updating and not asked and self._interrupt is not None:
                    asked = True
                    self._interrupt()
                if deadline is not None and left() <= 0:
                    raise Error("JIT flush (%s): the trainer is changing its state and did not reach "
                                "a consistent step within %.1f s" % (reason, timeout))
                self._jit_cv.wait(left())
            step, epoch = self._consistent, self._epoch
            if step is None or step <= self._committed:
                return step, False
            self._flushing = True
        start = time.monotonic()
        release = True
        try:
            h, own = self._save_jit(step, epoch)
            if not h.wait(left()):
                # Out of time with the copy running: the trainer must not
                # change the buffers under it, so updating() waits on.
                release = False
                threading.Thread(target=lambda: (h._event.wait(), self._end_flush()),
                                 name="reft-jit-release", daemon=True).start()
                raise Error("JIT flush of step %d (%s): the save did not finish within %.1f s"
                            % (step, reason, timeout))
            if own:
                # Before the release: a flush waiting on this one (the
                # signal's, which then kills the process) must find the
                # line written.
                self._log("JIT save of step %d committed in %.1f ms (%s)"
                          % (step, (time.monotonic() - start) * 1e3, reason))
        finally:
            if release:
                self._end_flush()
        return step, own

    def _save_jit(self, step, epoch):
        """The flush's save of step, or the trainer's own when that is the
        newest save (then own is False)."""
        with self._op_lock:
            p = self._pending
            if p is not None and p.step == step and not p._jit and \
                    (not p._event.is_set() or p._error is None):
                return p, False
            h = self._save_locked(step)
            h._jit, h._epoch = True, epoch
            self._jit_handle = h
            return h, True

    def _jit_duplicate(self, step):
        """The flush's save of step when the trainer now saves the same step
        with the buffers unchanged since; the op lock is held."""
        h = self._jit_handle
        if h is None or h.step != step or (h._event.is_set() and h._error is not None):
            return None
        with self._jit_cv:
            return h if h._epoch == self._epoch else None

    def watch_failures(self, wait=10.0, log=None):
        """Open a second connection to the agent that receives its notices
        (docs/PROTOCOL.md, "Notices") and, at each peer failure notice,
        flush() from a daemon thread, waiting up to ``wait`` seconds for a
        consistent step. ``log(msg)`` receives the flush's lines (default:
        stderr). close() stops it. Nothing happens on a disabled session."""
        self._check_usable("watch_failures()")
        if log is not None:
            self._log = log
        if not self.enabled or self._watch is not None:
            return
        conn = W.Connection(self.socket_path)
        try:
            conn.call(W.T_HELLO, {"client": "reft-py/%s notices" % CLIENT_VERSION, "pid": self._pid,
                                  "rank": self.rank})
            conn.call(W.T_WATCH)
        except Error as e:
            conn.close()
            if e.code == "unknown_type":
                raise Error("watch_failures(): the agent (%s) has no notices; the JIT flush needs "
                            "an agent of this client's release" % (self.agent or {}).get("agent_version"),
                            code=e.code) from None
            raise
        self._watch = conn
        threading.Thread(target=self._read_notices, args=(conn, wait), name="reft-notices",
                         daemon=True).start()

    def _read_notices(self, conn, wait):
        while True:
            try:
                ftype, _, notice = W.read_frame(conn._rfile.read)
            except (W.FrameError, OSError, ValueError):
                return  # closed by close(), or the agent is gone
            if ftype != W.T_NOTICE or notice.get("kind") != "peer_failure":
                continue  # a kind this client does not know
            reason = "node %s failed: %s" % (notice.get("node"), notice.get("cause"))
            try:
                step, saved = self.flush(reason, timeout=wait)
                if not saved and step is not None:
                    self._log("JIT flush after %s: step %d is already saved" % (reason, step))
            except Error as e:
                if self._closed:
                    return
                self._log(str(e))

    def flush_on_signal(self, timeout=3.0, signals=(signal.SIGTERM,)):
        """At the first of ``signals`` (Slurm sends SIGTERM to every task of
        a step it kills, then SIGKILL after KillWait), flush() within
        ``timeout`` seconds, which must fit inside KillWait, then die of the
        signal as without a handler. Call it from the main thread. It works
        while the main thread is blocked in a collective, where a Python
        signal handler would not run: the signal is read from
        signal.set_wakeup_fd by a thread of its own, so it takes that fd
        (an asyncio loop must not be using it) and replaces the handlers of
        ``signals``."""
        self._check_usable("flush_on_signal()")
        if not self.enabled:
            return
        if threading.current_thread() is not threading.main_thread():
            raise Error("flush_on_signal(): call it from the main thread (Python installs signal "
                        "handlers there only)")
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError as e:
            os.close(r)
            os.close(w)
            raise Error("flush_on_signal(): %s" % e) from None
        if old != -1:
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            raise Error("flush_on_signal(): signal.set_wakeup_fd is already in use (fd %d, an "
                        "asyncio loop?); the signal flush needs it" % old)
        wanted = {int(s) for s in signals}
        for s in wanted:
            # The C handler Python installs for a Python handler writes the
            # signal number to the wakeup fd at once; the Python part runs
            # only when the main thread gets back to Python, if ever.
            signal.signal(s, lambda *_: None)
        threading.Thread(target=self._signal_flush, args=(r, wanted, timeout), name="reft-signal",
                         daemon=True).start()

    def _signal_flush(self, r, wanted, timeout):
        while True:
            data = os.read(r, 64)
            if not data:
                return
            hit = [b for b in data if b in wanted]
            if hit:
                break
        sig = signal.Signals(hit[0])
        try:
            step, saved = self.flush("signal %s" % sig.name, timeout=timeout)
            if not saved and step is not None:
                self._log("JIT flush at signal %s: step %d is already saved" % (sig.name, step))
        except Error as e:
            self._log(str(e))
        # Die of the signal: its default action, set through libc since
        # Python sets handlers from the main thread only.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(int(sig), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), int(sig))

    # --- misc ------------------------------------------------------------

    def status(self):
        """The agent's status reply (dict), e.g. its ``store_dir``."""
        self._check_usable("status()")
        if not self.enabled:
            raise Error("status(): reft is disabled for this session: %s" % self.disabled_reason)
        with self._op_lock:
            return self._conn.call(W.T_STATUS)

    def close(self):
        """Finish the save in progress, then close the connection and the
        arena mappings. Idempotent."""
        self._check_process()
        if self._closed:
            return
        with self._op_lock:
            if self._closed:
                return
            try:
                self._finish_pending()
            finally:
                self._closed = True
                _live.discard(self)
                if self._watch is not None:
                    self._watch.shutdown()  # ends the notice thread's read
                    self._watch.close()
                if self._conn is not None:
                    self._conn.close()
                # Unmap and release only when no copier runs (close() may
                # have been interrupted while waiting); else GC does it later.
                if self._pending is None or self._pending._event.is_set():
                    self._arenas.close()
                    for b in self._buffers:
                        b.release()
                # A log call in progress ends first (its next request
                # fails on the closed connection).
                with self._log_lock:
                    self._log_maps.sweep(everything=True)

    def __enter__(self):
        self._check_usable("with")
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self._closed else ("enabled" if self.enabled else "disabled")
        return "<reft.Session rank=%d/%d %s %s>" % (self.rank, self.world, self.layout, state)
