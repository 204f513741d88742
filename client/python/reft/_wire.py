"""Frames of the rank <-> agent protocol (docs/PROTOCOL.md) and one
connection to an agent.

A frame is a 12-byte big-endian header (length, version, type, flags, id)
followed by a compact JSON object. Bulk bytes never travel here.
"""

import json
import os
import socket
import struct
import threading

from ._errors import Error

VERSION = 1
HEADER_SIZE = 12
MAX_PAYLOAD = 1 << 20

T_HELLO = 0x01
T_STATUS = 0x02
T_REGISTER = 0x03
T_SAVE = 0x04
T_COMMIT = 0x05
T_ABORT = 0x06
T_GENERATIONS = 0x07
T_RESTORE = 0x08
T_RELEASE = 0x09
T_COMM = 0x0A  # a notice: the agent never answers it
T_WATCH = 0x0B
T_NOTICE = 0x0C  # agent -> client, id 0, on watching connections only
T_PROGRESS = 0x10
T_LOG_APPEND = 0x11  # the message log (docs/PROTOCOL.md, "Message log")
T_LOG_COMMIT = 0x12
T_LOG_READ = 0x13
T_LOG_TRUNCATE = 0x14
T_LOG_STEPS = 0x15
REPLY_BIT = 0x80
T_ERROR = 0xFF

TYPE_NAMES = {
    T_HELLO: "hello", T_STATUS: "status", T_REGISTER: "register", T_SAVE: "save",
    T_COMMIT: "commit", T_ABORT: "abort", T_GENERATIONS: "generations",
    T_RESTORE: "restore", T_RELEASE: "release", T_COMM: "comm",
    T_WATCH: "watch", T_NOTICE: "notice", T_PROGRESS: "progress",
    T_LOG_APPEND: "log_append", T_LOG_COMMIT: "log_commit", T_LOG_READ: "log_read",
    T_LOG_TRUNCATE: "log_truncate", T_LOG_STEPS: "log_steps",
}

_HEADER = struct.Struct(">IBBHI")


def type_name(t):
    if t == T_ERROR:
        return "error"
    name = TYPE_NAMES.get(t & ~REPLY_BIT)
    if name is None:
        return "type-0x%02x" % t
    return name + "-reply" if t & REPLY_BIT else name


class FrameError(Exception):
    """A frame that cannot be decoded. ``kind`` is one of the classes of
    client/conformance/README.md: length, too_large, version, flags,
    payload, truncated; or eof when the stream ended cleanly between
    frames."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def dumps(obj):
    """Compact JSON bytes, the form the Go side writes."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode(ftype, fid, payload=b""):
    """One frame with the exact payload bytes given."""
    if len(payload) > MAX_PAYLOAD:
        raise Error("frame payload of %d bytes is above the protocol's limit of %d"
                    % (len(payload), MAX_PAYLOAD))
    return _HEADER.pack(HEADER_SIZE - 4 + len(payload), VERSION, ftype, 0, fid) + payload


def encode_msg(ftype, fid, obj=None):
    """One frame whose payload is obj as compact JSON (None: empty)."""
    return encode(ftype, fid, b"" if obj is None else dumps(obj))


def read_frame(read):
    """Read one frame with read(n) -> up to n bytes (fewer only at the end
    of the stream). Returns (type, id, payload dict). Raises FrameError.

    Like the agent, it reads exactly one frame's bytes when the length is
    valid, and rejects a too-large frame from its length field alone."""
    head = read(4)
    if not head:
        raise FrameError("eof", "the stream ended")
    if len(head) < 4:
        raise FrameError("truncated", "the stream ended inside a frame header")
    (n,) = struct.unpack(">I", head)
    if n < HEADER_SIZE - 4:
        raise FrameError("length", "bad frame length %d < %d" % (n, HEADER_SIZE - 4))
    if n - (HEADER_SIZE - 4) > MAX_PAYLOAD:
        raise FrameError("too_large", "frame payload of %d bytes is above the limit of %d"
                         % (n - (HEADER_SIZE - 4), MAX_PAYLOAD))
    rest = read(HEADER_SIZE - 4)
    if len(rest) < HEADER_SIZE - 4:
        raise FrameError("truncated", "the stream ended inside a frame header")
    _, version, ftype, flags, fid = _HEADER.unpack(head + rest)
    size = n - (HEADER_SIZE - 4)
    payload = read(size) if size else b""
    if len(payload) < size:
        raise FrameError("truncated", "the stream ended inside a %d-byte payload" % size)
    if version != VERSION:
        raise FrameError("version", "protocol version %d; this client speaks %d" % (version, VERSION))
    if flags != 0:
        raise FrameError("flags", "reserved flags 0x%04x are not zero" % flags)
    if not payload:
        return ftype, fid, {}
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FrameError("payload", "payload is not JSON: %s" % e) from None
    except RecursionError:
        # Deeply nested arrays or objects ("[[[[..."): the json module
        # recurses once per level (found by test_wire_fuzz).
        raise FrameError("payload", "payload nests JSON too deeply") from None
    if not isinstance(obj, dict):
        raise FrameError("payload", "payload is a JSON %s, not an object" % type(obj).__name__)
    return ftype, fid, obj


