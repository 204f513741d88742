"""The message log (reft.Session.log_append/log_read/log_truncate/
log_steps; docs/PROTOCOL.md, "Message log") against the real agent
(tests/conformance-agent with --memory-budget, which the per-rank cap
derives from), and the client's CRC-32C (reft._crc32c)."""

import glob
import os
import random
import threading
import unittest
from unittest import mock

import reft
from reft import _crc32c, _msglog, conformance
from reft import session as session_mod
from common import pattern
from test_conformance_agent import agent_binary, tearDownModule  # noqa: F401 - removes the build
from test_torch import needs_torch, torch

try:
    import numpy
except ImportError:
    numpy = None

needs_numpy = unittest.skipIf(numpy is None, "numpy is not importable")
GiB, MiB = 1 << 30, 1 << 20


def crc_bytewise(data):
    """The reference: CRC-32C one byte at a time."""
    c = 0xFFFFFFFF
    for b in bytes(data):
        c = _crc32c._T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


class Crc32c(unittest.TestCase):
    def test_check_values(self):
        # The check value of the CRC catalogue and RFC 3720's (iSCSI) vectors.
        for name, data, want in [
            ("empty", b"", 0),
            ("123456789", b"123456789", 0xE3069283),
            ("32 zeros", bytes(32), 0x8A9136AA),
            ("32 0xff", b"\xff" * 32, 0x62A8AB43),
            ("0..31", bytes(range(32)), 0x46DD794E),
            ("31..0", bytes(range(31, -1, -1)), 0x113FDB5C),
        ]:
            with self.subTest(name):
                self.assertEqual(_crc32c.crc32c(data), want)
                self.assertEqual(_crc32c._pure(data), want)

    def test_lanes_against_a_byte_loop(self):
        # Sizes around the lane (256 B), the smallest lane block (16
        # lanes) and the largest (8192 lanes, 2 MiB), and several blocks.
        rng = random.Random(5)
        lane, few, block = _crc32c._M, _crc32c._M * _crc32c._MIN_PURE_LANES, _crc32c._M * _crc32c._MAX_LANES
        for n in (1, lane - 1, lane, few - 1, few, few + 1, 3 * few + 17, block - 1, block, block + lane + 3,
                  2 * block + 1000):
            data = rng.randbytes(n)
            with self.subTest(n=n):
                want = crc_bytewise(data)
                self.assertEqual(_crc32c._pure(data), want)
                self.assertEqual(_crc32c.crc32c(memoryview(bytearray(data))), want)

    def test_backend(self):
        # The kernel's when it gives the check values; said, not assumed.
        self.assertIn(_crc32c.backend(), ("kernel", "python"))


class LogCase(unittest.TestCase):
    """A real agent with a memory budget, and a registered session."""

    budget = GiB

    def setUp(self):
        self.agent = self.start_agent(self.budget)
        self.s = self.session(self.agent)

    def start_agent(self, budget):
        a = conformance._Agent("%s --memory-budget %d" % (agent_binary(), budget), 0)
        self.addCleanup(a.stop)
        return a

    def session(self, agent, rank=0, world=1, register=True):
        s = reft.Session(socket_path=agent.path, rank=rank, world=world)
        self.addCleanup(s.close)
        if register:
            s.register("w", bytearray(4096))
        return s

    def assertRaisesCode(self, code, *texts):
        """A context that wants a reft.Error of ``code`` saying every text."""
        test = self

        class Ctx:
            def __enter__(self):
                return self

            def __exit__(self, typ, e, tb):
                if typ is None:
                    test.fail("no reft.Error raised, want code %r" % (code,))
                if not issubclass(typ, reft.Error):
                    return False
                test.assertEqual(e.code, code, str(e))
                for t in texts:
                    test.assertIn(t, str(e))
                self.exception = e
                return True

        return Ctx()


