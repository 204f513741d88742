"""Shared-memory arenas named by the agent: mapped once, kept by path."""

import ctypes
import mmap
import os

from ._errors import Error


class Mapping:
    """One mmap of an arena file (MAP_SHARED). A writable mapping keeps a
    ctypes view for its address; that view is a buffer export, so it is
    dropped before the mmap is closed (mmap.close refuses while exported)."""

    def __init__(self, path, size, writable):
        if size <= 0:
            raise Error("the agent named arena %s with size %d; an arena has at least one page"
                        % (path, size))
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError as e:
            raise Error("cannot open the snapshot arena %s: [Errno %s] %s; the agent and this "
                        "rank must run as the same user on the same node"
                        % (path, e.errno, e.strerror)) from None
        try:
            st = os.fstat(fd)
            if st.st_size < size:
                raise Error("snapshot arena %s has %d bytes, the agent said %d; the store is "
                            "inconsistent, see the agent's log" % (path, st.st_size, size))
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            try:
                self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
            except OSError as e:
                raise Error("cannot map the snapshot arena %s (%d bytes): [Errno %s] %s"
                            % (path, size, e.errno, e.strerror)) from None
        finally:
            os.close(fd)
        self.path, self.size, self.writable = path, size, writable
        self.ident = (st.st_dev, st.st_ino)
        self._cview = None
        self.addr = None
        if writable:
            self._cview = (ctypes.c_char * size).from_buffer(self.mm)
            self.addr = ctypes.addressof(self._cview)

    def close(self):
        self._cview = None
        self.addr = None
        self.mm.close()


class ArenaCache:
    """Mappings by path. The agent reuses arena files from generation to
    generation, so a path is mapped again only when its size changes, when
    a write needs a read-only mapping upgraded, or when the file at the path
    was replaced (another inode: the old mapping would show stale bytes)."""

    def __init__(self):
        self._maps = {}

    def get(self, path, size, writable):
        if not isinstance(path, str) or not os.path.isabs(path):
            raise Error("the agent named arena %r; expected an absolute path" % (path,))
        m = self._maps.get(path)
        if m is not None:
            try:
                st = os.stat(path)
                same = (st.st_dev, st.st_ino) == m.ident
            except OSError:
                same = False
            if same and m.size == size and (m.writable or not writable):
                return m
            del self._maps[path]
            m.close()
        m = Mapping(path, size, writable)
        self._maps[path] = m
        return m

    def close(self):
        maps, self._maps = self._maps, {}
        for m in maps.values():
            m.close()

    def __len__(self):
        return len(self._maps)
