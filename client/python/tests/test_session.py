import array
import ctypes
import errno
import os
import socket
import tempfile
import time
import unittest
import warnings
from unittest import mock

import reft
from reft._arena import ArenaCache
from common import AgentCase, pattern

try:
    import numpy
except ImportError:  # the core never needs it; only one test uses it
    numpy = None


class SaveRestore(AgentCase):
    def test_round_trip(self):
        s = self.session(chunk_size=1000)
        a, b, empty = pattern(5000, 1), pattern(70000, 2), bytearray()
        s.register("a", a)
        s.register("b", b, replicated=False)
        s.register("empty", empty)
        self.assertEqual(s.generations(), [])
        h = s.save(1)
        self.assertTrue(h.wait())
        self.assertTrue(h.done())
        self.assertEqual((h.seq, h.bytes), (1, 75000))
        a[:] = pattern(5000, 9)
        b[:] = pattern(70000, 9)
        self.assertEqual(s.restore(), 1)
        self.assertEqual((a, b), (pattern(5000, 1), pattern(70000, 2)))
        reg = self.requests("register")
        self.assertEqual(len(reg), 1)  # sent once, lazily, with every buffer
        self.assertEqual(reg[0], {"rank": 0, "world": 1, "local_rank": 0,
                                  "layout": "dp=1,pp=1,tp=1,order=tp-dp-pp", "chunk_size": 1000,
                                  "buffers": [{"name": "a", "size": 5000, "replicated": True},
                                              {"name": "b", "size": 70000, "replicated": False},
                                              {"name": "empty", "size": 0, "replicated": True}]})
        self.assertEqual(self.requests("release"), [{"step": 1}])

    def test_restore_nothing_and_exact_step(self):
        s = self.session()
        buf = pattern(3000, 0)
        s.register("w", buf)
        self.assertIsNone(s.restore())
        for step in (4, 5):
            buf[:] = pattern(3000, step)
            s.save(step).wait()
        self.assertEqual(s.generations(), [5, 4])
        self.assertEqual(s.restore(step=4), 4)
        self.assertEqual(buf, pattern(3000, 4))
        with self.assertRaises(reft.Error) as cm:
            s.restore(step=99)
        self.assertEqual(cm.exception.code, "not_found")
        self.assertEqual([g["step"] for g in s.generations(details=True)], [5, 4])

    def test_save_waits_for_the_previous_one(self):
        self.agent.commit_delay = 0.2
        s = self.session()
        s.register("w", pattern(100, 1))
        h1 = s.save(1)
        h2 = s.save(2)  # waits for h1 (its commit) before asking the agent
        self.assertTrue(h1.done())
        self.assertTrue(h2.wait())
        kinds = [t for t, _ in self.agent.log if t in ("save", "commit")]
        self.assertEqual(kinds, ["save", "commit", "save", "commit"])

    def test_wait_timeout_returns_false(self):
        self.agent.commit_delay = 0.5
        s = self.session()
        s.register("w", pattern(100, 1))
        h = s.save(1)
        self.assertFalse(h.wait(timeout=0.05))
        self.assertFalse(h.done())
        self.assertTrue(h.wait(timeout=5))

    def test_numpy_buffers(self):
        if numpy is None:
            self.skipTest("numpy is not installed (the client does not need it)")
        s = self.session()
        x = numpy.arange(1000, dtype=numpy.float32).reshape(10, 100)
        s.register("x", x)
        s.save(3).wait()
        x[:] = 0
        self.assertEqual(s.restore(), 3)
        self.assertTrue((x == numpy.arange(1000, dtype=numpy.float32).reshape(10, 100)).all())
        with self.assertRaisesRegex(reft.Error, "not C-contiguous"):
            self.session().register("t", numpy.zeros((4, 4)).T)

    def test_typed_buffers(self):
        s = self.session()
        x = array.array("d", [1.5] * 100)
        s.register("x", x)
        s.save(0).wait()
        x[0] = 7.0
        self.assertEqual(s.restore(), 0)
        self.assertEqual(x[0], 1.5)

    def test_restore_finishes_the_pending_save(self):
        s = self.session()
        buf = pattern(100, 1)
        s.register("w", buf)
        s.hint_idle(0)  # hint mode, no window: the copier waits
        h = s.save(1)
        self.assertEqual(s.restore(), 1)
        self.assertTrue(h.done())

    def test_arena_mappings_are_cached_by_path(self):
        s = self.session()
        s.register("w", pattern(100, 1))
        for step in range(6):
            s.save(step).wait()
        s.restore()
        # The fake agent cycles through three arena files.
        self.assertEqual(len(s._arenas), 3)
        s.close()
        self.assertEqual(len(s._arenas), 0)


