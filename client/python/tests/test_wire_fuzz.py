"""Randomized mutation of agent reply frames: Python has no native fuzzer
here, so this is the bounded, seeded stand-in of the Go fuzz targets.
Whatever bytes the agent's socket carries, decoding raises only the
documented FrameError (with a documented kind), and a request raises only
reft.Error; the message log's reply checks (reft._msglog) raise only
reft.Error whatever the reply holds."""

import random
import socket
import struct
import threading
import unittest

from reft import _msglog
from reft import _wire as W
from reft._errors import Error
from common import vectors

KINDS = {"eof", "length", "too_large", "version", "flags", "payload", "truncated"}
SEED = 14  # the security issue; change it to explore, keep it fixed in the suite
FRAMES = 2000
CALLS = 300


def fix_length(b):
    """Rewrite the length field to match, so that payload mutations reach
    the JSON decoding instead of stopping at the length check."""
    if len(b) < 4:
        return b
    return struct.pack(">I", len(b) - 4) + b[4:]


def mutate(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        if op == 0 and b:  # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # set a byte
            b[rng.randrange(len(b))] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, ord("{"), ord('"'), rng.randrange(256)])
        elif op == 2:  # insert bytes
            i = rng.randint(0, len(b))
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3 and b:  # delete a range
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        elif op == 4:  # truncate
            del b[rng.randint(0, len(b)):]
        elif op == 5 and b:  # duplicate a range
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 32)]
        elif op == 6:  # a hostile JSON payload
            body = rng.choice([b"[" * 100000, b'{"a":' * 50000, b"1" * 5000, b'"\\ud800"', b"NaN", b"[1e999999]",
                               b'{"code":["x"],"message":{},"bad_chunks":7}', b"\xff\xfe", b"{}" * 3, b"null"])
            b = bytearray(struct.pack(">IBBHI", 8 + len(body), W.VERSION, W.T_SAVE | W.REPLY_BIT, 0, 1) + body)
        elif op == 7:  # keep the length honest
            b = bytearray(fix_length(bytes(b)))
        else:  # a frame type, flags or version from anywhere
            if len(b) >= 8:
                b[rng.randrange(4, 8)] = rng.randrange(256)
    return bytes(b)


# The message log's requests, a well-formed reply of each, and the check
# reft.Session applies to it.
LOG_REPLIES = [
    (W.T_LOG_APPEND, {"arena": "/dev/shm/reft/4242/msglog/arena-0", "arena_size": 8192},
     lambda r: _msglog.append_reply(r, 5000)),
    (W.T_LOG_COMMIT, {"stream": "act>1", "step": 1, "seq": 0, "held": True}, _msglog.commit_reply),
    (W.T_LOG_READ, {"arena": "/dev/shm/reft/4242/msglog/arena-0", "arena_size": 8192, "size": 5000,
                    "crc32c": 0xDEADBEEF}, _msglog.read_reply),
    (W.T_LOG_TRUNCATE, {"messages": 2, "bytes": 10000, "held": 0}, _msglog.truncate_reply),
    (W.T_LOG_STEPS, {"steps": [1, 2, 3]}, _msglog.steps_reply),
]
HOSTILE = [None, True, False, -1, 0, 1, 1 << 31, 1 << 32, 1 << 63, 1 << 70, -(1 << 70), 1.5, float("inf"),
           float("nan"), "", "x", "/", "arena-0", "/a\u0000b", [], [1, "2"], [3, 2], [2, 2], [1 << 70], {},
           {"a": 1}]


def log_frame(t, reply):
    return W.encode_msg(t | W.REPLY_BIT, 1, reply)


def corpus():
    v = vectors()
    base = [bytes.fromhex(f["hex"]) for f in v["frames"]] + [bytes.fromhex(f["hex"]) for f in v["bad_frames"]]
    base.append(W.encode_msg(W.T_SAVE | W.REPLY_BIT, 1, {"step": 1, "arena_size": 4096, "buffers": []}))
    base.append(W.encode_msg(W.T_ERROR, 1, {"code": "corrupt", "message": "x", "bad_chunks": [{"buffer": "a"}]}))
    base.extend(log_frame(t, r) for t, r, _ in LOG_REPLIES)
    return base


