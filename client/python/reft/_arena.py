"""Shared-memory arenas named by the agent: mapped once, kept by path.

Writable mappings (the ones saves copy into) are registered with the CUDA
runtime (cudaHostRegister) when the process uses CUDA through torch, so a
device-to-host copy into an arena is a DMA rather than a copy through the
runtime's bounce buffer; see _cuda_runtime for when."""

import ctypes
import errno
import mmap
import os
import stat
import sys

from ._errors import Error

# cudaHostRegisterPortable: the registration is seen by every CUDA context.
_PORTABLE = 1


def _cuda_runtime():
    """torch's CUDA runtime bindings, when this process already uses CUDA
    through torch; else None. The client never imports torch itself, and
    never initializes CUDA: registering would create a context (hundreds of
    MiB of device memory, and a process that can no longer fork) in a rank
    that does not use the GPU. A mapping made before CUDA was initialized
    is registered at its next use."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return torch.cuda.cudart()
    except Exception:  # a CPU-only build, or a broken CUDA install: no hook
        return None


class Mapping:
    """One mmap of an arena file (MAP_SHARED). A writable mapping keeps a
    ctypes view for its address; that view is a buffer export, so it is
    dropped before the mmap is closed (mmap.close refuses while exported).
    ``what`` names the arena in errors ("snapshot arena", "message log
    arena")."""

    def __init__(self, path, size, writable, what="snapshot arena"):
        if size <= 0:
            raise Error("the agent named arena %s with size %d; an arena has at least one page"
                        % (path, size))
        # Never through a symlink, and only this user's own regular file:
        # the path comes from the agent's store, and a rank must not map
        # (and write its snapshots into) a file someone else planted there;
        # O_NONBLOCK: a FIFO in its place must not hang the rank.
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Error("%s %s is a symlink; an arena is a regular file of this "
                            "user: refusing to map it" % (what, path)) from None
            raise Error("cannot open the %s %s: [Errno %s] %s; the agent and this "
                        "rank must run as the same user on the same node"
                        % (what, path, e.errno, e.strerror)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise Error("%s %s is not a regular file of this user (uid %d, mode "
                            "%o): refusing to map it; the agent's store has been tampered with"
                            % (what, path, st.st_uid, st.st_mode))
            if st.st_size < size:
                raise Error("%s %s has %d bytes, the agent said %d; the store is "
                            "inconsistent, see the agent's log" % (what, path, st.st_size, size))
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            try:
                self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
            except OSError as e:
                raise Error("cannot map the %s %s (%d bytes): [Errno %s] %s"
                            % (what, path, size, e.errno, e.strerror)) from None
        finally:
            os.close(fd)
        self.path, self.size, self.writable = path, size, writable
        self.ident = (st.st_dev, st.st_ino)
        self._cview = None
        self.addr = None
        self._cudart = None  # the runtime it is registered with
        self._refused = False
        if writable:
            self._cview = (ctypes.c_char * size).from_buffer(self.mm)
            self.addr = ctypes.addressof(self._cview)

    def register(self, log):
        """Register a writable mapping with the CUDA runtime, once, when the
        process uses CUDA; a refusal is said (log) and not tried again. Read-
        only mappings (restores) are not: CUDA pins read-only memory only
        with cudaHostRegisterReadOnly, which not every device supports, and
        a restore reads its arena once, which does not repay pinning it."""
        if not self.writable or self._cudart is not None or self._refused:
            return
        rt = _cuda_runtime()
        if rt is None:
            return
        try:
            err = int(rt.cudaHostRegister(self.addr, self.size, _PORTABLE))
        except Exception as e:  # bindings of another shape: no hook
            err = e
        if err == 0:
            self._cudart = rt
            return
        self._refused = True
        log("the CUDA runtime refused to register snapshot arena %s (%s); device-to-host "
            "copies into arenas stage through the runtime's bounce buffer" % (self.path, err))

    def close(self):
        """Unmap; returns why the CUDA runtime would not unregister it, or
        None. Unregistered first: a registration must not outlive its pages."""
        err = None
        if self._cudart is not None:
            try:
                err = int(self._cudart.cudaHostUnregister(self.addr))
            except Exception as e:
                err = e
            self._cudart = None
        self._cview = None
        self.addr = None
        self.mm.close()
        if err:
            return "unregistering snapshot arena %s from the CUDA runtime failed: %s" % (self.path, err)
        return None


class ArenaCache:
    """Mappings by path. The agent reuses arena files from generation to
    generation, so a path is mapped again only when its size changes, when
    a write needs a read-only mapping upgraded, or when the file at the path
    was replaced (another inode: the old mapping would show stale bytes)."""

    def __init__(self, log=None):
        self._maps = {}
        self._log = log or (lambda msg: None)
        self._warned = False

    def get(self, path, size, writable):
        if not isinstance(path, str) or not os.path.isabs(path):
            raise Error("the agent named arena %r; expected an absolute path" % (path,))
        m = self._maps.get(path)
        if m is not None:
            try:
                st = os.stat(path, follow_symlinks=False)
                same = (st.st_dev, st.st_ino) == m.ident
            except OSError:
                same = False
            if same and m.size == size and (m.writable or not writable):
                m.register(self._warn)
                return m
            del self._maps[path]
            self._closed(m)
        m = Mapping(path, size, writable)
        self._maps[path] = m
        m.register(self._warn)
        return m

    def _warn(self, msg):
        if not self._warned:
            self._warned = True
            self._log(msg)

    def _closed(self, m):
        err = m.close()
        if err:
            self._log(err)

    def close(self):
        maps, self._maps = self._maps, {}
        for m in maps.values():
            self._closed(m)

    def __len__(self):
        return len(self._maps)