class Registration(AgentCase):
    def test_rejects(self):
        s = self.session()
        s.register("w", bytearray(10))
        cases = [
            ("w", bytearray(1), "already registered"),
            ("ro", b"abc", "'ro'.*read-only"),
            ("nc", memoryview(bytearray(10))[::2], "'nc'.*not C-contiguous"),
            ("obj", object(), "'obj'.*does not expose a buffer"),
            ("", bytearray(1), "non-empty str"),
            (7, bytearray(1), "non-empty str"),
            ("x" * 300, bytearray(1), "longer than 256 bytes"),
        ]
        for name, buf, msg in cases:
            with self.subTest(msg), self.assertRaisesRegex(reft.Error, msg) as cm:
                s.register(name, buf)
            self.assertIsNone(cm.exception.code)

    def test_register_after_first_save_or_restore(self):
        for first in ("save", "restore", "generations"):
            with self.subTest(first):
                s = self.session()
                s.register("w", bytearray(10))
                r = s.save(1) if first == "save" else getattr(s, first)()
                if first == "save":
                    r.wait()
                with self.assertRaisesRegex(reft.Error, "before the first save"):
                    s.register("late", bytearray(10))

    def test_client_side_refusals_send_nothing(self):
        s = self.session()
        sent = s._conn.requests
        with self.assertRaisesRegex(reft.Error, "nothing is registered"):
            s.save(1)
        with self.assertRaisesRegex(reft.Error, "nothing is registered"):
            s.restore()
        s.register("w", bytearray(10))
        for bad in (-1, 1.0, True, "3"):
            with self.subTest(bad), self.assertRaises(reft.Error) as cm:
                s.save(bad)
            self.assertIsNone(cm.exception.code)
        with self.assertRaisesRegex(reft.Error, "negative"):
            s.restore(step=-2)
        self.assertEqual(s._conn.requests, sent)

    def test_buffer_export_is_released_at_close(self):
        s = self.session()
        buf = bytearray(10)
        s.register("w", buf)
        with self.assertRaises(BufferError):
            buf.extend(b"x")  # the session's export pins its size
        s.close()
        buf.extend(b"x")


class HostMover:
    """A register_external mover over bytearrays (what reft.torch's mover
    does for tensors, with memmove): fail makes the fence raise."""

    def __init__(self, bufs):
        self.bufs, self.fail, self.issued = bufs, None, []

    def issue(self, arena, jobs):
        for key, off, size, at in jobs:
            src = (ctypes.c_char * len(self.bufs[key])).from_buffer(self.bufs[key])
            ctypes.memmove(arena.addr + at, ctypes.addressof(src) + off, size)
            del src
        self.issued.append([j[0] for j in jobs])
        fail = self.fail

        class Fence:
            def wait(self):
                if fail:
                    raise OSError(5, fail)
        return Fence()

    def fill(self, jobs):
        for key, off, size, view in jobs:
            self.bufs[key][off:off + size] = view


