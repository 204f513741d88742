"""reft.undo.UpdateUndo: undo of an interrupted optimizer.step() for torch's
SGD, Adam and AdamW, bit for bit; and its JIT flush wiring in
reft.torch.Checkpointer(undo=True) against the real agent
(tests/conformance-agent).

    cd client/python && /usr/bin/python3 -m unittest tests.test_undo -v
"""

import os
import re
import signal
import subprocess
import sys
import threading
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))
sys.path.insert(0, HERE)

from test_torch import torch, needs_torch, TorchCase, state, setUpModule, tearDownModule, REPO  # noqa: E402,F401

if torch is not None:
    import torch.nn.functional as F
    from reft.undo import KEEP, UpdateUndo, UndoUnsupported, UpdateInterrupted, check_undoable
    from reft.torch import Checkpointer
    import reft

# Every optimizer configuration undo supports (PyTorch's expressions of each
# option are inverted separately).
# UpdateUndo's chunk_elements in the tests -> the chunks a step of
# model_of's six tensors (2048, 64, 4096, 64, 512 and 8 elements) makes:
# every tensor alone; [w0 b0] [w1] [b1 w2 b2]; the whole model; the
# default, on the CPU every tensor alone.
CHUNKS = {1: 6, 3000: 3, 10**9: 1, None: 6}

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
    def run_steps(self, name, steps, dtype=None, undo=True, chunk=1, keep="inverse"):
        """chunk: UpdateUndo's chunk_elements; 1, every tensor its own
        chunk (a stop possible before each); None, the default (on the
        CPU, 1). keep: UpdateUndo's (the inverse measured)."""
        model = model_of(1, dtype)
        opt = SUPPORTED[name](model.parameters())
        u = None
        if undo:
            u = UpdateUndo(opt, measure=keep == "inverse", chunk_elements=chunk, keep=keep)
            u.install()
        for s in range(1, steps + 1):
            grads(model, s)
            opt.step()
        return model, opt, u

    def test_same_bits_as_torch(self):
        """Stepping tensor by tensor, or in chunks of several tensors, with
        undo recorded gives torch's own step's bits."""
        for name in SUPPORTED:
            for chunk in CHUNKS:
                for keep in KEEP:
                    with self.subTest(name=name, chunk=chunk, keep=keep):
                        a = self.run_steps(name, 5, undo=False)
                        b = self.run_steps(name, 5, undo=True, chunk=chunk, keep=keep)
                        self.assertSameBits(bits_state(*a[:2]), bits_state(*b[:2]))
                        self.assertEqual(b[2].stats["chunks"], CHUNKS[chunk], b[2].stats)
                        if keep == "copy":  # the copies of the whole model and its state
                            elems = sum(p.numel() for p in b[0].parameters())
                            st = b[1].state[next(b[0].parameters())]
                            per = 1 + sum(1 for k, v in st.items() if torch.is_tensor(v) and k != "step")
                            self.assertEqual(per, 1 if name in ("sgd", "sgd-wd") else
                                             2 if name.startswith("sgd") else 3, st.keys())
                            counts = sum(x.numel() * x.element_size() for x in
                                         (b[1].state[q].get("step") for q in b[0].parameters()) if torch.is_tensor(x))
                            self.assertEqual(b[2].stats["bytes"], 4 * per * elems + counts, b[2].stats)

    def test_interrupted_at_every_chunk(self):
        """Table: every optimizer and chunking, a failure before each chunk
        of step 6 (and after the last) undoes whole chunks to the bits of
        step 5, and the step taken again is torch's; a failure inside
        torch's step of a chunk (put back from its copies) too."""
        starts = {3000: (0, 2, 3, 6), 10**9: (0, 6)}
        for name, keep in ((n, k) for n in SUPPORTED for k in KEEP):
            for chunk, ks in starts.items():
                model, opt, u = self.run_steps(name, 5, chunk=chunk, keep=keep)
                grads(model, 6)
                before = bits_state(model, opt)
                for k in ks:
                    with self.subTest(name=name, keep=keep, chunk=chunk, fail_before=k):
                        seen = []

                        def boom(i, k=k):
                            seen.append(i)
                            if i == k:
                                raise RuntimeError("injected at %d" % i)
                        u.before_tensor = boom
                        with self.assertRaisesRegex(RuntimeError, "injected at %d" % k):
                            opt.step()
                        self.assertEqual(seen, [i for i in ks if i <= k])
                        self.assertSameBits(bits_state(model, opt), before)
                u.before_tensor = None
                self.torn_step(model, opt, before, 2 if chunk == 3000 else 1)
                opt.step()
                ref_model, ref_opt, _ = self.run_steps(name, 6, undo=False)
                self.assertSameBits(bits_state(model, opt), bits_state(ref_model, ref_opt))
            with self.subTest(name=name, keep=keep, first_step=True):  # the state is created by the step
                model, opt, u = self.run_steps(name, 0, chunk=3000, keep=keep)
                grads(model, 1)
                before = bits_state(model, opt)
                self.torn_step(model, opt, before, 2)
                self.assertEqual(len(opt.state), 0)
                opt.step()
                ref_model, ref_opt, _ = self.run_steps(name, 1, undo=False)
                self.assertSameBits(bits_state(model, opt), bits_state(ref_model, ref_opt))

    def torn_step(self, model, opt, before, at):
        """A step whose torch step dies after updating chunk ``at`` (1, 2):
        that chunk is put back from its copies, the one before undone."""
        inner, calls = type(opt).step, []

        def torn(o, *a, **kw):
            inner(o, *a, **kw)
            calls.append(1)
            if len(calls) == at:
                raise RuntimeError("inside torch's step")
        type(opt).step = torn
        try:
            with self.assertRaisesRegex(RuntimeError, "inside torch's step"):
                opt.step()
        finally:
            type(opt).step = inner
        self.assertSameBits(bits_state(model, opt), before)

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
        for bad in ("originals", None, True):
            with self.subTest(keep=bad):
                with self.assertRaisesRegex(reft.Error, "keep must be one of 'inverse', 'copy'"):
                    UpdateUndo(torch.optim.SGD(p, lr=0.1), keep=bad)
        with self.assertRaisesRegex(reft.Error, "measure=True measures the inverse"):
            UpdateUndo(torch.optim.SGD(p, lr=0.1), keep="copy", measure=True)
        for bad in (0, -1, True, 2.5, "8"):
            with self.subTest(chunk_elements=bad):
                with self.assertRaisesRegex(reft.Error, "chunk_elements must be an integer >= 1 or None"):
                    UpdateUndo(torch.optim.SGD(p, lr=0.1), chunk_elements=bad)

    def test_scheduler_made_first(self):
        """An LR scheduler created before undo (it wraps the optimizer's
        step on the instance, differently in torch 1 and 2): undo installs
        over it, the scheduler sees its steps without a warning, the bits
        are those of the same run without undo, and an interrupted step
        is undone as any other."""
        runs = []
        for undo in (False, True):
            model = model_of(1)
            opt = SUPPORTED["adamw"](model.parameters())
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
            u = None
            if undo:
                u = UpdateUndo(opt)
                u.install()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for s in range(1, 6):
                    grads(model, s)
                    opt.step()
                    sched.step()
            self.assertEqual([str(x.message) for x in w if "lr_scheduler" in str(x.message) or
                              "optimizer.step()" in str(x.message)], [])
            runs.append((model, opt, sched, u))
        self.assertSameBits(bits_state(*runs[0][:2]), bits_state(*runs[1][:2]))
        self.assertEqual(runs[0][2].get_last_lr(), runs[1][2].get_last_lr())
        model, opt, sched, u = runs[1]
        grads(model, 6)
        before = bits_state(model, opt)

        def boom(i):
            if i == 3:
                raise RuntimeError("injected")
        u.before_tensor = boom
        with self.assertRaisesRegex(RuntimeError, "injected"):
            opt.step()
        self.assertSameBits(bits_state(model, opt), before)
        u.uninstall()  # the scheduler's wrapper is back
        self.assertTrue(getattr(opt.step, "_with_counter", False) or getattr(opt.step, "_wrapped_by_lr_sched", False))

    def test_stop_request(self):
        """request_stop() from another thread stops the step at the next
        chunk boundary with UpdateInterrupted, the applied part undone."""
        model, opt, u = self.run_steps("adamw", 3, chunk=3000)
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
class Hold(SameBits, unittest.TestCase):
    """UpdateUndo.hold, the test hook behind torch_ddp.py --hold-in-update."""

    def test_hold_until_stop(self):
        """The next step stops before the held tensor, says so once, waits
        for request_stop() from another thread, then undoes the applied
        tensors and raises UpdateInterrupted; the step after is not held."""
        for at in (0, 2, 5):
            with self.subTest(before_tensor=at):
                # The whole model one chunk: the hold starts a chunk at
                # its tensor.
                model, opt, u = Undo.run_steps(self, "adamw", 3, chunk=10**9)
                grads(model, 4)
                before = bits_state(model, opt)
                undone, noted = [], []

                def note():
                    noted.append(at)
                    # The flush's thread: it asks while the step waits.
                    threading.Thread(target=u.request_stop).start()
                u.on_undone = lambda n, cause: undone.append((n, type(cause)))
                u.hold(at, note=note)
                with self.assertRaisesRegex(UpdateInterrupted, "before parameter tensor %d of 6" % at):
                    opt.step()
                self.assertEqual(noted, [at])
                self.assertEqual(undone, [(at, UpdateInterrupted)])
                self.assertSameBits(bits_state(model, opt), before)
                opt.step()  # not held again
                self.assertEqual(noted, [at])
                ref_model, ref_opt, _ = Undo.run_steps(self, "adamw", 4, undo=False)
                self.assertSameBits(bits_state(model, opt), bits_state(ref_model, ref_opt))

    def test_hold_refused(self):
        """Bad holds are refused with the valid range, before any tensor
        is touched; a hold that no request ends is undone and says why."""
        model, opt, u = Undo.run_steps(self, "sgd-momentum", 2)
        for bad, want in ((-1, r"tensor -1: .* 0\.\.5"), (6, r"tensor 6: .* 0\.\.5"),
                          (True, r"tensor True"), ("2", r"tensor '2'")):
            with self.subTest(tensor=bad):
                with self.assertRaisesRegex(reft.Error, want):
                    u.hold(bad)
        with self.assertRaisesRegex(reft.Error, "timeout must be > 0"):
            u.hold(1, timeout=0)
        # Tensors without a gradient are not updated: a hold past the
        # ones that are is refused at the step, which then changes nothing.
        grads(model, 3)
        params = list(model.parameters())
        for p in params[4:]:
            p.grad = None
        before = bits_state(model, opt)
        u.hold(5)
        with self.assertRaisesRegex(reft.Error, r"hold before tensor 5, but this step updates 4 tensors"):
            opt.step()
        self.assertSameBits(bits_state(model, opt), before)
        # No request within the timeout: undone, and the error says so.
        grads(model, 3)
        before = bits_state(model, opt)
        u.hold(3, timeout=0.01)
        with self.assertRaisesRegex(reft.Error, "held before parameter tensor 3, and no JIT flush interrupted"):
            opt.step()
        self.assertSameBits(bits_state(model, opt), before)


