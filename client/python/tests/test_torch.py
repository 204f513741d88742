"""reft.torch.Checkpointer against the real agent (tests/conformance-agent).

PyTorch is a dependency of this package's torch adapter; these tests are
skipped, loudly, only when it cannot be imported. The agent is built from
the checkout with `go build` unless REFT_CONFORMANCE_AGENT names a binary.

    cd client/python && /usr/bin/python3 -m unittest tests.test_torch -v
"""

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.abspath(os.path.join(HERE, ".."))
REPO = os.path.abspath(os.path.join(PYROOT, "..", ".."))
sys.path.insert(0, PYROOT)

import reft  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - the message is the point
    torch = None
    _TORCH_ERROR = e
    sys.stderr.write(
        "\n" + "!" * 78 + "\n"
        "!! test_torch: SKIPPING every reft.torch test: PyTorch cannot be imported (%s).\n"
        "!! torch is a dependency of reft.torch; install it (Debian: apt-get install "
        "python3-torch)\n!! and run these tests with that interpreter (/usr/bin/python3).\n"
        % e + "!" * 78 + "\n\n")
else:
    from reft.torch import Checkpointer
    from reft._streams import CpuStreams

needs_torch = unittest.skipIf(torch is None, "PyTorch is not importable; see the message above")

_agent_bin = None
_tmp = None


def setUpModule():
    global _agent_bin, _tmp
    if torch is None:
        return
    torch.set_num_threads(1)
    _agent_bin = os.environ.get("REFT_CONFORMANCE_AGENT")
    if _agent_bin:
        return
    if shutil.which("go") is None:
        raise RuntimeError("test_torch needs the real agent: install Go to build "
                           "tests/conformance-agent, or set REFT_CONFORMANCE_AGENT to a built one")
    _tmp = tempfile.mkdtemp(prefix="reft-torch-test-")
    _agent_bin = os.path.join(_tmp, "conformance-agent")
    r = subprocess.run(["go", "build", "-o", _agent_bin, "./tests/conformance-agent"], cwd=REPO,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("go build ./tests/conformance-agent failed:\n" + r.stderr)


def tearDownModule():
    if _tmp:
        shutil.rmtree(_tmp, ignore_errors=True)


class Agent:
    """A real agent over a fresh store, serving until close()."""

    def __init__(self, spec=None):
        args = [_agent_bin] + (["-spec", spec] if spec else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.path = self.proc.stdout.readline().strip()
        if not self.path:
            self.proc.stdin.close()
            err = self.proc.stderr.read()
            self.proc.wait()
            raise RuntimeError("conformance-agent printed no socket path: " + err)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()


# --- a small deterministic training problem ------------------------------

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05),  # creates its state in __init__
}


def make(optimizer, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3))
    return model, OPTIMIZERS[optimizer](model.parameters())


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 6, generator=g)
    return x, torch.sin(x[:, :3] * 2) + 0.1 * torch.randn(16, 3, generator=g)


def train(model, opt, steps, ck=None, save=True):
    for step in steps:
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if ck is not None:
            ck.wait()
        opt.step()
        if ck is not None and save:
            ck.save(step)


def raw(t):
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def state(model, opt):
    """Every byte of the training state: parameters, buffers, optimizer."""
    out = {"param " + n: raw(p) for n, p in model.named_parameters()}
    out.update({"buffer " + n: raw(b) for n, b in model.named_buffers()})
    sd = opt.state_dict()
    for i, st in sd["state"].items():
        for k, v in st.items():
            out["optim %d %s" % (i, k)] = (raw(v), v.dtype, tuple(v.shape)) if torch.is_tensor(v) else v
    out["param_groups"] = repr(sd["param_groups"])
    return out


def perturb(model, opt):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.5)
        for b in model.buffers():
            b.fill_(7)
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    v.add_(3)