def fuzz_conn(data):
    """A Connection whose agent sends data (from a thread: a large frame
    does not fit the socket buffer before the client reads); returns it
    and a function that closes both ends."""
    ours, agent = socket.socketpair()
    conn = W.Connection.__new__(W.Connection)
    conn.path, conn.requests, conn._next_id, conn._broken = "fuzz", 0, 0, None
    conn._lock, conn._send_lock = threading.Lock(), threading.Lock()
    conn._sock, conn._rfile = ours, ours.makefile("rb")

    def send():
        try:
            agent.sendall(data)
            agent.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the client closed first: it refused the frame early

    writer = threading.Thread(target=send)
    writer.start()

    def close():
        conn.close()
        writer.join()
        agent.close()

    return conn, close


class MutatedFrames(unittest.TestCase):
    def test_deep_nesting_is_a_payload_error(self):
        # The crasher the mutation found: json recursed past Python's limit.
        for body in (b"[" * 100000, b'{"a":' * 50000):
            with self.subTest(body[:5]):
                with self.assertRaises(W.FrameError) as cm:
                    W.decode(struct.pack(">IBBHI", 8 + len(body), W.VERSION, W.T_SAVE | W.REPLY_BIT, 0, 1) + body)
                self.assertEqual(cm.exception.kind, "payload")

    def test_decode_raises_only_frame_error(self):
        rng = random.Random(SEED)
        base = corpus()
        for i in range(FRAMES):
            data = mutate(rng, rng.choice(base))
            try:
                ftype, fid, obj = W.decode(data)
            except W.FrameError as e:
                self.assertIn(e.kind, KINDS, "frame %d %r" % (i, data[:64]))
                continue
            except Exception as e:  # noqa: BLE001 - the point of the test
                self.fail("frame %d %r...: %s: %s, not FrameError" % (i, data[:64], type(e).__name__, e))
            self.assertIsInstance(obj, dict)
            self.assertTrue(0 <= ftype <= 0xFF and 0 <= fid <= 0xFFFFFFFF)

    def test_call_raises_only_reft_error(self):
        rng = random.Random(SEED + 1)
        base = corpus()
        for i in range(CALLS):
            data = mutate(rng, rng.choice(base))
            conn, close = fuzz_conn(data)
            try:
                try:
                    reply = conn.call(W.T_SAVE, {"step": 1})
                except Error:
                    continue
                except Exception as e:  # noqa: BLE001 - the point of the test
                    self.fail("reply %d %r...: %s: %s, not reft.Error" % (i, data[:64], type(e).__name__, e))
                self.assertIsInstance(reply, dict)
            finally:
                close()


class MutatedLogReplies(unittest.TestCase):
    def check_only_reft_error(self, check, reply, what):
        try:
            check(reply)
        except Error:
            pass
        except Exception as e:  # noqa: BLE001 - the point of the test
            self.fail("%s %r: %s: %s, not reft.Error" % (what, reply, type(e).__name__, e))

    def test_checks_raise_only_reft_error(self):
        """Reply fields replaced, added or removed, by hostile values."""
        rng = random.Random(SEED + 2)
        for i in range(FRAMES):
            t, good, check = rng.choice(LOG_REPLIES)
            reply = dict(good)
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(list(good) + ["extra"])
                if rng.randrange(5) == 0:
                    reply.pop(key, None)
                else:
                    reply[key] = rng.choice(HOSTILE)
            self.check_only_reft_error(check, reply, "reply %d of %s" % (i, W.type_name(t | W.REPLY_BIT)))

    def test_calls_raise_only_reft_error(self):
        """Log reply frames mutated as bytes, through a request and its check."""
        rng = random.Random(SEED + 3)
        for i in range(CALLS):
            t, good, check = rng.choice(LOG_REPLIES)
            data = mutate(rng, log_frame(t, good))
            conn, close = fuzz_conn(data)
            try:
                try:
                    reply = conn.call(t, {"stream": "act>1", "step": 1, "seq": 0})
                except Error:
                    continue
                except Exception as e:  # noqa: BLE001 - the point of the test
                    self.fail("reply %d %r...: %s: %s, not reft.Error" % (i, data[:64], type(e).__name__, e))
                self.check_only_reft_error(check, reply, "reply %d" % i)
            finally:
                close()

    def test_good_replies_pass(self):
        for t, good, check in LOG_REPLIES:
            with self.subTest(W.type_name(t)):
                check(good)


if __name__ == "__main__":
    unittest.main()