class ExternalBuffers(AgentCase):
    def test_round_trip_with_host_buffers(self):
        s = self.session()
        ext = {"a": pattern(5000, 3), "b": pattern(300, 9)}
        mover = HostMover(ext)
        s.register("host", pattern(100, 1))
        s.register_external("a", 5000, mover)
        s.register_external("b", 300, mover, key="b", replicated=False)
        s.save(1).wait()
        self.assertEqual(sorted(mover.issued[0]), ["a", "b"])
        ext["a"][:] = bytes(5000)
        ext["b"][:] = bytes(300)
        self.assertEqual(s.restore(), 1)
        self.assertEqual((ext["a"], ext["b"]), (pattern(5000, 3), pattern(300, 9)))

    def test_a_failed_fence_aborts_the_save(self):
        s = self.session()
        mover = HostMover({"a": pattern(64, 1)})
        s.register_external("a", 64, mover)
        s.save(1).wait()
        mover.fail = "the copy engine failed"
        with self.assertRaisesRegex(reft.Error, r"save\(2\): the copy failed: .*the copy engine failed"):
            s.save(2).wait()
        self.assertIn(2, [st for t, st in ((t, p.get("step")) for t, p in self.agent.log) if t == "abort"])
        self.assertEqual(s.generations(), [1])

    def test_rejects(self):
        s = self.session()
        for args, msg in (((-1, HostMover({})), "nbytes=-1"), ((4, object()), "issue\\(arena, jobs\\)"),
                          ((True, HostMover({})), "nbytes=True")):
            with self.subTest(msg), self.assertRaisesRegex(reft.Error, msg):
                s.register_external("x", *args)


class JobWideRestore(AgentCase):
    def test_world_above_one_needs_agree(self):
        s = self.session(rank=1, world=2)
        s.register("w", bytearray(10))
        with self.assertRaisesRegex(reft.Error, "agree=") as cm:
            s.restore()
        self.assertIn("reft.torch.Checkpointer", str(cm.exception))
        s.save(3).wait()
        self.assertEqual(s.restore(step=3), 3)  # an explicit step needs no agreement

    @staticmethod
    def other_rank_holds(steps, log=None):
        """agree of rank 0 of two, whose other rank holds steps and
        restores them fine: the first call intersects with steps, the
        outcome rounds return what this rank passed."""
        calls = []

        def agree(mine):
            calls.append(list(mine))
            if log is not None:
                log.append(list(mine))
            return [s for s in mine if s in steps] if len(calls) == 1 else list(mine)
        return agree

    def test_agree_picks_the_common_step(self):
        seen = []
        s = self.session(rank=0, world=2, agree=self.other_rank_holds([2, 3], seen))
        buf = pattern(10, 0)
        s.register("w", buf)
        for step in (2, 3, 4):
            buf[:] = pattern(10, step)
            s.save(step).wait()
        self.assertEqual(s.restore(), 3)
        self.assertEqual(seen, [[4, 3], [0]])  # the steps, then "restored"
        self.assertEqual(buf, pattern(10, 3))

    def test_agree_nothing_common(self):
        s = self.session(rank=0, world=2, agree=self.other_rank_holds([]))
        said = []
        s._log = said.append
        s.register("w", bytearray(10))
        s.save(1).wait()
        self.assertIsNone(s.restore())
        # Committed work is thrown away: the rank says which.
        self.assertEqual(len(said), 1, said)
        self.assertIn("holds step(s) [1], but no step is held by every rank", said[0])

    def test_agree_nothing_held_says_nothing(self):
        # A first launch: no rank holds anything, and nothing is said.
        s = self.session(rank=0, world=2, agree=self.other_rank_holds([]))
        said = []
        s._log = said.append
        s.register("w", bytearray(10))
        self.assertIsNone(s.restore())
        self.assertEqual(said, [])

    def test_agree_must_choose_a_held_step(self):
        calls = []

        def agree(mine):  # the other rank holds step 8 and restores it fine
            calls.append(mine)
            return [8] if len(calls) == 1 else list(mine)
        s = self.session(rank=0, world=2, agree=agree)
        s.register("w", bytearray(10))
        s.save(1).wait()
        with self.assertRaisesRegex(reft.Error, r"restore of step 8 failed on rank 0: .*"
                                                r"\(this rank: restore\(\): agree chose step 8, which this rank"):
            s.restore()

    def test_outcome_agreement_names_the_failed_ranks(self):
        # The rounds of the Go client's TestAgreeFailed, with the same
        # results: 1 + ceil(log_64 world) rounds, the lowest 16 failed
        # ranks named.
        from reft.session import _agree_failed
        from test_conformance_agent import Intersection, run_ranks
        many = [7 * i for i in range(20)]
        for world, failed, rounds in ((4, [], 1), (4, [2], 2), (64, [0, 63], 2), (65, [64], 3),
                                      (1000, [0, 517, 999], 3), (200, many, 3)):
            with self.subTest(world=world, failed=failed):
                ag = Intersection(world)
                got = run_ranks(world, lambda r: _agree_failed(ag.agree(r), r, world, r in failed))
                want = (failed[:16], len(failed) > 16)
                self.assertEqual(got, [want] * world)
                self.assertEqual(ag.calls, rounds)

    def test_common_newest(self):
        self.assertEqual(reft.common_newest([[5, 4, 3], [4, 3], [3, 4, 6]]), 4)
        self.assertIsNone(reft.common_newest([[5], [4]]))
        self.assertIsNone(reft.common_newest([]))
        self.assertIsNone(reft.common_newest([[1], []]))