class TorchCase(unittest.TestCase):
    def agent(self, spec=None):
        a = Agent(spec)
        self.addCleanup(a.close)
        return a

    def session(self, agent, **kw):
        kw.setdefault("socket_path", agent.path)
        kw.setdefault("rank", 0)
        kw.setdefault("world", 1)
        kw.setdefault("local_rank", 0)
        s = reft.Session(**kw)
        self.addCleanup(s.close)
        return s

    def checkpointer(self, model, opt, agent, **kw):
        ck = Checkpointer(model, opt, session=self.session(agent), **kw)
        self.addCleanup(ck.close)
        return ck

    def assertSameState(self, got, want, what):
        self.assertEqual(sorted(got), sorted(want), what + ": different state entries")
        for k in want:
            self.assertTrue(got[k] == want[k], "%s: %s differs" % (what, k))


@needs_torch
class TestRoundTrip(TorchCase):
    def test_save_perturb_restore_is_bit_exact(self):
        for name in OPTIMIZERS:
            with self.subTest(optimizer=name):
                agent = self.agent()
                model, opt = make(name)
                ck = self.checkpointer(model, opt, agent)
                train(model, opt, range(1, 4), ck)
                ck.wait()
                want = state(model, opt)
                train(model, opt, range(4, 6), ck, save=False)
                perturb(model, opt)
                self.assertNotEqual(state(model, opt), want)
                self.assertEqual(ck.restore(), 3)
                self.assertSameState(state(model, opt), want, name)
                self.assertEqual(ck.generations()[0], 3)

    def test_restore_without_snapshot_is_none(self):
        model, opt = make("adam")
        ck = self.checkpointer(model, opt, self.agent())
        before = state(model, opt)
        self.assertIsNone(ck.restore())
        self.assertSameState(state(model, opt), before, "untouched")

    def test_restore_fills_a_fresh_process_model(self):
        # A relaunch builds the model from another seed; restore overwrites all of it.
        agent = self.agent()
        model, opt = make("adamw")
        ck = self.checkpointer(model, opt, agent)
        train(model, opt, range(1, 5), ck)
        ck.close()
        want = state(model, opt)
        model2, opt2 = make("adamw", seed=99)
        ck2 = self.checkpointer(model2, opt2, agent)
        self.assertEqual(ck2.restore(), 4)
        self.assertSameState(state(model2, opt2), want, "relaunch")


@needs_torch
class TestResume(TorchCase):
    STEPS, CRASH = 9, 5

    def run_uninterrupted(self, name, with_ck=True):
        model, opt = make(name)
        ck = self.checkpointer(model, opt, self.agent()) if with_ck else None
        train(model, opt, range(1, self.STEPS + 1), ck)
        if ck is not None:
            ck.close()
        return state(model, opt)

    def test_resumed_equals_uninterrupted(self):
        for name in OPTIMIZERS:
            with self.subTest(optimizer=name):
                want = self.run_uninterrupted(name)
                agent = self.agent()
                model, opt = make(name)
                ck = self.checkpointer(model, opt, agent)
                train(model, opt, range(1, self.CRASH + 1), ck)
                ck.close()  # committed; the "crash" drops model and optimizer
                model, opt = make(name, seed=123)
                ck = self.checkpointer(model, opt, agent)
                step = ck.restore()
                self.assertEqual(step, self.CRASH)
                train(model, opt, range(step + 1, self.STEPS + 1), ck)
                ck.close()
                self.assertSameState(state(model, opt), want, name + " resumed")

    def test_checkpointer_does_not_change_training(self):
        # The state it creates before the first step is what torch creates,
        # so a run with a Checkpointer is bit-identical to one without.
        for name in OPTIMIZERS:
            with self.subTest(optimizer=name):
                self.assertSameState(self.run_uninterrupted(name), self.run_uninterrupted(name, False), name)

    def test_materialized_state_matches_torch(self):
        for name in ("adam", "adam-amsgrad", "adamw", "momentum"):
            with self.subTest(optimizer=name):
                model, opt = make(name)
                Checkpointer(model, opt, session=self.session(self.agent())).close()
                mine = {i: {k: (v.dtype, tuple(v.shape)) for k, v in st.items()}
                        for i, st in opt.state_dict()["state"].items()}
                model, opt = make(name)
                train(model, opt, [1])
                torchs = {i: {k: (v.dtype, tuple(v.shape)) for k, v in st.items()}
                          for i, st in opt.state_dict()["state"].items()}
                self.assertEqual(mine, torchs)


