"""The message log's pieces for reft.Session (docs/PROTOCOL.md, "Message
log"; the Go client's client/msglog.go): the key rules, the checks of the
agent's replies, the bytes of a message (buffers and tensors) and the
mappings of its arenas."""

import ctypes
import json
import os
import sys

from ._arena import Mapping
from ._errors import Error

MAX_STREAM = 64  # bytes; the agent's proto.MaxLogStream
MAX_SEQ = (1 << 31) - 1  # proto.MaxLogSeq
_MAX_INT64 = (1 << 63) - 1


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def stream_name(stream):
    """The stream quoted as the agent's errors write it: "act>1"."""
    return json.dumps(stream) if isinstance(stream, str) else repr(stream)


def key_name(stream, step, seq):
    """The key as the agent's errors write it: stream "act>1" step 3 seq 0."""
    return "stream %s step %r seq %r" % (stream_name(stream), step, seq)


def check_stream(stream):
    """Why stream cannot name a stream (proto.CheckLogStream), or None: 1
    to 64 bytes of printable ASCII without spaces (it reaches the agent's
    log and errors, so no control character may forge a line)."""
    if not isinstance(stream, str):
        return "stream %r is a %s, not a str: name it, e.g. \"act>3\" (the kind and the receiving rank)" \
            % (stream, type(stream).__name__)
    if not stream:
        return "the stream name is empty: name it, e.g. \"act>3\" (the kind and the receiving rank)"
    raw = stream.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_STREAM:
        return "stream name of %d bytes is longer than %d: use a short name such as \"act>3\"" \
            % (len(raw), MAX_STREAM)
    for i, b in enumerate(raw):
        if b <= 0x20 or b > 0x7E:
            return "stream name %s has a byte 0x%02x at %d: use printable ASCII without spaces" \
                % (json.dumps(stream), b, i)
    return None


def check_key(stream, step, seq):
    """Why (stream, step, seq) cannot name a message (proto.CheckLogKey), or None."""
    bad = check_stream(stream)
    if bad:
        return bad
    if not _is_int(step):
        return "step = %r must be an int" % (step,)
    if step < 0:
        return "step = %d must not be negative" % step
    if step > _MAX_INT64:
        return "step = %d must be at most %d" % (step, _MAX_INT64)
    if not _is_int(seq):
        return "seq = %r must be an int" % (seq,)
    if not 0 <= seq <= MAX_SEQ:
        return "seq = %d must be in [0, %d]" % (seq, MAX_SEQ)
    return None


def check_up_to(up_to):
    if not _is_int(up_to):
        return "up_to = %r must be an int (a step)" % (up_to,)
    if not -_MAX_INT64 - 1 <= up_to <= _MAX_INT64:
        return "up_to = %d does not fit in 64 bits" % up_to
    return None


def wrap(what, e):
    """e (a failed request or check) as the failure of ``what``, keeping
    the agent's code. Connection.call names the request ("log_read: ")
    and the agent's message names it again: one is enough."""
    msg = e.message
    if e.code is not None:
        name, sep, rest = msg.partition(": ")
        if sep and rest.startswith(name + ": "):
            msg = rest
    return Error("%s: %s" % (what, msg), code=e.code)


# --- replies ------------------------------------------------------------
#
# The agent's replies are checked before any of their numbers is used
# (the Go client's proto.CheckLogArena): a broken or foreign agent gets a
# reft.Error naming the field, never a mapping of the wrong size or an
# IndexError. tests/test_wire_fuzz.py feeds them mutated replies.

def _bad(kind, why):
    return Error("%s reply: %s; install the Python client of the reft version the cluster runs"
                 % (kind, why))


def _arena(kind, reply, size):
    path, arena_size = reply.get("arena"), reply.get("arena_size")
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise _bad(kind, "the agent named arena %r, not an absolute path" % (path,))
    if not _is_int(size) or size <= 0:
        raise _bad(kind, "the agent gave a message size of %r bytes" % (size,))
    if not _is_int(arena_size) or arena_size < size:
        raise _bad(kind, "the agent's arena %s holds %r bytes, less than the message's %d"
                   % (path, arena_size, size))
    if arena_size > sys.maxsize:
        raise _bad(kind, "the agent's arena %s of %d bytes does not fit in this process's address "
                   "space" % (path, arena_size))
    return path, arena_size


def append_reply(reply, size):
    """(arena path, arena size) of a log_append reply for ``size`` bytes."""
    return _arena("log_append", reply, size)


def commit_reply(reply):
    """held: the agent already held the message with these bytes."""
    held = reply.get("held", False)
    if not isinstance(held, bool):
        raise _bad("log_commit", "held is %r, not a bool" % (held,))
    return held


def read_reply(reply):
    """(arena path, arena size, message size, crc32c) of a log_read reply."""
    size, crc = reply.get("size"), reply.get("crc32c")
    path, arena_size = _arena("log_read", reply, size)
    if not _is_int(crc) or not 0 <= crc <= 0xFFFFFFFF:
        raise _bad("log_read", "crc32c is %r, not a 32-bit unsigned int" % (crc,))
    return path, arena_size, size, crc


def truncate_reply(reply):
    """(messages, bytes) a log_truncate dropped."""
    messages, nbytes = reply.get("messages", 0), reply.get("bytes", 0)
    if not _is_int(messages) or not _is_int(nbytes) or messages < 0 or nbytes < 0:
        raise _bad("log_truncate", "messages %r and bytes %r are not counts" % (messages, nbytes))
    return messages, nbytes