class RoundTrip(LogCase):
    def test_append_then_read(self):
        # Sizes: under a page, a page and a bit, a few MiB and more than a
        # copy chunk; and every kind of bytes-like data.
        msgs = [
            ("act>1", 1, 0, bytes(pattern(100, 1))),
            ("act>1", 1, 1, pattern(4097, 2)),
            ("grad>0", 1, 0, memoryview(pattern(3 * MiB + 5, 3))),
            ("act>1", 2, 0, bytes(pattern(9 * MiB, 4))),
            ("act>1", 3, (1 << 31) - 1, b"x"),
        ]
        for stream, step, seq, data in msgs:
            self.assertFalse(self.s.log_append(stream, step, seq, data))
        for stream, step, seq, data in msgs:
            with self.subTest(stream=stream, step=step, seq=seq):
                got = self.s.log_read(stream, step, seq)
                self.assertIsInstance(got, bytes)
                self.assertEqual(got, bytes(data))
                out = bytearray(len(data))
                self.assertIs(self.s.log_read(stream, step, seq, out=out), out)
                self.assertEqual(out, bytes(data))
        st = self.s.status()["msglog"]
        total = sum(len(m[3]) for m in msgs)
        self.assertEqual((st["bytes"], st["appended_bytes"]), (total, total))

    def test_non_contiguous_buffer_logs_its_bytes_in_c_order(self):
        base = memoryview(pattern(1000, 9))
        strided = base[::2]
        self.assertFalse(strided.c_contiguous)
        self.s.log_append("act>1", 1, 0, strided)
        self.assertEqual(self.s.log_read("act>1", 1, 0), strided.tobytes())

    @needs_numpy
    def test_numpy(self):
        a = numpy.arange(10000, dtype=numpy.float64).reshape(100, 100)
        self.s.log_append("act>1", 1, 0, a)
        out = numpy.zeros_like(a)
        self.s.log_read("act>1", 1, 0, out=out)
        self.assertTrue((out == a).all())
        self.s.log_append("act>1", 2, 0, a.T)  # not contiguous: its C-order bytes
        self.assertEqual(self.s.log_read("act>1", 2, 0), numpy.ascontiguousarray(a.T).tobytes())

    def test_reappend(self):
        data = bytes(pattern(MiB, 7))
        self.assertFalse(self.s.log_append("act>2", 5, 0, data))
        changed = bytearray(data)
        changed[77] ^= 1
        for name, again, held, code in [
            ("the same bytes", data, True, None),
            ("one byte changed", changed, None, "mismatch"),
            ("another length", data[:4096], None, "mismatch"),
        ]:
            with self.subTest(name):
                if code is None:
                    self.assertEqual(self.s.log_append("act>2", 5, 0, again), held)
                else:
                    with self.assertRaisesCode(code, 'message log append of stream "act>2" step 5 seq 0',
                                               "logged with other bytes"):
                        self.s.log_append("act>2", 5, 0, again)
                self.assertEqual(self.s.log_read("act>2", 5, 0), data)  # the held message is kept
        self.assertEqual(self.s.status()["msglog"]["appended_bytes"], MiB)

    def test_steps_and_truncate(self):
        for step in (3, 1, 2, 7):  # appended out of order, listed ascending
            for seq in range(2):
                self.s.log_append("act>1", step, seq, pattern(1000 + step, seq))
        self.s.log_append("grad>0", 2, 0, b"g")
        for stream, want in [("act>1", [1, 2, 3, 7]), ("grad>0", [2]), ("nothing", [])]:
            with self.subTest(stream):
                self.assertEqual(self.s.log_steps(stream), want)
        self.assertEqual(self.s.log_truncate(2), (5, 1001 + 1001 + 1002 + 1002 + 1))
        self.assertEqual(self.s.log_steps("act>1"), [3, 7])
        self.assertEqual(self.s.log_steps("grad>0"), [])
        with self.assertRaisesCode("not_found", 'message log read of stream "act>1" step 2 seq 1',
                                   "rank 0 holds no"):
            self.s.log_read("act>1", 2, 1)
        self.assertEqual(self.s.log_truncate(2), (0, 0))
        self.assertEqual(self.s.log_truncate(-1), (0, 0))
        self.assertEqual(self.s.log_read("act>1", 3, 1), pattern(1003, 1))

    def test_read_into_the_wrong_buffer(self):
        self.s.log_append("act>1", 3, 0, pattern(4096, 1))
        before = self.s._conn.requests
        for name, out, text in [
            ("read-only", bytes(4096), "out is read-only"),
            ("no buffer", [0] * 4096, "does not expose a buffer"),
            ("not contiguous", memoryview(bytearray(8192))[::2], "not C-contiguous"),
        ]:
            with self.subTest(name):
                with self.assertRaisesCode(None, 'message log read of stream "act>1" step 3 seq 0', text):
                    self.s.log_read("act>1", 3, 0, out=out)
        self.assertEqual(self.s._conn.requests, before, "refused before asking the agent")
        # The size is the agent's to say: one round trip, and nothing written.
        for n in (10, 4097):
            out = bytearray(n)
            with self.subTest(size=n):
                with self.assertRaisesCode(None, "the stored message has 4096 bytes, out has %d" % n, "exact length"):
                    self.s.log_read("act>1", 3, 0, out=out)
                self.assertEqual(out, bytearray(n))


