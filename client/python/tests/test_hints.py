"""Hint mode: after the first hint_idle(), the copier copies only inside
announced windows, and everything at once when someone waits."""

import time
import unittest

from common import AgentCase, pattern


def _eventually(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Hints(AgentCase):
    def test_without_hints_the_copy_runs_on_its_own(self):
        s = self.session()
        s.register("w", pattern(10000, 1))
        h = s.save(1)
        self.assertTrue(_eventually(h.done))
        self.assertEqual(self.requests("commit"), [{"step": 1}])

    def test_no_copy_outside_a_window(self):
        s = self.session()
        buf = pattern(10000, 1)
        s.register("w", buf)
        s.hint_idle(0)  # hint mode, but the window is already over
        h = s.save(1)
        time.sleep(0.3)
        self.assertFalse(h.done())
        self.assertEqual(self.requests("commit"), [])
        # Nothing reached the arena either.
        arena = self.agent.ranks[0]
        with open("%s/%s" % (arena.dir, sorted(arena.writing)[0]), "rb") as f:
            self.assertEqual(f.read(10000), bytes(10000))
        t0 = time.monotonic()
        self.assertTrue(h.wait(timeout=5))  # waiting copies the rest at once
        self.assertLess(time.monotonic() - t0, 2)

    def test_a_window_lets_the_copy_finish(self):
        s = self.session()
        s.register("w", pattern(10000, 1))
        s.hint_idle(0)
        h = s.save(1)
        time.sleep(0.1)
        self.assertFalse(h.done())
        s.hint_idle(5000)
        self.assertTrue(_eventually(h.done, 4))
        self.assertTrue(h.wait())

    def test_the_copy_stops_when_the_window_ends(self):
        # 32768 chunks take far longer than the 5 ms window.
        s = self.session(chunk_size=1024)
        s.register("w", bytearray(32 << 20))
        s.hint_idle(5)
        h = s.save(1)
        time.sleep(0.5)
        self.assertFalse(h.done())
        self.assertTrue(h.wait(timeout=30))

    def test_next_save_and_close_hurry_the_pending_one(self):
        s = self.session()
        s.register("w", pattern(1000, 1))
        s.hint_idle(0)
        h1 = s.save(1)
        h2 = s.save(2)
        self.assertTrue(h1.done())
        self.assertFalse(h2.done())
        s.close()
        self.assertTrue(h2.done())
        self.assertEqual([p["step"] for p in self.requests("commit")], [1, 2])

    def test_bad_hint(self):
        import reft
        s = self.session()
        for bad in (-1, "5", None, float("nan")):
            with self.subTest(bad), self.assertRaises(reft.Error):
                s.hint_idle(bad)


if __name__ == "__main__":
    unittest.main()
