"""The client talks only to an agent of its own uid (issue 14, finding 7)."""

import os
import socket
import tempfile
import threading
import unittest

import reft
from reft import _wire as W


class AgentUID(unittest.TestCase):
    def serve(self):
        """A listening socket of this process's uid, recording what it
        receives."""
        d = tempfile.mkdtemp()
        path = os.path.join(d, "agent.sock")
        ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ln.bind(path)
        ln.listen(1)
        got = []

        def accept():
            c, _ = ln.accept()
            c.settimeout(5)
            data = b""
            try:
                while True:
                    b = c.recv(4096)
                    if not b:
                        break
                    data += b
            finally:
                c.close()
                got.append(data)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        self.addCleanup(ln.close)
        return path, t, got

    def test_uid_check(self):
        cases = [("same uid", os.getuid, True),
                 ("agent of another uid", lambda: os.getuid() + 1, False)]
        for name, uid, allow in cases:
            with self.subTest(name):
                path, t, got = self.serve()
                saved = W.own_uid
                W.own_uid = uid
                try:
                    if allow:
                        W.Connection(path).close()
                        continue
                    with self.assertRaisesRegex(reft.Error, r"served by uid \d+ .* refusing to talk to it"):
                        W.Connection(path)
                finally:
                    W.own_uid = saved
                t.join(5)
                self.assertEqual(got, [b""], "the other user's socket received bytes")


if __name__ == "__main__":
    unittest.main()
