"""reft.undo.UpdateUndo: undo of an interrupted optimizer.step() for torch's
SGD, Adam and AdamW, bit for bit; and its JIT flush wiring in
reft.torch.Checkpointer(undo=True) against the real agent
(tests/conformance-agent).

    cd client/python && /usr/bin/python3 -m unittest tests.test_undo -v
"""

import os
import sys
import threading
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))
sys.path.insert(0, HERE)

from test_torch import torch, needs_torch, TorchCase, state, setUpModule, tearDownModule  # noqa: E402,F401

if torch is not None:
    import torch.nn.functional as F
    from reft.undo import UpdateUndo, UndoUnsupported, UpdateInterrupted, check_undoable
    from reft.torch import Checkpointer
    import reft

# Every optimizer configuration undo supports (PyTorch's expressions of each
# option are inverted separately).
SUPPORTED = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd-wd": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=1e-2),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-momentum-wd-dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1,
                                                           weight_decay=1e-2),
    "sgd-nesterov-wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "sgd-maximize": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, maximize=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-wd": lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-2),
    "adam-maximize": lambda p: torch.optim.Adam(p, lr=1e-3, maximize=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adamw-betas": lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.8, 0.99), eps=1e-6),
}


def model_of(seed, dtype=None):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                            torch.nn.Tanh(), torch.nn.Linear(64, 8))
    return m.to(dtype) if dtype is not None else m


def batch(step, dtype=torch.float32 if torch is not None else None):
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(16, 32, generator=g)
    return x.to(dtype), torch.sin(x[:, :8]).to(dtype)


def grads(model, step):
    x, y = batch(step, next(model.parameters()).dtype)
    for p in model.parameters():
        p.grad = None
    ((model(x) - y) ** 2).mean().backward()  # mse_loss has no bfloat16 CPU kernel in torch 1.13


def bits_state(model, opt):
    """Every bit of parameters and optimizer state (state() of test_torch,
    without the param_groups, which undo does not touch)."""
    s = state(model, opt)
    s.pop("param_groups")
    return s


class SameBits:
    def assertSameBits(self, got, want):
        """Bit states equal; on a difference, name the keys (a diff of the
        bytes would take minutes)."""
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        if bad:
            self.fail("these differ: %s" % ", ".join(bad))


