"""A session is the parent's: in a forked child (DataLoader worker) every
method raises at once, without touching a lock or thread, and the parent's
session goes on working."""

import os
import select
import signal
import unittest

import reft
from common import AgentCase, pattern


class ForkSafety(AgentCase):
    def _in_child(self, fn, timeout=10):
        """Run fn in a forked child; return what it wrote (or fail on a hang)."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: report, then leave without cleanup handlers
            os.close(r)
            try:
                out = fn()
            except BaseException as e:  # noqa: BLE001
                out = "child crashed: %r" % e
            os.write(w, out.encode())
            os._exit(0)
        os.close(w)
        try:
            if not select.select([r], [], [], timeout)[0]:
                os.kill(pid, signal.SIGKILL)
                self.fail("the child hung (a lock inherited from the parent?)")
            out = b""
            while True:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                out += chunk
            return out.decode()
        finally:
            os.close(r)
            os.waitpid(pid, 0)

    def test_child_methods_raise_and_parent_goes_on(self):
        s = self.session()
        buf = pattern(5000, 1)
        s.register("w", buf)
        s.save(1).wait()
        s.hint_idle(0)
        pending = s.save(2)  # a copier thread is parked in the parent
        # Hold the session's locks across the fork, as a busy parent might.
        s._op_lock.acquire()
        s._conn._lock.acquire()
        try:
            def child():
                calls = {
                    "save": lambda: s.save(3), "restore": s.restore, "restore_step": lambda: s.restore(step=1),
                    "generations": s.generations, "register": lambda: s.register("x", bytearray(1)),
                    "hint_idle": lambda: s.hint_idle(10), "status": s.status, "close": s.close,
                    "enter": s.__enter__, "wait": pending.wait, "done": pending.done,
                }
                lines = []
                for name, call in calls.items():
                    try:
                        call()
                        lines.append("%s: no error" % name)
                    except reft.Error as e:
                        ok = "belongs to process %d" % os.getppid() in str(e) and "forked child" in str(e)
                        lines.append("%s: %s" % (name, "ok" if ok else str(e)))
                return "\n".join(lines)

            out = self._in_child(child)
        finally:
            s._conn._lock.release()
            s._op_lock.release()
        for line in out.splitlines():
            self.assertTrue(line.endswith(": ok"), out)
        self.assertEqual(len(out.splitlines()), 11, out)
        # The parent is unaffected.
        self.assertTrue(pending.wait(timeout=5))
        buf[:] = bytes(5000)
        self.assertEqual(s.restore(), 2)
        self.assertEqual(buf, pattern(5000, 1))
        s.close()

    def test_at_fork_hook_marks_the_child(self):
        s = self.session()
        out = self._in_child(lambda: str(s._forked))
        self.assertEqual(out, "True")
        self.assertFalse(s._forked)

    def test_child_exit_leaves_the_parent_connected(self):
        s = self.session()
        s.register("w", bytearray(10))
        s.hint_idle(0)
        pending = s.save(1)

        def child():
            # What a child's exit does: the atexit hook (which must skip the
            # parent's sessions) and the kernel closing the child's fds.
            reft.session._close_at_exit()
            os.close(s._conn._sock.fileno())
            return "done"

        self.assertEqual(self._in_child(child), "done")
        self.assertFalse(pending.done())  # the child did not finish or abort it
        self.assertTrue(pending.wait(timeout=5))
        self.assertEqual(s.generations(), [1])


if __name__ == "__main__":
    unittest.main()