def decode(data):
    """Decode one frame held whole in data (bytes). Raises FrameError."""
    view = memoryview(data)
    pos = 0

    def read(n):
        nonlocal pos
        chunk = bytes(view[pos:pos + n])
        pos += len(chunk)
        return chunk

    return read_frame(read)


# The uid the agent must run as: this process's own (the agent runs as
# the job's user, never as root). A name of its own so tests can pose as
# another user.
own_uid = os.getuid

_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


def check_agent_uid(sock, path):
    """Refuse an agent socket served by another user (SO_PEERCRED, which
    the kernel recorded when the server listened), before sending it a
    byte: a request names the arena, and the replies decide what is
    restored."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError as e:
        raise Error("checking the reft agent at %s: reading its credentials (SO_PEERCRED): "
                    "[Errno %s] %s" % (path, e.errno, e.strerror)) from None
    pid, uid, _ = _UCRED.unpack(raw)
    want = own_uid()
    if uid != want:
        raise Error("the reft agent's socket %s is served by uid %d (pid %d), this process runs as "
                    "uid %d; refusing to talk to it (another user's process holds the agent's "
                    "socket path: check REFT_AGENT_SOCKET, and tell the admin)" % (path, uid, pid, want))


class Connection:
    """One socket to an agent. Requests are serialized by a lock, so at most
    one is outstanding and its reply is the next frame (an error frame with
    id 0 answers it too)."""

    def __init__(self, path):
        self.path = path
        self.requests = 0  # frames sent, for tests and the conformance runner
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one frame at a time: requests and notices
        self._next_id = 0
        self._broken = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as e:
            sock.close()
            raise Error("cannot reach the reft agent at %s: [Errno %s] %s; is the agent of this "
                        "job still running on this node (REFT_AGENT_SOCKET is set by srun "
                        "--reft for the step's tasks)?" % (path, e.errno, e.strerror)) from None
        try:
            check_agent_uid(sock, path)
        except Error:
            sock.close()
            raise
        self._sock = sock
        self._rfile = sock.makefile("rb")

    def call(self, ftype, payload=None):
        """Send one request and return its reply's payload. Agent error
        replies raise Error with the agent's code."""
        name = type_name(ftype)
        with self._lock:
            if self._broken is not None:
                raise Error(self._broken)
            self._next_id = self._next_id % 0xFFFFFFFF + 1
            fid = self._next_id
            frame = encode_msg(ftype, fid, payload)
            send_err = None
            try:
                with self._send_lock:
                    self._sock.sendall(frame)
                self.requests += 1
            except OSError as e:
                # The agent may have refused us (forbidden) and closed before
                # the request went out: its error frame is the better answer.
                send_err = e
            try:
                rtype, rid, reply = read_frame(self._rfile.read)
            except (FrameError, OSError, ValueError) as e:
                cause = send_err or e
                if isinstance(e, FrameError) and e.kind not in ("eof", "truncated"):
                    cause = "malformed reply (%s)" % e
                elif isinstance(cause, FrameError):
                    cause = "the agent closed the connection"
                self._broken = ("the connection to the reft agent at %s is lost (during %s: %s); "
                                "the agent may have exited, see its log"
                                % (self.path, name, cause))
                self._close_socket()
                raise Error(self._broken) from None
            except BaseException:
                # Interrupted (KeyboardInterrupt) with the reply unread: the
                # stream is out of step, so the connection cannot be reused.
                self._broken = ("the connection to the reft agent at %s was abandoned while "
                                "waiting for a %s reply" % (self.path, name))
                self._close_socket()
                raise
            if rtype == T_ERROR and rid in (fid, 0):
                code = reply.get("code") or "internal"
                message = reply.get("message") or "(no message)"
                if code == "forbidden" or send_err is not None:
                    self._broken = "the reft agent at %s closed this connection: %s: %s" % (
                        self.path, code, message)
                    self._close_socket()
                raise Error("%s: %s" % (name, message), code=code,
                            bad_chunks=reply.get("bad_chunks"))
            if send_err is not None or rid != fid or rtype != ftype | REPLY_BIT:
                self._broken = ("protocol error talking to the reft agent at %s: a %s request "
                                "(id %d) got a %s frame with id %d" % (self.path, name, fid,
                                                                      type_name(rtype), rid))
                self._close_socket()
                raise Error(self._broken)
            return reply

    def notify(self, ftype, payload=None):
        """Send a notice, a frame the agent never answers (id 0). It waits
        only for its own frame to be written, never for a request in flight."""
        frame = encode_msg(ftype, 0, payload)
        with self._send_lock:
            if self._broken is not None:
                raise Error(self._broken)
            try:
                self._sock.sendall(frame)
            except OSError as e:
                raise Error("sending a %s notice to the reft agent at %s: %s"
                            % (type_name(ftype), self.path, e)) from None

    def shutdown(self):
        """Wake a thread blocked reading this connection (close() alone
        does not interrupt a read in progress)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _close_socket(self):
        try:
            self._rfile.close()
        finally:
            self._sock.close()

    def close(self):
        with self._lock:
            if self._broken is None:
                self._broken = "the connection to the reft agent at %s is closed" % self.path
            self._close_socket()
