"""reft.torch's snapshot path on its CPU streams (reft._streams.CpuStreams),
the CPU twin of the CUDA path (CudaStreams runs in tests/gpu): ordering,
fencing and failure handling against the real agent.

    cd client/python && /usr/bin/python3 -m unittest tests.test_torch_streams -v
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_torch  # noqa: E402
from test_torch import PYROOT, TorchCase, batch, make, needs_torch, state, torch, train  # noqa: E402

import reft  # noqa: E402

if torch is not None:
    import torch.nn.functional as F

    from reft._streams import CpuStreams
    from reft.torch import Checkpointer


def setUpModule():
    test_torch.setUpModule()  # builds (or finds) the agent


def tearDownModule():
    test_torch.tearDownModule()


class Gate:
    """A before_copy hook: holds the copy stream at job ``hold`` (of the
    saves after ``skip`` copies) until open(); fail=True raises there."""

    def __init__(self, hold=0, skip=0, fail=False):
        self.hold, self.skip, self.fail = hold, skip, fail
        self.reached = threading.Event()
        self._open = threading.Event()
        self.copies = 0

    def __call__(self, i):
        if i == 0:
            self.copies += 1
        if self.copies <= self.skip or i != self.hold:
            return
        self.reached.set()
        if self.fail:
            raise OSError(5, "injected copy failure")
        self._open.wait(60)

    def open(self):
        self._open.set()


def flip(t):
    with torch.no_grad():
        t.add_(1)


@needs_torch
class TestStreams(TorchCase):
    def ck(self, model, opt, agent, gate):
        ck = self.checkpointer(model, opt, agent, streams=CpuStreams(gate))
        self.addCleanup(gate.open)
        return ck

    def test_failed_copy_raises_from_the_next_step_and_commits_nothing(self):
        agent = self.agent()
        model, opt = make("adamw")
        gate = Gate(hold=2, skip=1, fail=True)  # the second save's third tensor fails
        ck = self.ck(model, opt, agent, gate)
        train(model, opt, [1], ck)
        ck.wait()
        want = state(model, opt)
        train(model, opt, [2], ck)  # the save of step 2 fails in its copy
        self.assertTrue(gate.reached.wait(30))
        x, y = batch(3)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        with self.assertRaisesRegex(reft.Error, r"save\(2\).*injected copy failure"):
            opt.step()
        self.assertEqual(ck.generations(), [1])  # the failed save left nothing behind
        gate.fail = False
        gate.open()
        opt.step()  # the failure was reported once; training goes on
        ck.save(3).wait()
        self.assertEqual(ck.generations()[0], 3)
        self.assertNotIn(2, ck.generations())
        model2, opt2 = make("adamw", seed=9)
        ck2 = self.checkpointer(model2, opt2, agent)
        self.assertEqual(ck2.restore(), 3)
        self.assertSameState(state(model2, opt2), state(model, opt), "step 3 after a failed step 2")
        self.assertNotEqual(state(model, opt), want)

    def test_tensor_replaced_before_a_flush_is_refused(self):
        """consistent() checks the tensors; a JIT flush after it issues the
        copy itself and checks again: a parameter replaced in between fails
        the flush with the cause, not a snapshot of freed memory."""
        agent = self.agent()
        model, opt = make("sgd")
        ck = self.checkpointer(model, opt, agent)
        train(model, opt, [1], ck, save=False)
        ck.consistent(1)
        model[0].weight.data = model[0].weight.data.clone()
        with self.assertRaisesRegex(reft.Error, r"save\(1\).*param/0:0.weight was replaced"):
            ck.session.flush("test", timeout=30)
        self.assertEqual(ck.generations(), [])

    def test_save_before_the_previous_copy_finished_waits_for_it(self):
        agent = self.agent()
        model, opt = make("adam")
        gate = Gate(hold=1)
        ck = self.ck(model, opt, agent, gate)
        train(model, opt, [1], ck, save=False)
        at1 = state(model, opt)
        h1 = ck.save(1)
        self.assertTrue(gate.reached.wait(30))
        # Parameters changed outside optimizer.step() are the caller's
        # business; the second save must not start copying before the
        # first copy ended and committed.
        got = []
        t = threading.Thread(target=lambda: got.append(ck.save(2)))
        t.start()
        t.join(0.2)
        self.assertTrue(t.is_alive(), "save(2) returned while save(1) was still copying")
        self.assertFalse(h1.done())
        gate.open()
        t.join(30)
        self.assertTrue(h1.wait(30))
        self.assertTrue(got[0].wait(30))
        gens = ck.generations()
        self.assertEqual((gens[0], 1 in gens), (2, True))
        model2, opt2 = make("adam", seed=3)
        ck2 = self.checkpointer(model2, opt2, agent)
        self.assertEqual(ck2.restore(), 2)
        self.assertSameState(state(model2, opt2), at1, "step 2 (the same state as step 1)")

    def test_dtypes_and_non_contiguous_tensors_round_trip(self):
        agent = self.agent()
        torch.manual_seed(4)
        model = torch.nn.Module()
        model.w32 = torch.nn.Parameter(torch.randn(5, 7).t())  # non-contiguous
        model.w16 = torch.nn.Parameter(torch.randn(3, 6, dtype=torch.float16)[:, ::2])  # strided
        model.wbf = torch.nn.Parameter(torch.randn(11, dtype=torch.bfloat16))
        model.register_buffer("count", torch.arange(9, dtype=torch.int64).view(3, 3).t())
        model.register_buffer("mask", torch.rand(13) > 0.5)
        model.register_buffer("i8", torch.randint(-100, 100, (6,), dtype=torch.int8))
        self.assertFalse(model.w32.is_contiguous())
        self.assertFalse(model.w16.is_contiguous())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ck = self.checkpointer(model, opt, agent)
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        want = {n: t.detach().clone() for n, t in tensors}
        strides = {n: t.stride() for n, t in tensors}
        ck.save(1).wait()
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                t.copy_(torch.zeros_like(t))
        self.assertEqual(ck.restore(), 1)
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            self.assertEqual(t.dtype, want[n].dtype, n)
            self.assertEqual(t.stride(), strides[n], n)  # restored in place
            self.assertTrue(torch.equal(t.detach(), want[n]), n)

    def test_rank_killed_mid_copy_leaves_the_previous_step(self):
        """A rank killed while its copy is half done: the agent drops the
        open save; a new process restores the step before, bit for bit."""
        agent = self.agent()
        code = textwrap.dedent("""
            import hashlib, sys, threading, torch, reft
            from reft._streams import CpuStreams
            from reft.torch import Checkpointer
            torch.manual_seed(0)
            m = torch.nn.Linear(64, 64); o = torch.optim.AdamW(m.parameters())
            hold = threading.Event()
            n = [0]
            def gate(i):
                if i == 0:
                    n[0] += 1
                if n[0] == 2 and i == 2:
                    print("mid-copy", flush=True)
                    hold.wait()
            s = reft.Session(socket_path=sys.argv[1], rank=0, world=1, local_rank=0)
            ck = Checkpointer(m, o, session=s, streams=CpuStreams(gate), jit=False)
            h = lambda: hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()
            for step in (1, 2):
                o.zero_grad(); m(torch.ones(3, 64) * step).sum().backward(); o.step()
                if step == 1:
                    ck.save(step).wait()
                    print("saved", h(), flush=True)
                else:
                    ck.save(step)
            threading.Event().wait()
        """)
        p = subprocess.Popen([sys.executable, "-c", code, agent.path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=PYROOT))
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        saved = p.stdout.readline().split()
        self.assertEqual(saved[0], "saved", p.stderr.read() if not saved else saved)
        self.assertEqual(p.stdout.readline().strip(), "mid-copy")
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        p.stdout.close()
        p.stderr.close()
        torch.manual_seed(5)
        m = torch.nn.Linear(64, 64)
        o = torch.optim.AdamW(m.parameters())
        ck = self.checkpointer(m, o, agent)
        self.assertEqual(ck.restore(), 1)
        import hashlib
        got = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()
        self.assertEqual(got, saved[1])


if __name__ == "__main__":
    unittest.main()