class Refusals(LogCase):
    def test_bad_keys_are_refused_here(self):
        big = 1 << 63
        for name, call, text in [
            ("empty message", lambda: self.s.log_append("act>1", 1, 0, b""), "size = 0 must be positive"),
            ("empty bytearray", lambda: self.s.log_append("act>1", 1, 0, bytearray()), "size = 0 must be positive"),
            ("stream with a space", lambda: self.s.log_append("act 1", 1, 0, b"x"),
             'stream name "act 1" has a byte 0x20 at 3: use printable ASCII without spaces'),
            ("stream with a newline", lambda: self.s.log_read("act\n1", 1, 0), "has a byte 0x0a at 3"),
            ("stream not ASCII", lambda: self.s.log_steps("akt\u00e9"), "has a byte 0xc3 at 3"),
            ("empty stream", lambda: self.s.log_steps(""), "the stream name is empty"),
            ("long stream", lambda: self.s.log_steps("x" * 65), "stream name of 65 bytes is longer than 64"),
            ("stream not a str", lambda: self.s.log_append(b"act>1", 1, 0, b"x"), "is a bytes, not a str"),
            ("negative step", lambda: self.s.log_read("act>1", -1, 0), "step = -1 must not be negative"),
            ("step past int64", lambda: self.s.log_append("act>1", big, 0, b"x"), "step = %d must be at most" % big),
            ("step not an int", lambda: self.s.log_append("act>1", 1.0, 0, b"x"), "step = 1.0 must be an int"),
            ("step a bool", lambda: self.s.log_read("act>1", True, 0), "step = True must be an int"),
            ("negative seq", lambda: self.s.log_append("act>1", 1, -1, b"x"), "seq = -1 must be in [0, 2147483647]"),
            ("seq past int32", lambda: self.s.log_read("act>1", 1, 1 << 31), "seq = 2147483648 must be in"),
            ("data not a buffer", lambda: self.s.log_append("act>1", 1, 0, "text"), "data of type str does not expose"),
            ("up_to not an int", lambda: self.s.log_truncate("3"), "up_to = '3' must be an int"),
            ("up_to past int64", lambda: self.s.log_truncate(big), "does not fit in 64 bits"),
        ]:
            with self.subTest(name):
                before = self.s._conn.requests
                with self.assertRaisesCode(None, text):
                    call()
                self.assertEqual(self.s._conn.requests, before, "refused before asking the agent")

    def test_before_register(self):
        bare = self.session(self.agent, register=False)
        with self.assertRaisesCode(None, 'message log append of stream "act>1" step 1 seq 0: nothing is registered',
                                   "register(name, buf)"):
            bare.log_append("act>1", 1, 0, b"x")
        bare.register("w", bytearray(4096))  # still open: the log registered nothing
        self.assertFalse(bare.log_append("act>1", 1, 0, b"x"))

    def test_disabled_session_raises(self):
        # As the Go client's ErrLogDisabled: save() does nothing quietly,
        # a log call says that nothing was logged.
        with mock.patch.dict(os.environ, {"REFT_AGENT_SOCKET": ""}):
            off = reft.Session(optional=True, rank=0, world=1)
        self.addCleanup(off.close)
        off.register("w", bytearray(16))
        for name, call in [
            ("append", lambda: off.log_append("act>1", 1, 0, b"x")),
            ("read", lambda: off.log_read("act>1", 1, 0)),
            ("truncate", lambda: off.log_truncate(1)),
            ("steps", lambda: off.log_steps("act>1")),
        ]:
            with self.subTest(name):
                with self.assertRaisesCode(None, "reft is disabled for this session", "REFT_AGENT_SOCKET",
                                           "nothing was logged or read"):
                    call()

    def test_after_close(self):
        self.s.log_append("act>1", 1, 0, b"x")
        self.assertEqual(len(self.s._log_maps), 1)
        self.s.close()
        self.assertEqual(len(self.s._log_maps), 0)
        with self.assertRaisesCode(None, "log_read() after close()"):
            self.s.log_read("act>1", 1, 0)