@needs_torch
class Undo(SameBits, unittest.TestCase):
    def run_steps(self, name, steps, dtype=None, undo=True):
        model = model_of(1, dtype)
        opt = SUPPORTED[name](model.parameters())
        u = None
        if undo:
            u = UpdateUndo(opt, measure=True)
            u.install()
        for s in range(1, steps + 1):
            grads(model, s)
            opt.step()
        return model, opt, u

    def test_same_bits_as_torch(self):
        """Stepping tensor by tensor with undo recorded gives torch's own
        step's bits."""
        for name in SUPPORTED:
            with self.subTest(name):
                a = self.run_steps(name, 5, undo=False)
                b = self.run_steps(name, 5, undo=True)
                self.assertSameBits(bits_state(*a[:2]), bits_state(*b[:2]))

    def test_interrupted_at_every_tensor(self):
        """Table: every optimizer, a failure before tensor k of step 6 for
        every k (k = all: after the last, before the step returns), and at
        the first step (state created by it): the bits of step 5 (or the
        initial state) come back, and the next step is torch's."""
        for name in SUPPORTED:
            for at_step in (1, 6):
                model, opt, u = self.run_steps(name, at_step - 1)
                grads(model, at_step)
                before = bits_state(model, opt)
                n = len(list(model.parameters()))
                for k in range(n + 1):
                    with self.subTest(name=name, step=at_step, fail_before=k):
                        def boom(i, k=k):
                            if i == k:
                                raise RuntimeError("injected at %d" % i)
                        u.before_tensor = boom
                        with self.assertRaisesRegex(RuntimeError, "injected at %d" % k):
                            opt.step()
                        self.assertSameBits(bits_state(model, opt), before)
                u.before_tensor = None
                opt.step()
                ref_model, ref_opt, _ = self.run_steps(name, at_step, undo=False)
                self.assertSameBits(bits_state(model, opt), bits_state(ref_model, ref_opt))

    def test_exactness_measured(self):
        """The inverse alone (without the kept corrections) and what the
        corrections cost, on real steps; the undo itself is exact (bound 0)."""
        for name in SUPPORTED:
            for dtype in (torch.float32, torch.float64, torch.bfloat16):
                with self.subTest(name=name, dtype=dtype):
                    model, opt, u = self.run_steps(name, 20, dtype=dtype)
                    grads(model, 21)
                    before = bits_state(model, opt)

                    def boom(i):
                        if i == 6:
                            raise RuntimeError("after the last tensor")
                    u.before_tensor = boom
                    with self.assertRaises(RuntimeError):
                        opt.step()
                    self.assertSameBits(bits_state(model, opt), before)
                    u.before_tensor = None
                    opt.step()
                    st = u.stats
                    n = st["elements"]
                    elt = next(model.parameters()).element_size()
                    copy = n * elt * (1 + len([k for k in opt.state[next(model.parameters())]
                                                if k != "step" and torch.is_tensor(opt.state[next(model.parameters())][k])]))
                    print("undo %-26s %-14s %6d elements: inverse alone differs in p %5.2f%% m %5.2f%% v %5.2f%%, "
                          "max |diff| %.3g; corrections %6d B = %.2f of a copy of p and state"
                          % (name, str(dtype).replace("torch.", ""), n, 100 * st.get("p", 0) / n,
                             100 * st.get("momentum_buffer", st.get("exp_avg", 0)) / n,
                             100 * st.get("exp_avg_sq", 0) / n, st.get("max_abs", 0.0), st["bytes"],
                             st["bytes"] / copy), file=sys.stderr)
                    # The inverse is off by rounding only: a relative error
                    # within a few units of the dtype's precision times the
                    # update's magnitude, far below the values themselves.
                    self.assertLess(st.get("max_abs", 0.0), 1e-2)
                    # The corrections cost less than the copy a snapshot takes.
                    self.assertLess(st["bytes"], copy)

    def test_refused(self):
        """Optimizers undo cannot invert are refused, naming why."""
        p = [torch.nn.Parameter(torch.zeros(3))]
        for opt, want in [
            (torch.optim.Adam(p, amsgrad=True), "amsgrad=True"),
            (torch.optim.AdamW(p, amsgrad=True), "amsgrad=True"),
            (torch.optim.RMSprop(p), "RMSprop cannot be undone"),
            (torch.optim.Adagrad(p), "Adagrad cannot be undone"),
            (torch.optim.AdamW(p, lr=1.0, weight_decay=1.0), "lr\\*weight_decay = 1"),
            (torch.optim.SGD(p, lr=0.5, weight_decay=2.0), "lr\\*weight_decay = 1"),
            (torch.optim.SGD(p, lr=0.1, differentiable=True), "differentiable=True"),
            (torch.optim.SGD([torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))], lr=0.1), "complex"),
        ]:
            with self.subTest(type(opt).__name__ + " " + want):
                with self.assertRaisesRegex(UndoUnsupported, want):
                    check_undoable(opt)
        for name, make in SUPPORTED.items():
            with self.subTest(name):
                check_undoable(make(p))

    def test_stop_request(self):
        """request_stop() from another thread stops the step at the next
        tensor boundary with UpdateInterrupted, the applied part undone."""
        model, opt, u = self.run_steps("adamw", 3)
        grads(model, 4)
        before = bits_state(model, opt)
        undone = []
        u.on_undone = lambda n, cause: undone.append((n, type(cause)))

        def ask(i):
            if i == 2:
                t = threading.Thread(target=u.request_stop)
                t.start()
                t.join()
        u.before_tensor = ask
        with self.assertRaises(UpdateInterrupted):
            opt.step()
        self.assertEqual(undone, [(2, UpdateInterrupted)])
        self.assertSameBits(bits_state(model, opt), before)
        u.before_tensor = None
        opt.step()  # the request was used up
        self.assertEqual(u.stats["elements"], sum(p.numel() for p in model.parameters()))