@needs_torch
class TestJIT(TorchCase):
    def test_notice_saves_the_consistent_step(self):
        """Snapshots every 5 steps; after step 13 a peer failure notice: the
        state of step 13 is saved at once, bit for bit, the BatchNorm
        buffers as staged at consistent(13) although a forward pass has
        changed them since; restore() then gives step 13, not 10."""
        agent = self.agent()
        model, opt = make("adamw")
        s = self.session(agent)
        lines = []
        s.watch_failures(log=lines.append)
        ck = Checkpointer(model, opt, session=s)
        self.addCleanup(ck.close)
        for step in range(1, 14):
            train(model, opt, [step], ck, save=step % 5 == 0)
            if step % 5:
                ck.consistent(step)
        want = state(model, opt)
        model(batch(14)[0])  # the next step's forward: BatchNorm's running stats change
        agent.proc.stdin.write("notify n2 peer_lost: EOF\n")
        agent.proc.stdin.flush()
        deadline = time.monotonic() + 20
        while not any("JIT save of step 13 committed" in l for l in lines):
            self.assertLess(time.monotonic(), deadline, "no JIT save: %s" % lines)
            time.sleep(0.005)
        perturb(model, opt)
        self.assertEqual(ck.restore(), 13)
        self.assertSameState(state(model, opt), want, "JIT-saved step 13")

    def test_optimizer_step_waits_for_the_flush(self):
        """optimizer.step() (through the Checkpointer's hook) declares the
        state updating: a flush asked for during it saves the step after."""
        agent = self.agent()
        model, opt = make("sgd")
        ck = self.checkpointer(model, opt, agent)
        train(model, opt, [1], ck)
        ck.wait()
        x, y = batch(2)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()  # updating from here until consistent(2)
        got = []
        t = threading.Thread(target=lambda: got.append(ck.session.flush("test", timeout=30)))
        t.start()
        time.sleep(0.05)
        self.assertEqual(got, [], "a flush saved while the state was being updated")
        ck.consistent(2)
        t.join(30)
        self.assertEqual(got, [(2, True)])