class Cap(LogCase):
    budget = 16 * MiB  # a lone rank's cap: 8 MiB

    def test_over_the_cap(self):
        for step in range(1, 5):
            self.s.log_append("act>1", step, 0, pattern(2 * MiB, step))
        with self.assertRaisesCode("no_space", 'message log append of stream "act>1" step 5 seq 0',
                                   "cap of 8388608 bytes", "nothing was dropped"):
            self.s.log_append("act>1", 5, 0, pattern(2 * MiB, 5))
        for step in range(1, 5):
            self.assertEqual(self.s.log_read("act>1", step, 0), pattern(2 * MiB, step))
        self.assertEqual(self.s.log_truncate(1), (1, 2 * MiB))
        self.s.log_append("act>1", 5, 0, pattern(2 * MiB, 5))
        self.assertEqual(self.s.log_steps("act>1"), [2, 3, 4, 5])


class Checksums(LogCase):
    def test_a_wrong_crc_is_not_stored(self):
        # The agent checksums what the client copied: a CRC-32C that is not
        # the bytes' (a copy gone wrong) stores nothing.
        with mock.patch.object(session_mod, "crc32c", lambda data: 0x12345678):
            with self.assertRaisesCode("corrupt", 'message log append of stream "act>1" step 4 seq 2', "0x12345678"):
                self.s.log_append("act>1", 4, 2, pattern(5000, 1))
        self.assertEqual(self.s.log_steps("act>1"), [])

    def test_the_copy_read_is_checked(self):
        self.s.log_append("act>1", 4, 2, pattern(5000, 1))
        real = session_mod.crc32c
        with mock.patch.object(session_mod, "crc32c", lambda data: real(data) ^ 1):
            for out in (None, bytearray(5000)):
                with self.subTest(out=type(out).__name__):
                    with self.assertRaisesCode(None, 'message log read of stream "act>1" step 4 seq 2',
                                               "the copy of the message fails its CRC-32C", "read it again"):
                        self.s.log_read("act>1", 4, 2, out=out)
        self.assertEqual(self.s.log_read("act>1", 4, 2), pattern(5000, 1))

    def test_corrupt_in_the_agent(self):
        data = pattern(MiB, 9)
        self.s.log_append("act>1", 4, 2, data)
        arenas = [p for p in glob.glob(os.path.join(self.s.status()["store_dir"], "msglog", "arena-*"))
                  if not p.endswith(".rec")]
        self.assertEqual(len(arenas), 1, arenas)
        with open(arenas[0], "r+b") as f:
            f.seek(12345)
            f.write(bytes([data[12345] ^ 0xFF]))
        for _ in range(2):  # it stays held, and fails every read
            with self.assertRaisesCode("corrupt", 'stream "act>1" step 4 seq 2'):
                self.s.log_read("act>1", 4, 2)
        self.assertFalse(self.s.log_append("act>1", 4, 2, data))  # appending it again replaces it
        self.assertEqual(self.s.log_read("act>1", 4, 2), data)


