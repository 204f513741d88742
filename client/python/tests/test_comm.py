"""comm_phase(): a notice per change of phase, never answered, never waiting
for a request in flight."""

import time
import unittest

from common import AgentCase, pattern


class CommPhase(AgentCase):
    agent_options = {"commit_delay": 2.0}

    def comm_log(self):
        with self.agent.lock:
            return [p["active"] for name, p in self.agent.log if name == "comm"]

    def test_one_notice_per_change(self):
        s = self.session()
        s.register("w", pattern(100, 1))
        for active in (True, True, False, False, True):
            s.comm_phase(active)
        # A request after the notices gets its own reply: none was answered.
        self.assertEqual(s.generations(), [])
        self.assertEqual(self.comm_log(), [True, False, True])

    def test_does_not_wait_for_a_request_in_flight(self):
        s = self.session()
        s.register("w", pattern(10000, 1))
        h = s.save(1)
        deadline = time.monotonic() + 10
        while not self.requests("commit"):  # the copier's commit is in flight
            self.assertLess(time.monotonic(), deadline, "the copier never sent its commit")
            time.sleep(0.005)
        s.comm_phase(True)
        self.assertFalse(h.done(), "comm_phase returned only after the commit's reply")
        h.wait()
        # The agent reads the notice after answering the commit.
        deadline = time.monotonic() + 10
        while not self.comm_log() and time.monotonic() < deadline:
            time.sleep(0.005)
        self.assertEqual(self.comm_log(), [True])

    def test_named_collective(self):
        s = self.session()
        s.register("w", pattern(100, 1))
        s.comm_phase(True, "gradient all-reduce")
        s.comm_phase(False)
        self.assertEqual(s.generations(), [])
        with self.agent.lock:
            got = [p for name, p in self.agent.log if name == "comm"]
        self.assertEqual(got, [{"active": True, "op": "gradient all-reduce"}, {"active": False}])

    def test_bad_op_is_refused_and_not_sent(self):
        s = self.session()
        s.register("w", pattern(100, 1))
        for op, cause in (("x" * 97, "longer than 96"), ("a\nforged", "unprintable character at character 1"),
                          (b"allreduce", "is not a str")):
            with self.assertRaisesRegex(ValueError, cause):
                s.comm_phase(True, op)
        self.assertEqual(s.generations(), [])
        self.assertEqual(self.comm_log(), [])

    def test_disabled_session_does_nothing(self):
        s = self.session(socket_path=None, optional=True)
        s.comm_phase(True)
        self.assertEqual(self.comm_log(), [])


if __name__ == "__main__":
    unittest.main()
