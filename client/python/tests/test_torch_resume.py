"""A trainer with dropout, an LR scheduler with state, a shuffled sampler
and Python-level randomness resumes bit-identical through reft.torch with
no glue beyond passing those objects (Checkpointer(extra=...); the RNG
states are snapshotted by default).

    cd client/python && /usr/bin/python3 -m unittest tests.test_torch_resume -v
"""

import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_torch  # noqa: E402
from test_torch import TorchCase, needs_torch, raw, torch  # noqa: E402

import reft  # noqa: E402

if torch is not None:
    import torch.nn.functional as F

    from reft.torch import Checkpointer


def setUpModule():
    test_torch.setUpModule()


def tearDownModule():
    test_torch.tearDownModule()


class ShuffledSampler:
    """A sampler that reshuffles every epoch from its own generator and
    knows its position: the state a data loader must resume from."""

    def __init__(self, n, seed):
        self.n, self.g = n, torch.Generator().manual_seed(seed)
        self.epoch, self.pos = 0, 0
        self.perm = torch.randperm(n, generator=self.g)

    def take(self, k):
        out = []
        for _ in range(k):
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self.perm = torch.randperm(self.n, generator=self.g)
            out.append(int(self.perm[self.pos]))
            self.pos += 1
        return out

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos, "perm": self.perm.clone(), "g": self.g.get_state()}

    def load_state_dict(self, st):
        self.epoch, self.pos, self.perm = st["epoch"], st["pos"], st["perm"].clone()
        self.g.set_state(st["g"])


DATA_X = None


def trainer(seed):
    global DATA_X
    if DATA_X is None:
        g = torch.Generator().manual_seed(42)
        DATA_X = torch.randn(10, 8, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched, ShuffledSampler(10, seed)


def run(model, opt, sched, sampler, steps, ck=None):
    for step in steps:
        idx = sampler.take(4)
        x = DATA_X[idx] + 0.01 * random.random()  # Python-level randomness (augmentation)
        opt.zero_grad()
        F.mse_loss(model(x), torch.ones(4, 2)).backward()
        opt.step()
        sched.step()
        if ck is not None:
            ck.save(step)


def fingerprint(model, opt, sched, sampler):
    return ([raw(p) for p in model.parameters()], repr(sched.state_dict()), sampler.pos, sampler.epoch,
            raw(sampler.perm), torch.rand(3).tolist(), random.random())


@needs_torch
class TestResume(TorchCase):
    def resumed(self, agent, extra=True, rng=True):
        random.seed(7)
        torch.manual_seed(7)
        model, opt, sched, sampler = trainer(1)
        ck = self.checkpointer(model, opt, agent, jit=False, rng=rng,
                               extra={"sched": sched, "sampler": sampler} if extra else None)
        run(model, opt, sched, sampler, range(1, 7), ck)
        ck.close()
        # A new process' trainer: other seeds everywhere, then restore.
        random.seed(99)
        torch.manual_seed(99)
        model, opt, sched, sampler = trainer(2)
        ck = self.checkpointer(model, opt, agent, jit=False, rng=rng,
                               extra={"sched": sched, "sampler": sampler} if extra else None)
        self.assertEqual(ck.restore(), 6)
        run(model, opt, sched, sampler, range(7, 13), ck)
        ck.wait()
        return fingerprint(model, opt, sched, sampler)

    def uninterrupted(self):
        random.seed(7)
        torch.manual_seed(7)
        model, opt, sched, sampler = trainer(1)
        run(model, opt, sched, sampler, range(1, 13))
        return fingerprint(model, opt, sched, sampler)

    def test_resumed_trainer_is_bit_identical(self):
        want = self.uninterrupted()
        got = self.resumed(self.agent())
        self.assertEqual(got, want)

    def test_without_the_extra_state_it_is_not(self):
        """The test above has teeth: without the scheduler, sampler and RNG
        states the resumed run differs."""
        want = self.uninterrupted()
        got = self.resumed(self.agent(), extra=False, rng=False)
        self.assertNotEqual(got[0], want[0])

    def test_compiled_module_names_match_the_plain_ones(self):
        """torch.compile wraps a model in an OptimizedModule whose
        parameters are named "_orig_mod.<name>" (torch 2.x); the wrapper
        here is built by hand (torch 1.13 has no torch.compile) and the GPU
        script (tests/gpu) checks the real one. A snapshot of the wrapped
        model restores into the plain one."""
        agent = self.agent()
        model, opt, _, _ = trainer(1)
        wrapped = torch.nn.Module()
        wrapped._orig_mod = model
        self.assertTrue(all(n.startswith("_orig_mod.") for n, _ in wrapped.named_parameters()))
        ck = self.checkpointer(wrapped, opt, agent, jit=False)
        want = [raw(p) for p in model.parameters()]
        ck.save(1).wait()
        ck.close()
        plain, opt2, _, _ = trainer(2)
        ck2 = self.checkpointer(plain, opt2, agent, jit=False)
        self.assertEqual(ck2.restore(), 1)
        self.assertEqual([raw(p) for p in plain.parameters()], want)

    def test_extra_must_be_stateful(self):
        model, opt, _, _ = trainer(1)
        with self.assertRaisesRegex(reft.Error, "extra must be a dict of name -> object with state_dict"):
            Checkpointer(model, opt, session=self.session(self.agent()), extra={"x": object()})

    def test_state_that_outgrows_its_room_is_refused(self):
        class Growing:
            def __init__(self):
                self.data = b""

            def state_dict(self):
                return {"data": self.data}

            def load_state_dict(self, st):
                self.data = st["data"]

        g = Growing()
        model, opt, _, _ = trainer(1)
        ck = self.checkpointer(model, opt, self.agent(), extra={"g": g})
        ck.save(1).wait()
        g.data = b"x" * (1 << 20)
        with self.assertRaisesRegex(reft.Error, r"the state of 'g' \(Growing\) grew to \d+ bytes"):
            ck.save(2)


if __name__ == "__main__":
    unittest.main()
