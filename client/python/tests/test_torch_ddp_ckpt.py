"""examples/torch_ddp.py --ckpt-dir, the goodput benchmark's status quo
(torch.save to a shared directory every N steps, resume from the newest):
a run killed after its checkpoint of step 6 resumes from it and ends with
the uninterrupted run's bits (momentum and AdamW state); only the two newest
checkpoints are kept.

    cd client/python && /usr/bin/python3 -m unittest tests.test_torch_ddp_ckpt -v
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_torch import needs_torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "examples", "torch_ddp.py")
HASH = re.compile(r"^final-params-sha256: ([0-9a-f]{64})$", re.M)


def train(*flags):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."), PYTHONDONTWRITEBYTECODE="1")
    for k in ("REFT_AGENT_SOCKET", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(k, None)  # one rank, no reft
    return subprocess.run([sys.executable, SCRIPT, "--steps", "10", "--log-every", "5", "--seed", "3"] + list(flags),
                          env=env, capture_output=True, text=True, timeout=300)


@needs_torch
class TorchDDPFileCheckpoint(unittest.TestCase):
    def test_killed_run_resumes_from_newest_checkpoint(self):
        for opt in ("momentum", "adamw"):  # a momentum buffer; Adam's moments and step
            with self.subTest(optimizer=opt), tempfile.TemporaryDirectory() as d:
                ref = train("--optimizer", opt)
                self.assertEqual(ref.returncode, 0, ref.stderr)
                want = HASH.findall(ref.stdout)
                ck = ["--optimizer", opt, "--ckpt-dir", d, "--save-every", "3", "--fail-at", "8:0"]
                first = train(*ck)
                self.assertEqual(first.returncode, -9, "--fail-at 8:0 must SIGKILL the run:\n" + first.stderr)
                self.assertIn("checkpoint step 6: ", first.stdout)
                second = train(*ck)
                self.assertEqual(second.returncode, 0, second.stderr)
                self.assertIn("resumed from step 6\n", second.stdout)
                self.assertEqual(HASH.findall(second.stdout), want, second.stdout)
                self.assertRegex(second.stdout, r"save-blocked-ms: [0-9.]+ per save, 1 saves")
                self.assertEqual(sorted(os.listdir(d)), ["ckpt-000000006.pt", "ckpt-000000009.pt"])


if __name__ == "__main__":
    unittest.main()
