"""The rank maps only its own regular arena file, never through a symlink
(issue 14, finding 7): whatever else sits at the path the agent names is
refused at once with a message."""

import os
import tempfile
import threading
import unittest

from reft._arena import ArenaCache
from reft._errors import Error


def _symlink(d, p):
    other = os.path.join(d, "other")
    with open(other, "wb") as f:
        f.write(bytes(8192))
    os.symlink(other, p)


def _fifo(d, p):
    os.mkfifo(p, 0o600)


def _foreign(d, p):
    with open(p, "wb") as f:
        f.write(bytes(8192))
    os.chown(p, 4242, 4242)


class PlantedArena(unittest.TestCase):
    CASES = [
        ("symlink to another file", _symlink, False, "symlink"),
        ("FIFO", _fifo, False, "not a regular file"),
        ("another user's file", _foreign, True, "not a regular file of this user"),
    ]

    def test_refused(self):
        for name, plant, needs_root, want in self.CASES:
            for writable in (False, True):
                with self.subTest(name, writable=writable):
                    if needs_root and os.geteuid() != 0:
                        self.skipTest("needs root to give a file to another uid")
                    with tempfile.TemporaryDirectory() as d:
                        p = os.path.join(d, "arena-0")
                        plant(d, p)
                        out = {}

                        def get():
                            try:
                                ArenaCache().get(p, 4096, writable)
                                out["err"] = None
                            except Error as e:
                                out["err"] = e

                        t = threading.Thread(target=get, daemon=True)
                        t.start()
                        t.join(5)
                        self.assertFalse(t.is_alive(), "mapping blocked on the planted file")
                        self.assertIsNotNone(out["err"], "the planted file was mapped")
                        self.assertIn(want, str(out["err"]))

    def test_own_file_maps(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "arena-0")
            with open(p, "wb") as f:
                f.write(bytes(8192))
            c = ArenaCache()
            m = c.get(p, 4096, True)
            self.assertEqual(m.size, 4096)
            c.close()


if __name__ == "__main__":
    unittest.main()