def steps_reply(reply):
    """The steps of a log_steps reply: ints, strictly ascending."""
    steps = reply.get("steps")
    if steps is None:
        return []  # an agent writing null for none
    if not isinstance(steps, list) or not all(_is_int(s) for s in steps):
        raise _bad("log_steps", "steps %.200r are not a list of ints" % (steps,))
    for a, b in zip(steps, steps[1:]):
        if b <= a:
            raise _bad("log_steps", "steps %.200r are not ascending" % (steps,))
    return steps


# --- the bytes of a message -----------------------------------------------

def _tensor_type():
    # Never imported here: a tensor can only come from a process that did.
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _host_view(t):
    """A memoryview ("B") of the bytes of t, a contiguous CPU tensor, which
    must outlive the view."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def _plain(t, what):
    torch = sys.modules["torch"]
    if t.layout != torch.strided or t.is_quantized:
        raise Error("%s is a %s tensor: log dense tensors (tensor.to_dense(), or the bytes "
                    "of its parts)" % (what, "quantized" if t.is_quantized else t.layout))


def source(data):
    """(memoryview "B" of the message's bytes, what keeps them alive). A
    buffer's bytes in C order (a non-contiguous one is copied); a tensor's
    on the host: a CUDA (or other device) tensor is copied to host memory
    first, a non-contiguous one made contiguous, conjugate and negative
    views resolved."""
    tensor = _tensor_type()
    if tensor is not None and isinstance(data, tensor):
        _plain(data, "data")
        t = data.detach()
        if t.device.type != "cpu":
            t = t.cpu()  # waits for the device's work on it
        for resolve in ("resolve_conj", "resolve_neg"):
            if hasattr(t, resolve):
                t = getattr(t, resolve)()
        t = t.contiguous()
        return _host_view(t), t
    try:
        view = memoryview(data)
    except TypeError:
        raise Error("data of type %s does not expose a buffer: pass bytes, a bytearray, a "
                    "memoryview, a numpy array or a tensor" % type(data).__name__) from None
    if not view.c_contiguous:
        flat = memoryview(view.tobytes())  # C order
        view.release()
        return flat, None
    try:
        return view.cast("B"), None
    finally:
        view.release()


class Sink:
    """Where log_read puts a message: ``view`` (writable, "B") for host
    memory, or None for a device tensor, which ``finish`` fills from a
    staging copy."""

    def __init__(self, out):
        self.out, self.view, self.device = out, None, None
        tensor = _tensor_type()
        if tensor is not None and isinstance(out, tensor):
            _plain(out, "out")
            if not out.is_contiguous():
                raise Error("out is a non-contiguous tensor: read into a contiguous one "
                            "(torch.empty_like(t, memory_format=torch.contiguous_format)) and copy")
            if (hasattr(out, "is_conj") and out.is_conj()) or (hasattr(out, "is_neg") and out.is_neg()):
                raise Error("out is a conjugate or negative view: read into a plain tensor")
            self.nbytes = out.numel() * out.element_size()
            if out.device.type == "cpu":
                self.view = _host_view(out.detach())
            else:
                self.device = out
            return
        try:
            view = memoryview(out)
        except TypeError:
            raise Error("out of type %s does not expose a buffer: pass a bytearray, a writable "
                        "memoryview, a numpy array or a tensor" % type(out).__name__) from None
        if view.readonly:
            view.release()
            raise Error("out is read-only: pass a bytearray or a writable array, not bytes")
        if not view.c_contiguous:
            view.release()
            raise Error("out is not C-contiguous: read into a contiguous buffer "
                        "(numpy.ascontiguousarray) and copy")
        try:
            self.view = view.cast("B")
        finally:
            view.release()
        self.nbytes = self.view.nbytes

    def finish(self, staged):
        """Copy the staged bytes to the device tensor."""
        torch = sys.modules["torch"]
        src = torch.frombuffer(staged, dtype=torch.uint8)
        with torch.no_grad():
            self.device.view(-1).view(torch.uint8).copy_(src)

    def release(self):
        if self.view is not None:
            self.view.release()


def copy(dst, src, chunk):
    """dst[:] = src, chunk bytes at a time, so that other threads get the
    GIL between chunks."""
    for o in range(0, src.nbytes, chunk):
        dst[o:o + chunk] = src[o:o + chunk]


# --- arenas ---------------------------------------------------------------

class LogMaps:
    """The mappings of message arenas, by path (the Go client's logMaps).
    Mapping an arena costs more than copying a message, and in steady
    state the agent hands the same arenas out again (a truncated message's
    arena serves a later append), so each is mapped once, read-write, for
    appends and reads alike; never registered with CUDA (tensors are
    staged through host memory). A mapping keeps its pages alive after the
    agent freed the arena: sweep() unmaps those whose file is gone or
    replaced, at every log_truncate (the agent frees arenas only at
    appends) and at close."""

    def __init__(self):
        self._maps = {}

    def get(self, path, size):
        m = self._maps.get(path)
        if m is not None:
            if m.size == size and self._same(path, m):
                return m
            del self._maps[path]
            self._close(m)
        m = Mapping(path, size, True, what="message log arena")
        self._maps[path] = m
        return m

    @staticmethod
    def _same(path, m):
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == m.ident

    @staticmethod
    def _close(m):
        try:
            m.close()
        except BufferError as e:  # a view of it still alive: unmapped when that is freed
            raise Error("unmapping message log arena %s: %s" % (m.path, e)) from None

    def sweep(self, everything=False):
        """Unmap the arenas whose file is gone or replaced; all with everything."""
        errs = []
        for path, m in list(self._maps.items()):
            if not everything and self._same(path, m):
                continue
            del self._maps[path]
            try:
                self._close(m)
            except Error as e:
                errs.append(e.message)
        if errs:
            raise Error("; ".join(errs))

    def __len__(self):
        return len(self._maps)
