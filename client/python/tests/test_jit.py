"""The JIT flush (reft.Session.consistent/updating/flush/watch_failures/
flush_on_signal) against the real agent (tests/conformance-agent), which
sends a peer failure notice when told "notify NODE CAUSE" on its stdin."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import reft
from reft import conformance
from common import pattern
from test_conformance_agent import agent_binary, tearDownModule  # noqa: F401 - removes the build

HERE = os.path.dirname(os.path.abspath(__file__))


def _until(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.005)


class JIT(unittest.TestCase):
    def setUp(self):
        self.agent = conformance._Agent(agent_binary(), 0)
        self.addCleanup(self.agent.stop)
        self.lines = []
        self.s = reft.Session(socket_path=self.agent.path, rank=0, world=1, chunk_size=16 << 10)
        self.addCleanup(self.s.close)
        self.buf = bytearray(64 << 10)
        self.s.register("state", self.buf)

    def notify(self, node, cause="peer_lost: EOF"):
        self.agent.proc.stdin.write(("notify %s %s\n" % (node, cause)).encode())
        self.agent.proc.stdin.flush()

    def step(self, step):
        """One training step: updating, the update, consistent."""
        self.s.updating()
        self.buf[:] = pattern(len(self.buf), step)
        self.s.consistent(step)

    def log(self):
        return "\n".join(self.lines)

    def wait_log(self, text):
        _until(lambda: text in self.log(), "a log line with %r; got:\n%s" % (text, self.log()))

    def check_restores(self, step):
        self.buf[:] = bytes(len(self.buf))
        self.assertEqual(self.s.restore(step=step), step)
        self.assertEqual(self.buf, pattern(len(self.buf), step))

    def test_flush(self):
        """Table: what a direct flush() saves, by where the trainer stands."""
        cases = [
            ("nothing declared", [], None, False),
            ("newer than the last save", [("step", 10), ("save", 10), ("step", 11), ("step", 12)], 12, True),
            ("already committed", [("step", 10), ("save", 10)], 10, False),
        ]
        for name, script, want_step, want_saved in cases:
            with self.subTest(name):
                agent = conformance._Agent(agent_binary(), 0)  # a store of its own
                self.addCleanup(agent.stop)
                s = reft.Session(socket_path=agent.path, rank=0, world=1)
                self.addCleanup(s.close)
                buf = bytearray(4096)
                s.register("state", buf)
                for op, n in script:
                    if op == "step":
                        s.updating()
                        buf[:] = pattern(len(buf), n)
                        s.consistent(n)
                    else:
                        self.assertTrue(s.save(n).wait(timeout=30))
                lines = []
                s._log = lines.append
                step, saved = s.flush("test", timeout=10)
                self.assertEqual((step, saved), (want_step, want_saved))
                self.assertEqual(any("JIT save of step" in l for l in lines), want_saved, lines)
                if want_saved:
                    self.assertIn(want_step, s.generations())

    def test_notice_saves_newest_consistent_step(self):
        self.s.watch_failures(log=self.lines.append)
        for n in range(1, 14):
            self.step(n)
            if n % 5 == 0:
                self.assertTrue(self.s.save(n).wait(timeout=30))
        self.notify("n2")
        self.wait_log("JIT save of step 13 committed")
        self.assertIn("node n2 failed: peer_lost: EOF", self.log())
        self.check_restores(13)

    def test_waits_while_updating(self):
        self.s.watch_failures(log=self.lines.append)
        self.step(10)
        self.assertTrue(self.s.save(10).wait(timeout=30))
        self.step(11)
        self.s.updating()  # the update of step 12 runs
        self.buf[:] = pattern(len(self.buf), 99)
        self.notify("n3")
        time.sleep(0.1)  # a flush that ignored updating() would have saved by now
        self.assertNotIn(11, self.s.generations())
        self.assertNotIn(12, self.s.generations())
        self.buf[:] = pattern(len(self.buf), 12)
        self.s.consistent(12)
        self.wait_log("JIT save of step 12 committed")
        self.check_restores(12)

    def test_gives_up(self):
        self.s.watch_failures(wait=0.15, log=self.lines.append)
        self.step(10)
        self.assertTrue(self.s.save(10).wait(timeout=30))
        self.s.updating()  # blocked in the update's own collective, for good
        self.notify("n3")
        self.wait_log("did not reach a consistent step")
        self.assertEqual(self.s.generations(), [10])

    def test_updating_waits_for_the_flush_copy(self):
        self.s.hint_idle(0)  # the copier copies only when hurried
        self.step(7)
        result = []
        t = threading.Thread(target=lambda: result.append(self.s.flush("test", timeout=30)))
        t.start()
        self.s.updating()
        self.buf[:] = pattern(len(self.buf), 8)  # would tear step 7 if its copy still ran
        self.s.consistent(8)
        t.join(30)
        self.assertEqual(len(result), 1)
        step, saved = result[0]
        self.assertTrue(saved)
        self.check_restores(step)

    def test_no_duplicate(self):
        self.s.watch_failures(log=self.lines.append)
        self.step(15)
        self.notify("n4")
        self.wait_log("JIT save of step 15 committed")
        h = self.s.save(15)  # the trainer's every-5 save of the flushed step
        self.assertTrue(h.wait(timeout=30))
        self.assertIs(h, self.s._jit_handle, "the trainer's save of the flushed step saved again")
        self.notify("n5")
        self.wait_log("step 15 is already saved")
        self.assertEqual(self.log().count("JIT save of step"), 1, self.log())
        # After an update the same step number is a new save, not the flush's.
        self.step(15)
        h2 = self.s.save(15)
        self.assertTrue(h2.wait(timeout=30))
        self.assertIsNot(h2, h)
        self.assertGreater(h2.seq, h.seq)

    def test_sigterm(self):
        """A process blocked outside Python (as in a collective) gets
        SIGTERM: it saves its consistent step, then dies of the signal."""
        child = textwrap.dedent("""
            import ctypes, sys, time
            sys.path.insert(0, %r)
            import reft
            from common import pattern
            s = reft.Session(socket_path=%r, rank=0, world=1)
            buf = bytearray(64 << 10)
            s.register("state", buf)
            s.flush_on_signal(timeout=3)
            for n in range(1, 14):
                s.updating()
                buf[:] = pattern(len(buf), n)
                s.consistent(n)
                if n %% 5 == 0:
                    s.save(n).wait()
            print("ready", flush=True)
            while True:  # blocked in C, as in a collective (which retries after EINTR)
                ctypes.CDLL(None).sleep(60)
        """) % (HERE, self.agent.path)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
        p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        self.addCleanup(p.kill)
        self.assertEqual(p.stdout.readline().strip(), b"ready", p.stderr.read1(4096) if p.poll() else b"")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, -signal.SIGTERM, err.decode())
        self.assertIn(b"JIT save of step 13 committed", err)
        self.assertIn(b"signal SIGTERM", err)
        self.check_restores(13)


if __name__ == "__main__":
    unittest.main()