class Concurrency(LogCase):
    def test_log_beside_saves(self):
        """A logging thread appends, reads and truncates while the trainer
        saves: the calls take turns on the one connection."""
        state = pattern(MiB, 1)
        s = self.session(self.agent, register=False)
        s.register("w", state)
        errors = []

        def logger():
            try:
                for step in range(1, 21):
                    data = pattern(300 << 10, step)
                    s.log_append("act>1", step, 0, data)
                    if s.log_read("act>1", step, 0) != data:
                        raise AssertionError("step %d read back differs" % step)
                    if step % 4 == 0:
                        s.log_truncate(step - 2)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=logger)
        t.start()
        for step in range(1, 11):
            self.assertTrue(s.save(step).wait(timeout=60))
        t.join(60)
        self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])
        self.assertEqual(s.log_steps("act>1"), [19, 20])
        self.assertEqual(s.generations()[0], 10)

    def test_ranks_apart(self):
        """A log is read and truncated only by the rank that wrote it."""
        r0 = self.session(self.agent, 0, 2)
        r1 = self.session(self.agent, 1, 2)
        r0.log_append("act>1", 1, 0, pattern(5000, 10))
        r1.log_append("grad>0", 1, 0, pattern(5000, 11))
        with self.assertRaisesCode("not_found", "rank 1 holds no"):
            r1.log_read("act>1", 1, 0)
        r1.log_truncate(100)
        self.assertEqual(r0.log_read("act>1", 1, 0), pattern(5000, 10))