class AgentErrors(AgentCase):
    def test_commit_failure_is_raised_by_the_handle_and_aborts(self):
        self.agent.commit_error = "no_space"
        s = self.session()
        s.register("w", bytearray(10))
        h = s.save(1)
        with self.assertRaises(reft.Error) as cm:
            h.wait()
        self.assertEqual(cm.exception.code, "no_space")
        self.assertIn("save(1)", str(cm.exception))
        self.assertIs(h.error, cm.exception)
        self.assertEqual(self.requests("abort"), [{"step": 1}])
        self.agent.commit_error = None
        self.assertTrue(s.save(2).wait())  # the session goes on

    def test_unobserved_failure_warns_at_the_next_save(self):
        self.agent.commit_error = "internal"
        s = self.session()
        s.register("w", bytearray(10))
        h = s.save(1)
        while not h.done():  # done() does not count as looking at the result
            time.sleep(0.01)
        self.agent.commit_error = None
        with self.assertWarnsRegex(RuntimeWarning, "snapshot of step 1 failed"):
            s.save(2).wait()

    def test_connection_lost(self):
        s = self.session()
        s.register("w", bytearray(10))
        s.save(1).wait()
        self.agent.close()
        with self.assertRaisesRegex(reft.Error, "connection to the reft agent at .* is lost") as cm:
            s.generations()
        self.assertIsNone(cm.exception.code)
        with self.assertRaisesRegex(reft.Error, "is lost"):
            s.save(2)


class Degraded(AgentCase):
    def test_degraded_said_once_per_change(self):
        # Steps 2-4 short of the SPEC for peering, 5 for peering and
        # rank_local, 6-7 as the SPEC asks.
        reasons = {2: ["peering"], 3: ["peering"], 4: ["peering"], 5: ["peering", "rank_local"]}
        self.agent.degraded = reasons.get
        s = self.session()
        said = []
        s._log = said.append
        s.register("w", bytearray(10))
        for step in range(1, 8):
            s.save(step).wait()
        self.assertEqual(len(said), 3, said)
        self.assertIn("less protected than the SPEC asks (peering)", said[0])
        self.assertIn("less protected than the SPEC asks (peering, rank_local)", said[1])
        self.assertIn("protected as the SPEC asks again (it had said: peering, rank_local)", said[2])

    def test_healthy_says_nothing(self):
        s = self.session()
        said = []
        s._log = said.append
        s.register("w", bytearray(10))
        for step in (1, 2):
            s.save(step).wait()
        self.assertEqual(said, [])


class IdZeroErrors(AgentCase):
    agent_options = {"id0_errors": True}

    def test_error_with_id_zero_answers_the_request(self):
        s = self.session()
        s.register("w", bytearray(10))
        with self.assertRaises(reft.Error) as cm:
            s.restore(step=5)
        self.assertEqual(cm.exception.code, "not_found")
        self.assertEqual(s.generations(), [])  # the connection is still in step


