"""The conformance runner itself, driven against tests/fakeagent.py. This
checks the runner (that it runs every case and reports failures); the
client's conformance against the real agent is test_conformance_agent.py."""

import contextlib
import copy
import io
import os
import shlex
import sys
import unittest

from reft import conformance
from common import VECTORS, vectors

FAKE = "%s %s" % (shlex.quote(sys.executable),
                  shlex.quote(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakeagent.py")))


class Runner(unittest.TestCase):
    def test_fill_formula(self):
        def byte(i, s):
            return ((i * 2654435761 + s * 40503) % 2**32) >> 13 & 0xFF
        for seed in (0, 1, 99, 70000):
            self.assertEqual(conformance.fill_bytes(300, seed), bytes(byte(i, seed) for i in range(300)))

    def test_every_case_runs(self):
        v = vectors()
        out = io.StringIO()
        self.assertEqual(conformance.run(v, FAKE, out=out), 0, out.getvalue())
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), len(v["frames"]) + len(v["bad_frames"]) + len(v["scenarios"]))
        self.assertTrue(all(l.startswith("PASS ") for l in lines), out.getvalue())

    def test_failures_are_reported(self):
        v = vectors()
        bad = copy.deepcopy(v)
        bad["frames"][0]["hex"] = "00"
        bad["bad_frames"][0]["error"] = "flags"
        sc = next(s for s in bad["scenarios"] if s["name"] == "save, scribble, restore")
        next(o for o in sc["ops"] if o["op"] == "check")["seed"] = 5
        sc = next(s for s in bad["scenarios"] if s["name"] == "restore of an unknown step")
        sc["ops"][-1]["error"] = "corrupt"
        sc = next(s for s in bad["scenarios"] if s["name"] == "nothing to restore")
        sc["ops"][1]["expect"] = 3
        out = io.StringIO()
        self.assertEqual(conformance.run(bad, FAKE, out=out), 5, out.getvalue())
        fails = [l for l in out.getvalue().splitlines() if l.startswith("FAIL ")]
        self.assertEqual(len(fails), 5, out.getvalue())
        self.assertTrue(any("want agent error corrupt, got" in l and "not_found" in l for l in fails), fails)
        self.assertTrue(any("differs from fill(5)" in l for l in fails), fails)

    def test_agent_command_that_prints_nothing(self):
        v = {"scenarios": vectors()["scenarios"][:1]}
        out = io.StringIO()
        self.assertEqual(conformance.run(v, "true", out=out), 1)
        self.assertIn("before printing a socket path", out.getvalue())

    def test_cli(self):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            self.assertEqual(conformance.main(["--vectors", VECTORS, "--no-scenarios"]), 0)
            with self.assertRaises(SystemExit) as cm:
                conformance.main(["--vectors", VECTORS])
        self.assertEqual(cm.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