@needs_torch
class Tensors(LogCase):
    def test_cpu_tensor_round_trip(self):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(64, 33, generator=g)
        for name, t in [
            ("float32", x),
            ("float64", x.double()),
            ("bfloat16", x.bfloat16()),
            ("float16 with nan and -0", torch.tensor([float("nan"), -0.0, float("inf"), 1e-8], dtype=torch.float16)),
            ("int64", torch.arange(-5000, 5000)),
            ("bool", x > 0),
            ("transposed", x.t()),
            ("requires grad", x.clone().requires_grad_()),
        ]:
            with self.subTest(name):
                stream = "t>" + name.split()[0]
                self.assertFalse(self.s.log_append(stream, 1, 0, t))
                host = t.detach().contiguous()
                raw = self.s.log_read(stream, 1, 0)
                self.assertEqual(len(raw), host.numel() * host.element_size())
                out = torch.empty_like(host)
                self.assertIs(self.s.log_read(stream, 1, 0, out=out), out)
                # Bit-exact: compared as bytes (nan != nan as floats).
                self.assertEqual(out.view(-1).view(torch.uint8).tolist(), host.view(-1).view(torch.uint8).tolist())
                self.assertEqual(bytes(out.view(-1).view(torch.uint8).tolist()), raw)
                self.assertTrue(self.s.log_append(stream, 1, 0, host))  # the same bits: held

    def test_tensor_out_of_the_wrong_size_or_shape(self):
        self.s.log_append("act>1", 1, 0, torch.ones(100))
        for name, out, text in [
            ("fewer bytes", torch.empty(99), "the stored message has 400 bytes, out has 396"),
            ("another dtype", torch.empty(100, dtype=torch.float64), "out has 800"),
            ("not contiguous", torch.empty(10, 20).t()[:, :10], "non-contiguous tensor"),
        ]:
            with self.subTest(name):
                with self.assertRaisesCode(None, text):
                    self.s.log_read("act>1", 1, 0, out=out)
        same_bytes = torch.empty(200, dtype=torch.float16)  # 400 bytes: read as raw bytes
        self.s.log_read("act>1", 1, 0, out=same_bytes)
        self.assertEqual(same_bytes.view(torch.float32).tolist(), [1.0] * 100)

    def test_views_log_their_values(self):
        # A conjugate view's bytes are its values', not its base's.
        c = torch.tensor([1 + 2j, 3 - 4j]).conj()
        self.s.log_append("act>1", 1, 0, c)
        out = torch.empty(2, dtype=torch.complex64)
        self.s.log_read("act>1", 1, 0, out=out)
        self.assertTrue(torch.equal(out, c.resolve_conj()))
        with self.assertRaisesCode(None, "size = 0 must be positive"):
            self.s.log_append("act>1", 2, 0, torch.empty(0))

    def test_device_staging(self):
        # The path of a CUDA out (a staged copy, then copy_ into the
        # tensor), run on a CPU tensor: this machine may have no GPU.
        x = torch.randn(8, 9).bfloat16()
        self.s.log_append("act>1", 1, 0, x)
        out = torch.zeros_like(x)
        real = _msglog.Sink

        def device_sink(o):
            sink = real(o)
            sink.view.release()
            sink.view, sink.device = None, o
            return sink

        with mock.patch.object(_msglog, "Sink", device_sink):
            self.assertIs(self.s.log_read("act>1", 1, 0, out=out), out)
        self.assertTrue(torch.equal(out.view(torch.int16), x.view(torch.int16)))

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_tensor_round_trip(self):
        x = torch.randn(1 << 20, device="cuda")
        self.assertFalse(self.s.log_append("act>1", 1, 0, x))
        raw = bytearray(self.s.log_read("act>1", 1, 0))
        self.assertTrue(torch.equal(torch.frombuffer(raw, dtype=torch.int32), x.cpu().view(torch.int32)))
        out = torch.empty_like(x)
        self.assertIs(self.s.log_read("act>1", 1, 0, out=out), out)
        self.assertTrue(torch.equal(out.view(torch.int32), x.view(torch.int32)))
        self.assertTrue(self.s.log_append("act>1", 1, 0, x.cpu()))


class Replies(unittest.TestCase):
    """The checks of the agent's replies (tests/test_wire_fuzz.py mutates them)."""

    def test_bad_replies(self):
        for name, check, reply, text in [
            ("relative arena", lambda r: _msglog.append_reply(r, 10), {"arena": "x", "arena_size": 4096},
             "not an absolute path"),
            ("small arena", lambda r: _msglog.append_reply(r, 10), {"arena": "/a", "arena_size": 5},
             "holds 5 bytes, less than the message's 10"),
            ("no size", _msglog.read_reply, {"arena": "/a", "arena_size": 4096, "crc32c": 1}, "message size of None"),
            ("crc too big", _msglog.read_reply, {"arena": "/a", "arena_size": 4096, "size": 1, "crc32c": 1 << 32},
             "not a 32-bit unsigned int"),
            ("held a string", _msglog.commit_reply, {"held": "yes"}, "not a bool"),
            ("negative count", _msglog.truncate_reply, {"messages": -1, "bytes": 0}, "not counts"),
            ("steps descending", _msglog.steps_reply, {"steps": [3, 2]}, "not ascending"),
            ("steps repeated", _msglog.steps_reply, {"steps": [2, 2]}, "not ascending"),
            ("steps not ints", _msglog.steps_reply, {"steps": [1, "2"]}, "not a list of ints"),
        ]:
            with self.subTest(name):
                with self.assertRaises(reft.Error) as cm:
                    check(reply)
                self.assertIn(text, str(cm.exception))
                self.assertIn("install the Python client of the reft version", str(cm.exception))
        self.assertEqual(_msglog.steps_reply({"steps": None}), [])
        self.assertFalse(_msglog.commit_reply({}))


if __name__ == "__main__":
    unittest.main()