class Forbidden(AgentCase):
    agent_options = {"forbid": True}

    def test_forbidden(self):
        with self.assertRaises(reft.Error) as cm:
            self.session()
        self.assertEqual(cm.exception.code, "forbidden")
        self.assertIn("uid 1 may not use this agent", str(cm.exception))


class OldAgent(AgentCase):
    agent_options = {"protocol": 2}

    def test_protocol_mismatch(self):
        with self.assertRaisesRegex(reft.Error, "speaks protocol 2; this client .* speaks 1"):
            self.session()


class DisabledStore(AgentCase):
    agent_options = {"disabled": True}

    def test_disabled_store(self):
        s = self.session()
        s.register("w", bytearray(10))
        with self.assertRaisesRegex(reft.Error, "no snapshot store") as cm:
            s.save(1)
        self.assertEqual(cm.exception.code, "disabled")

    def test_disabled_store_optional(self):
        s = self.session(optional=True)
        s.register("w", bytearray(10))
        with self.assertWarnsRegex(RuntimeWarning, "no snapshot store"):
            self.assertTrue(s.save(1).wait())
        self.assertFalse(s.enabled)
        self.assertIsNone(s.restore())


class NotEnabled(unittest.TestCase):
    def setUp(self):
        p = mock.patch.dict(os.environ, {}, clear=True)
        p.start()
        self.addCleanup(p.stop)

    def test_no_socket_variable(self):
        with self.assertRaises(reft.Error) as cm:
            reft.Session()
        self.assertEqual(str(cm.exception),
                         "reft is not enabled for this step: REFT_AGENT_SOCKET is not set; run with "
                         "srun --reft=arc or pass optional=True")
        self.assertIsNone(cm.exception.code)

    def test_unreachable_agent_names_path_and_errno(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "agent.sock")
            os.environ["REFT_AGENT_SOCKET"] = path
            with self.assertRaises(reft.Error) as cm:
                reft.Session()
            self.assertIn(path, str(cm.exception))
            self.assertIn("[Errno %d]" % errno.ENOENT, str(cm.exception))
            # A socket nobody listens on any more.
            srv = socket.socket(socket.AF_UNIX)
            srv.bind(path)
            srv.close()
            with self.assertRaisesRegex(reft.Error, r"\[Errno %d\]" % errno.ECONNREFUSED):
                reft.Session()

    def test_optional_session_is_disabled_and_warns_once(self):
        s = reft.Session(optional=True)
        self.assertFalse(s.enabled)
        self.assertIn("REFT_AGENT_SOCKET is not set", s.disabled_reason)
        buf = bytearray(10)
        s.register("w", buf)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            h = s.save(1)
            self.assertTrue(h.done())
            self.assertTrue(h.wait())
            self.assertIsNone(s.restore())
            self.assertEqual(s.generations(), [])
            s.hint_idle(10)
            s.save(2).wait()
        self.assertEqual(len(w), 1, [str(x.message) for x in w])
        self.assertIn("REFT_AGENT_SOCKET is not set", str(w[0].message))
        s.close()

    def test_optional_unreachable_agent(self):
        os.environ["REFT_AGENT_SOCKET"] = "/nonexistent/agent.sock"
        s = reft.Session(optional=True)
        self.assertFalse(s.enabled)
        self.assertIn("/nonexistent/agent.sock", s.disabled_reason)

    def test_rank_and_world_from_slurm(self):
        os.environ.update(SLURM_PROCID="3", SLURM_NTASKS="8", SLURM_LOCALID="1", REFT_SPEC="arc,tp=2")
        s = reft.Session(optional=True)
        self.assertEqual((s.rank, s.world, s.local_rank), (3, 8, 1))
        self.assertEqual(str(s.layout), "dp=4,pp=1,tp=2,order=tp-dp-pp")
        s = reft.Session(optional=True, rank=0, world=1, layout="dp=1")
        self.assertEqual((s.rank, s.world, s.local_rank), (0, 1, 1))

    def test_defaults_without_slurm(self):
        s = reft.Session(optional=True)
        self.assertEqual((s.rank, s.world, s.local_rank), (0, 1, 0))

    def test_bad_arguments(self):
        os.environ["SLURM_PROCID"] = "x"
        with self.assertRaisesRegex(reft.Error, "SLURM_PROCID='x' is not an integer"):
            reft.Session(optional=True)
        del os.environ["SLURM_PROCID"]
        for kw, msg in (({"rank": 2, "world": 2}, "rank 2 is not below"),
                        ({"world": 0}, "world=0"),
                        ({"chunk_size": 0}, "chunk_size"),
                        ({"agree": 3}, "agree must be callable"),
                        ({"layout": "dp=3", "world": 2}, "dp=3 x pp=1 x tp=1 = 3 ranks")):
            with self.subTest(kw), self.assertRaisesRegex(reft.Error, msg):
                reft.Session(optional=True, **kw)


