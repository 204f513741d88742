"""CRC-32C (Castagnoli), the checksum of the agent's store and message log
(docs/PROTOCOL.md), with the standard library only.

crc32c(data) asks the kernel (an AF_ALG socket, "crc32c", which uses the
CPU's CRC instructions where it has them) when this kernel offers it to
the process and gives the check values, else computes in Python: a
message is cut into lanes that are checksummed side by side with
bytes.translate, one byte of every lane per pass, and the lanes' CRCs are
joined (CRC linearity). That ran at about 200 MB/s on one core of the
two-core test machine (whose kernel has no AF_ALG), against 10 MB/s for a
byte loop: a 64 MiB message costs about 0.3 s.

The snapshot path needs none of this (the agent checksums what it
stores); the message log does, since a log_commit carries the CRC-32C of
the bytes the client copied and a log_read is checked again after its
copy.
"""

import socket
import threading

_POLY = 0x82F63B78  # reflected Castagnoli polynomial

# The raw register after one byte: r' = _T[(r ^ b) & 0xFF] ^ (r >> 8).
_T = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _T.append(_c)
del _i, _c

# Byte k of _T[x], as bytes.translate tables: one table per byte plane.
_TB = tuple(bytes((_T[x] >> (8 * k)) & 0xFF for x in range(256)) for k in range(4))

_M = 256  # bytes per lane
_MAX_LANES = 8192  # lanes per block: a block of 2 MiB, whose strided reads stay in cache
_MIN_PURE_LANES = 16  # below this a byte loop is as fast

_zeros = None  # tables of the register's change over _M zero bytes, built at first use


def _zero_tables():
    """Z[k][v]: the raw register after _M zero bytes from register v << 8k
    (a linear map, so four byte tables compose it)."""
    global _zeros
    if _zeros is None:
        basis = []
        for bit in range(32):
            c = 1 << bit
            for _ in range(_M):
                c = _T[c & 0xFF] ^ (c >> 8)
            basis.append(c)
        z = []
        for k in range(4):
            t = [0] * 256
            for v in range(1, 256):
                low = v & -v
                t[v] = t[v ^ low] ^ basis[8 * k + low.bit_length() - 1]
            z.append(t)
        _zeros = z
    return _zeros


def _lanes(block, lanes):
    """The raw registers, from 0, of ``lanes`` lanes of _M bytes (lane i is
    block[i*_M:(i+1)*_M]), as four byte planes. Each pass takes byte j of
    every lane (a strided slice) and steps all registers at once: the
    planes are big ints for the XORs, bytes for the table lookups."""
    t0, t1, t2, t3 = _TB
    fb = int.from_bytes
    p0 = p1 = p2 = p3 = 0
    for j in range(_M):
        idx = (p0 ^ fb(block[j::_M], "little")).to_bytes(lanes, "little")
        p0 = fb(idx.translate(t0), "little") ^ p1
        p1 = fb(idx.translate(t1), "little") ^ p2
        p2 = fb(idx.translate(t2), "little") ^ p3
        p3 = fb(idx.translate(t3), "little")
    return [p.to_bytes(lanes, "little") for p in (p0, p1, p2, p3)]


def _pure(data):
    mv = memoryview(data).cast("B")
    try:
        n, pos, c = len(mv), 0, 0xFFFFFFFF
        while n - pos >= _M * _MIN_PURE_LANES:
            lanes = min(_MAX_LANES, (n - pos) // _M)
            # bytes: their strided slices are a plain C loop.
            block = mv[pos:pos + lanes * _M].tobytes()
            z0, z1, z2, z3 = _zero_tables()
            for a, b, d, e in zip(*_lanes(block, lanes)):
                # Append the lane: the register moves over its _M bytes,
                # then takes the lane's own register.
                c = z0[c & 0xFF] ^ z1[(c >> 8) & 0xFF] ^ z2[(c >> 16) & 0xFF] ^ z3[c >> 24] \
                    ^ (a | b << 8 | d << 16 | e << 24)
            pos += lanes * _M
        t = _T
        for x in mv[pos:]:
            c = t[(c ^ x) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF
    finally:
        mv.release()


class _Kernel:
    """The kernel's crc32c through an AF_ALG hash socket: each use accepts
    an operation socket of its own (so threads do not share one), feeds it
    with MSG_MORE (a partial send must not end the hash: a send without it
    restarts or finishes the hash) and finishes with an empty send."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_ALG, socket.SOCK_SEQPACKET, 0)
        try:
            self.sock.bind(("hash", "crc32c"))
        except OSError:
            self.sock.close()
            raise

    def __call__(self, data):
        op, _ = self.sock.accept()
        with op:
            if len(data):
                op.sendall(data, socket.MSG_MORE)
            op.send(b"")
            digest = op.recv(4)
        if len(digest) != 4:
            raise OSError("the kernel's crc32c returned %d bytes" % len(digest))
        return int.from_bytes(digest, "little")


_impl = None
_impl_lock = threading.Lock()


def _choose():
    """The kernel's crc32c when it exists and gives the check values
    (docs/PROTOCOL.md: standard CRC-32C), else the Python one."""
    try:
        k = _Kernel()
    except (OSError, AttributeError):  # no AF_ALG (kernel, seccomp) or no crc32c
        return _pure, "python"
    try:
        probe = bytes((i * 131 + 7) & 0xFF for i in range(300 << 10))  # past one send's pages
        if k(b"123456789") == 0xE3069283 and k(b"") == 0 and k(memoryview(probe)) == _pure(probe):
            return k, "kernel"
    except OSError:
        pass
    k.sock.close()
    return _pure, "python"


def backend():
    """Which crc32c this process uses: "kernel" or "python"."""
    return _implementation()[1]


def _implementation():
    global _impl
    if _impl is None:
        with _impl_lock:
            if _impl is None:
                _impl = _choose()
    return _impl


def crc32c(data):
    """The CRC-32C of the bytes-like ``data`` (C-contiguous)."""
    impl, name = _implementation()
    if name == "kernel":
        try:
            return impl(data)
        except OSError:  # out of memory or sockets, say: the Python one still answers
            pass
    return _pure(data)