SCRIPT = os.path.join(REPO, "examples", "torch_ddp.py")
HASH = re.compile(r"^final-params-sha256: ([0-9a-f]{64})$", re.M)
HOLD = re.compile(r"^torch_ddp: hold-in-update: rank 0 holds in step (\d+)'s update before tensor (\d+) ", re.M)


def example(agent, *flags, wait=True):
    """examples/torch_ddp.py as one rank, on agent (None: without reft)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."), PYTHONDONTWRITEBYTECODE="1")
    for k in ("REFT_AGENT_SOCKET", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(k, None)
    if agent is not None:
        env["REFT_AGENT_SOCKET"] = agent.path
    args = [sys.executable, SCRIPT, "--steps", "8", "--seed", "3", "--optimizer", "adam"] + list(flags)
    if wait:
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_torch
class ExampleHold(TorchCase):
    def test_flags_refused(self):
        """torch_ddp.py --hold-in-update refuses what cannot hold: a step
        below 1, a tensor out of range, no --undo, no reft."""
        for flags, agent, code, want in (
                (["--hold-in-update", "0:1", "--undo"], False, 2, "STEP >= 1 and TENSOR >= 0"),
                (["--hold-in-update", "5:-1", "--undo"], False, 2, "STEP >= 1 and TENSOR >= 0"),
                (["--hold-in-update", "5", "--undo"], False, 2, "is not STEP:TENSOR"),
                (["--hold-in-update", "5:1"], False, 2, "--hold-in-update needs --undo"),
                (["--hold-in-update", "5:1", "--undo", "--ckpt-dir", "/nonexistent"], False, 2, "not --ckpt-dir"),
                (["--hold-in-update", "5:1", "--undo"], False, 1, "needs reft snapshots"),
                (["--hold-in-update", "5:10", "--undo"], True, 1, r"the model has 10 parameter tensors \(0\.\.9\)")):
            with self.subTest(flags=flags, agent=agent):
                r = example(self.agent("arc,every=0") if agent else None, *flags)
                self.assertEqual(r.returncode, code, r.stderr)
                self.assertRegex(r.stderr, want)
                self.assertNotIn("hold-in-update: rank", r.stderr)

    def test_held_then_flushed(self):
        """every=0 on a real agent: the rank holds inside step 5's update
        with two tensors applied and says so; SIGTERM (Slurm's step kill)
        flushes, which interrupts and undoes the update and saves step 4;
        the relaunch resumes from step 4 and ends with the bits of a run
        that was never interrupted. Both kinds of undo data (--undo is
        --undo inverse)."""
        for undo in (["--undo"], ["--undo", "copy"]):
            with self.subTest(undo=undo):
                self.held_then_flushed(undo)

    def held_then_flushed(self, undo):
        ref = example(None, *undo)
        self.assertEqual(ref.returncode, 0, ref.stderr)
        want = HASH.findall(ref.stdout)
        self.assertEqual(len(want), 1, ref.stdout)
        agent = self.agent("arc,every=0")
        p = example(agent, *undo, "--hold-in-update", "5:2", wait=False)
        err = []
        for line in p.stderr:
            err.append(line)
            if HOLD.match(line):
                break
        self.assertEqual([HOLD.match(x).groups() for x in err if HOLD.match(x)], [("5", "2")], "".join(err))
        p.send_signal(signal.SIGTERM)
        out, rest = p.communicate(timeout=120)
        err = "".join(err) + rest
        # The signal's flush dies of the signal once it has saved; the
        # trainer's own flush on UpdateInterrupted races it, finds step 4
        # saved and may exit first with the interruption's error (1).
        self.assertIn(p.returncode, (-signal.SIGTERM, 1), err)
        self.assertIn("JIT save of step 4 committed", err)
        self.assertIn("undid the update of 2 parameter tensors", err)
        self.assertNotRegex(err, r"JIT save of step (?!4 )\d+")
        self.assertNotIn("final-params-sha256", out)
        again = example(agent, *undo, "--hold-in-update", "5:2")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("resumed from step 4\n", again.stdout)
        self.assertNotRegex(again.stderr, "hold-in-update: rank")  # a resumed run does not hold
        self.assertEqual(HASH.findall(again.stdout), want, again.stdout)


@needs_torch
class CheckpointerUndo(SameBits, TorchCase):
    def test_undo_value_refused(self):
        """A value of undo= other than False, True, 'inverse', 'copy' is
        refused, naming the choices."""
        model = model_of(3)
        opt = SUPPORTED["adamw"](model.parameters())
        for bad in ("fast", 1, "Copy"):
            with self.subTest(undo=bad):
                with self.assertRaisesRegex(reft.Error, "undo must be False, True .* 'inverse' or 'copy'"):
                    Checkpointer(model, opt, session=object(), undo=bad)

    def test_flush_mid_step_saves_previous_step(self):
        """save every 0 (consistent() only): a JIT flush that finds the
        trainer inside optimizer.step() has it undo the applied tensors,
        saves the previous step, and a run restored from that ends
        bit-identical to an uninterrupted one. Both of undo's kinds
        (undo=True is "inverse")."""
        for name, undo in (("sgd-nesterov-wd", True), ("adam", True), ("adamw", True), ("adamw", "copy"),
                           ("sgd-momentum", "copy")):
            with self.subTest(name=name, undo=undo):
                agent = self.agent()
                model = model_of(3)
                opt = SUPPORTED[name](model.parameters())
                ck = self.checkpointer(model, opt, agent, undo=undo, jit=False)
                self.assertEqual(ck.undo.keep, "inverse" if undo is True else undo)
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
                ck._undo.chunk_elements = 3000  # chunks start at tensors 0, 2 and 3
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
        ck._undo.chunk_elements = 3000  # chunks start at tensors 0, 2 and 3
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

    def test_every0_per_rank_state(self):
        """every=0 with several ranks: state that differs per rank never
        leaves a rank that dies, so the Checkpointer refuses it, naming it
        and the fix; the optimizer's hyperparameters, the same on every
        data-parallel rank, are registered replicated (a survivor's flush
        then carries them for a lost rank)."""
        agent = self.agent("arc,every=0")
        model = model_of(3)
        opt = SUPPORTED["adam"](model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)  # made first: undo installs over its wrapper
        for kw, want in (({}, r"rng=True \(each rank's RNG states\) is state of its own rank"),
                         ({"rng": False, "extra": {"sched": sched}}, r"extra= \(sched\) is state of its own rank"),
                         ({"rng": False, "sharded_optimizer": True}, r"sharded_optimizer=True")):
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                with self.assertRaisesRegex(reft.Error, "every=0 with 2 ranks: " + want + ".*launch with every=1"):
                    Checkpointer(model, opt, session=self.session(agent, world=2), undo=True, **kw)
        s = self.session(agent, world=2)
        ck = Checkpointer(model, opt, session=s, undo=True, rng=False)
        self.addCleanup(ck.close)
        groups = [b for b in s._buffers if "param_groups" in b.name]
        self.assertEqual([b.replicated for b in groups], [True])
        # Under every=1 they stay per rank (the ranks' snapshots copy them).
        s1 = self.session(self.agent("arc"), world=2)
        ck1 = Checkpointer(model, SUPPORTED["adam"](model.parameters()), session=s1, undo=True)
        self.addCleanup(ck1.close)
        self.assertEqual([b.replicated for b in s1._buffers if "param_groups" in b.name], [False])


if __name__ == "__main__":
    unittest.main()