@needs_torch
class TestContract(TorchCase):
    def test_optimizer_step_waits_for_the_copy(self):
        agent = self.agent()
        model, opt = make("adam")
        gate, copying = threading.Event(), threading.Event()

        def before_copy(i):  # the copy stream holds at its first job until the gate opens
            copying.set()
            gate.wait(30)

        ck = self.checkpointer(model, opt, agent, streams=CpuStreams(before_copy))
        self.addCleanup(gate.set)
        train(model, opt, [1], ck, save=False)
        want = state(model, opt)
        h = ck.save(1)
        self.assertTrue(copying.wait(30))
        self.assertFalse(h.done())
        x, y = batch(2)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        stepped = threading.Event()
        t = threading.Thread(target=lambda: (opt.step(), stepped.set()))  # no ck.wait(): the hook fences
        t.start()
        self.assertFalse(stepped.wait(0.2), "optimizer.step() ran while the copy was held")
        now = state(model, opt)  # the forward pass has changed BatchNorm's buffers, nothing else
        self.assertSameState({k: v for k, v in now.items() if not k.startswith("buffer ")},
                             {k: v for k, v in want.items() if not k.startswith("buffer ")},
                             "parameters and optimizer state while the copy is held")
        gate.set()
        t.join(30)
        self.assertTrue(stepped.is_set())
        h.wait()
        model2, opt2 = make("adam", seed=5)
        ck2 = self.checkpointer(model2, opt2, agent)
        self.assertEqual(ck2.restore(), 1)
        self.assertSameState(state(model2, opt2), want, "snapshot taken before step 2")

    def test_close_removes_the_hook(self):
        model, opt = make("sgd")
        hooks = getattr(opt, "_optimizer_step_pre_hooks", None)  # torch >= 2.0
        ck = self.checkpointer(model, opt, self.agent())
        if hooks is not None:
            self.assertEqual(len(hooks), 1)
            self.assertNotIn("step", opt.__dict__)
        else:  # torch 1.13: step wrapped on the instance
            self.assertIn("step", opt.__dict__)
        ck.close()
        self.assertNotIn("step", opt.__dict__)
        if hooks is not None:
            self.assertEqual(len(hooks), 0)
        with self.assertRaisesRegex(reft.Error, "after close"):
            ck.save(1)

    def test_lr_schedulers_still_work(self):
        for order in ("scheduler first", "checkpointer first"):
            with self.subTest(order=order):
                model, opt = make("momentum")
                if order == "scheduler first":
                    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
                    ck = self.checkpointer(model, opt, self.agent())
                else:
                    ck = self.checkpointer(model, opt, self.agent())
                    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    for step in (1, 2):
                        train(model, opt, [step], ck)
                        sched.step()
                self.assertEqual([str(x.message) for x in w], [])
                if hasattr(opt, "_step_count"):  # torch 1.13: the scheduler's step counter
                    self.assertEqual(opt._step_count, 2)
                else:  # torch 2.x: the scheduler's flag that optimizer.step() ran
                    self.assertTrue(opt._opt_called)
                self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.05 / 4)
                ck.close()

    def test_replaced_state_is_refused(self):
        model, opt = make("adam")
        ck = self.checkpointer(model, opt, self.agent())
        # New state tensors (torch 2.x's load_state_dict keeps tensors that
        # already have the right dtype and device; 1.13's copies them).
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        with self.assertRaisesRegex(reft.Error, "optimizer's parameters or state changed"):
            ck.save(1)
        model, opt = make("sgd")
        ck = self.checkpointer(model, opt, self.agent())
        model[0].weight.data = model[0].weight.data.clone()
        with self.assertRaisesRegex(reft.Error, "parameter param/0:0.weight was replaced"):
            ck.save(1)

    def test_unsupported_lazy_optimizer_is_refused(self):
        model, _ = make("sgd")
        opt = torch.optim.RMSprop(model.parameters())
        with self.assertRaisesRegex(reft.Error, "RMSprop has no state yet"):
            Checkpointer(model, opt, session=self.session(self.agent()))

    def test_sgd_dampening_warns(self):
        model, _ = make("sgd")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
        with self.assertWarnsRegex(RuntimeWarning, "dampening"):
            self.checkpointer(model, opt, self.agent())

    def test_sharded_optimizer_state_not_replicated(self):
        for sharded in (False, True):
            model, opt = make("adam")
            s = self.session(self.agent())
            ck = Checkpointer(model, opt, session=s, sharded_optimizer=sharded)
            self.addCleanup(ck.close)
            ck.save(1).wait()
            bufs = s.registration["buffers"]
            optim = [b for b in bufs if b["name"].startswith("optim/")]
            rest = [b for b in bufs if not b["name"].startswith(("optim/", "extra/"))]
            extra = [b for b in bufs if b["name"].startswith("extra/")]  # per rank: RNG, param_groups
            self.assertEqual(len(extra), 2)
            self.assertTrue(all(b.get("replicated") is False for b in extra), extra)
            nparams = len(list(model.parameters()))
            self.assertEqual(len(optim), 3 * nparams)  # step, exp_avg, exp_avg_sq of each
            self.assertTrue(all(b.get("replicated") is (not sharded) for b in optim), optim)
            self.assertTrue(all(b.get("replicated") is True for b in rest), rest)

    def test_optional_without_agent(self):
        env = {k: v for k, v in os.environ.items() if k != "REFT_AGENT_SOCKET"}
        code = textwrap.dedent("""
            import warnings, torch
            from reft.torch import Checkpointer
            m = torch.nn.Linear(2, 2); o = torch.optim.Adam(m.parameters())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ck = Checkpointer(m, o, optional=True)
                print(ck.restore(), ck.save(1).done())
                ck.close()
        """)
        r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=PYROOT),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "None True")

    def test_import_reft_does_not_import_torch(self):
        r = subprocess.run([sys.executable, "-c", "import sys, reft; print('torch' in sys.modules)"],
                           env=dict(os.environ, PYTHONPATH=PYROOT), capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "False")