@needs_torch
class CheckpointerUndo(SameBits, TorchCase):
    def test_flush_mid_step_saves_previous_step(self):
        """save every 0 (consistent() only): a JIT flush that finds the
        trainer inside optimizer.step() has it undo the applied tensors,
        saves the previous step, and a run restored from that ends
        bit-identical to an uninterrupted one."""
        for name in ("sgd-nesterov-wd", "adam", "adamw"):
            with self.subTest(name):
                agent = self.agent()
                model = model_of(3)
                opt = SUPPORTED[name](model.parameters())
                ck = self.checkpointer(model, opt, agent, undo=True, jit=False)
                for s in range(1, 5):
                    grads(model, s)
                    opt.step()
                    ck.consistent(s)
                want = bits_state(model, opt)
                flushed = []

                def flush():
                    try:
                        flushed.append(ck.session.flush("test", timeout=30))
                    except BaseException as e:  # the assertion below shows it
                        flushed.append(e)

                def flush_now(i):
                    if i == 3:  # three tensors updated: the state is torn
                        t = threading.Thread(target=flush)
                        t.start()
                        # The flush asks for the stop; the step honours it
                        # at the next tensor boundary.
                        self.assertTrue(ck._undo._stop.wait(30) or flushed, "the flush never asked to stop")
                        self.flusher = t
                ck._undo.before_tensor = flush_now
                grads(model, 5)
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    with self.assertRaises(UpdateInterrupted):
                        opt.step()
                self.flusher.join()
                self.assertEqual(flushed, [(4, True)])
                self.assertTrue(any("undid the update of 3 parameter tensors" in str(x.message) for x in w),
                                [str(x.message) for x in w])
                self.assertSameBits(bits_state(model, opt), want)
                ck.close()

                # A replacement restores the flushed step 4 and trains on.
                model2 = model_of(99)
                opt2 = SUPPORTED[name](model2.parameters())
                ck2 = self.checkpointer(model2, opt2, agent, undo=True, jit=False)
                self.assertEqual(ck2.restore(), 4)
                self.assertSameBits(bits_state(model2, opt2), want)
                for s in range(5, 8):
                    grads(model2, s)
                    opt2.step()
                ref = model_of(3)
                ref_opt = SUPPORTED[name](ref.parameters())
                for s in range(1, 8):
                    grads(ref, s)
                    ref_opt.step()
                self.assertSameBits(bits_state(model2, opt2), bits_state(ref, ref_opt))


@needs_torch
class CheckpointerEvery0(SameBits, TorchCase):
    def test_every0(self):
        """--reft=arc,every=0: save() keeps nothing (a progress heartbeat,
        said once), a JIT flush that finds the trainer inside
        optimizer.step() has it undo and saves the previous step, which a
        replacement restores; without undo the Checkpointer warns, with
        jit=False it refuses."""
        agent = self.agent("arc,every=0")
        model = model_of(3)
        opt = SUPPORTED["adam"](model.parameters())
        with self.assertRaisesRegex(reft.Error, r"jit=False\) under --reft=\.\.\.,every=0"):
            Checkpointer(model, opt, session=self.session(agent), jit=False, undo=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.checkpointer(model, opt, agent).close()
        self.assertEqual([str(x.message).count("every=0 without undo=True") for x in w], [1])

        ck = self.checkpointer(model, opt, agent, undo=True)
        self.assertEqual(ck.session.every, 0)
        lines = []
        ck.session._log = lines.append
        for s in range(1, 5):
            grads(model, s)
            opt.step()
            ck.save(s).wait(30)
        self.assertEqual(ck.generations(), [])
        self.assertEqual(sum("every=0" in x for x in lines), 1, lines)
        want = bits_state(model, opt)
        flushed = []

        def flush_now(i):
            if i == 2:  # two tensors updated: the state is torn
                t = threading.Thread(target=lambda: flushed.append(ck.session.flush("test", timeout=30)))
                t.start()
                self.assertTrue(ck._undo._stop.wait(30), "the flush never asked to stop")
                self.flusher = t
        ck._undo.before_tensor = flush_now
        grads(model, 5)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with self.assertRaises(UpdateInterrupted):
                opt.step()
        self.flusher.join()
        self.assertEqual(flushed, [(4, True)])
        self.assertSameBits(bits_state(model, opt), want)
        ck.close()

        model2 = model_of(99)
        opt2 = SUPPORTED["adam"](model2.parameters())
        ck2 = self.checkpointer(model2, opt2, agent, undo=True)
        self.assertEqual(ck2.restore(), 4)
        self.assertSameBits(bits_state(model2, opt2), want)


if __name__ == "__main__":
    unittest.main()