class Lifecycle(AgentCase):
    def test_context_manager_and_closed(self):
        with self.session() as s:
            s.register("w", bytearray(10))
            h = s.save(1)
        self.assertTrue(h.done())  # close waited for it
        self.assertEqual(self.requests("commit"), [{"step": 1}])
        for call in (lambda: s.save(2), s.restore, s.generations, lambda: s.hint_idle(1),
                     lambda: s.register("x", bytearray(1))):
            with self.assertRaisesRegex(reft.Error, "after close"):
                call()
        s.close()  # idempotent

    def test_interrupted_close_leaves_the_copier_its_memory(self):
        s = self.session()
        buf = bytearray(5000)
        s.register("w", buf)
        s.hint_idle(0)
        h = s.save(1)  # parked: no window

        def interrupted():
            raise KeyboardInterrupt

        with mock.patch.object(s, "_finish_pending", interrupted):
            with self.assertRaises(KeyboardInterrupt):
                s.close()
        self.assertEqual(len(s._arenas), 1)  # still mapped for the copier
        with self.assertRaises(BufferError):
            buf.extend(b"x")  # and the buffer still exported
        s._hurry(h)
        with self.assertRaisesRegex(reft.Error, "closed"):
            h.wait(timeout=5)

    def test_hello(self):
        with mock.patch.dict(os.environ, {"REFT_STEP_ID": "7.0"}):
            s = self.session(rank=0)
        self.assertEqual(s.agent["protocol"], 1)
        hello = self.requests("hello")[0]
        self.assertEqual(hello["client"], "reft-py/" + reft.__version__)
        self.assertEqual((hello["pid"], hello["step"], hello["rank"]), (os.getpid(), "7.0", 0))
        self.assertEqual(s.status()["store_dir"], self.agent.store_dir)


class ArenaCacheTest(unittest.TestCase):
    def test_remap_on_size_or_file_change(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "arena-0")
            with open(path, "wb") as f:
                f.truncate(8192)
            c = ArenaCache()
            m1 = c.get(path, 4096, writable=True)
            self.assertIs(c.get(path, 4096, writable=True), m1)
            self.assertIs(c.get(path, 4096, writable=False), m1)  # a writable one reads too
            m2 = c.get(path, 8192, writable=True)
            self.assertIsNot(m2, m1)
            self.assertTrue(m1.mm.closed)
            os.unlink(path)  # the store replaced the file: the old mapping is stale
            with open(path, "wb") as f:
                f.truncate(8192)
            m3 = c.get(path, 8192, writable=False)
            self.assertIsNot(m3, m2)
            with self.assertRaisesRegex(reft.Error, "has 8192 bytes, the agent said 12288"):
                c.get(path, 12288, writable=False)
            with self.assertRaisesRegex(reft.Error, "absolute path"):
                c.get("arena-0", 4096, writable=False)
            c.close()
            self.assertTrue(m3.mm.closed)


if __name__ == "__main__":
    unittest.main()