_DIST_RANK = textwrap.dedent("""
    import hashlib, sys, warnings, torch, torch.distributed as dist
    import reft
    from reft.torch import Checkpointer
    phase, rank, init, last = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(rank if phase == "save" else 77)
    m = torch.nn.Linear(4, 4); o = torch.optim.Adam(m.parameters(), lr=0.1)
    ck = Checkpointer(m, o)  # its own session: rank and world from torch.distributed
    h = lambda: hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()
    if phase == "save":
        for step in range(1, last + 1):
            o.zero_grad(); m(torch.ones(2, 4) * step).sum().backward(); ck.wait(); o.step()
            ck.save(step).wait()
            print("step", step, h(), flush=True)
    else:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                print("restored", ck.restore(), h(), flush=True)
            except reft.Error as e:
                print("error", e, flush=True)
        for x in w:
            print("warning", x.message, flush=True)
    ck.close()
    dist.barrier()  # torch 2.6: a rank tearing down gloo while its peer still ran sometimes aborted
    dist.destroy_process_group()
""")


@needs_torch
class TestDistributedAgreement(TorchCase):
    # These tests give the ranks different sets of generations and check
    # the client's job-wide agreement. Under arc or aec the agent shards
    # the replicated state and rebuilds a rank's missing generation from
    # the group's copies, so every step would be common; under aor (with no
    # ZeRO-1 shards registered) each rank keeps its own whole buffers.
    def agent(self, spec="aor"):
        return super().agent(spec)

    def launch(self, agent, phase, last=(0, 0), stderr=False):
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=PYROOT, REFT_AGENT_SOCKET=agent.path, GLOO_SOCKET_IFNAME="lo",
                   # Debian's torch 2.6 has no libuv; its TCPStore asks for it by default
                   USE_LIBUV="0")
        for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
            env.pop(k, None)
        procs = [subprocess.Popen([sys.executable, "-c", _DIST_RANK, phase, str(r),
                                   "tcp://127.0.0.1:%d" % port, str(last[r])], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in (0, 1)]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            self.assertEqual(p.returncode, 0, "phase %s rank failed:\n%s\nits output:\n%s" % (phase, err, out))
            outs.append([l for l in out.split("\n") if l])
            if stderr:
                outs.append(err)
        return outs

    @staticmethod
    def hashes(saved, step):
        return [[l.split()[2] for l in out if l.startswith("step %d " % step)][0] for out in saved]

    @staticmethod
    def corrupt(agent, rank, step):
        """Flip a byte of rank's generation of step in the agent's store."""
        d = os.path.join(os.path.dirname(agent.path), "store")
        for root, _, files in os.walk(d):
            if os.path.basename(root).startswith("g%d-" % step) and "MANIFEST" in files and \
                    os.path.basename(os.path.dirname(os.path.dirname(root))) == "r%d" % rank:
                with open(os.path.join(root, "MANIFEST")) as f:
                    mf = json.load(f)
                with open(os.path.join(os.path.dirname(root), mf["arena"]), "r+b") as f:
                    off = mf["buffers"][0]["offset"]
                    f.seek(off)
                    b = f.read(1)
                    f.seek(off)
                    f.write(bytes([b[0] ^ 0xFF]))
                return
        raise AssertionError("no generation of step %d of rank %d under %s" % (step, rank, d))

    def test_ranks_restore_the_newest_common_step(self):
        agent = self.agent()
        saved = self.launch(agent, "save", (3, 2))  # rank 0 holds steps 3 and 2, rank 1 2 and 1
        at2 = self.hashes(saved, 2)
        for rank, out in enumerate(self.launch(agent, "restore")):
            self.assertEqual(out, ["restored 2 %s" % at2[rank]], "rank %d" % rank)

    def test_corrupt_copy_makes_the_ranks_agree_again(self):
        agent = self.agent()
        saved = self.launch(agent, "save", (3, 3))
        at2 = self.hashes(saved, 2)
        self.corrupt(agent, 0, 3)
        for rank, out in enumerate(self.launch(agent, "restore")):
            self.assertEqual(out[0], "restored 2 %s" % at2[rank], "rank %d: %s" % (rank, out))
            self.assertRegex(out[1], r"^warning reft.torch: step 3 is not restorable on rank\(s\) \[0\]")

    def test_no_common_step_is_said(self):
        """Some ranks hold snapshots, one holds none: every rank starts
        from the beginning and says why, not silently."""
        agent = self.agent()
        self.launch(agent, "save", (2, 0))  # rank 1 saves nothing
        out0, err0, out1, err1 = self.launch(agent, "restore", stderr=True)
        for rank, (out, err, holds) in enumerate(((out0, err0, "[1, 2]"), (out1, err1, "none"))):
            self.assertEqual([l.split()[:2] for l in out], [["restored", "None"]], "rank %d" % rank)
            self.assertIn("restore: no step is held by every rank (rank(s) [1] hold none; this rank holds %s), "
                          "so training starts from the beginning" % holds, err)

    def test_no_common_step_after_a_partial_restore_is_an_error(self):
        agent = self.agent()
        self.launch(agent, "save", (3, 2))
        self.corrupt(agent, 0, 2)  # the only step both ranks hold
        for rank, out in enumerate(self.launch(agent, "restore")):
            self.assertRegex(out[0], r"^error .*step 2 could not be restored on every rank", "rank %d" % rank)


@needs_torch
class TestDDPCommPhase(TorchCase):
    """Under DDP the Checkpointer reports the backward pass (DDP's gradient
    all-reduce) as a communication phase: on from the end of a training
    forward pass to the optimizer step, never for an evaluation forward;
    the agent measures the rank's work between the phases."""

    def test_backward_is_a_communication_phase(self):
        import torch.distributed as dist
        self.assertFalse(dist.is_initialized(), "a process group is left from another test")
        for k, v in (("GLOO_SOCKET_IFNAME", "lo"), ("USE_LIBUV", "0")):
            old = os.environ.get(k)
            os.environ[k] = v
            self.addCleanup(lambda k=k, old=old: os.environ.pop(k) if old is None else os.environ.__setitem__(k, old))
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "store"), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        torch.manual_seed(1)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ck = self.checkpointer(model, opt, self.agent())

        def progress():
            ranks = [r for r in ck.session.status().get("ranks") or [] if r["rank"] == 0]
            return ranks[0].get("progress") if ranks else None

        for step in range(1, 6):
            loss = model(torch.ones(2, 4) * step).sum()
            if step > 1:  # the agent watches a rank from its first save
                p = progress()
                self.assertTrue(p["in_comm"], "step %d: no communication phase after forward" % step)
                self.assertEqual(p["where"], "in the collective DDP backward pass and gradient all-reduce", p)
            loss.backward()
            opt.step()
            ck.save(step).wait()
            self.assertFalse(progress()["in_comm"], "step %d: the phase outlived the optimizer step" % step)
        p = progress()
        self.assertEqual(p["step"], 5)
        self.assertRegex(p["where"], r"^outside its collectives .* since its last collective \(DDP backward pass and gradient all-reduce\) ended$")
        self.assertGreater(p["compute_s"], 0, p)  # four spans between phases measured
        model.eval()
        with torch.no_grad():
            model(torch.ones(2, 4))
        self.assertFalse(progress()["in_comm"], "an evaluation forward opened a communication phase")
        model.train()
        ck.close()  # removes the forward hook: a forward after it sends nothing
        model(torch.ones(2, 4)).sum().backward()


if __name__ == "__main__":
    unittest.main()
