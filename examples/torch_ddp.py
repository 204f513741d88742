#!/usr/bin/python3
"""PyTorch DDP training with reft snapshots, on the GPU when there is one
(NCCL, one GPU per task: SLURM_LOCALID picks it) and on the CPU otherwise
(gloo): the PyTorch counterpart of examples/trainer (reft-train). --device
forces one.

    srun --reft=arc -N4 -n4 /usr/bin/python3 examples/torch_ddp.py --steps 20

A small MLP (with a BatchNorm, so module buffers are snapshotted too) learns
a fixed random teacher on synthetic data. Every batch is a function of
(--seed, step, rank) and the run is deterministic (deterministic algorithms,
fixed thread counts; on CUDA also CUBLAS_WORKSPACE_CONFIG), so a run that
resumes from a snapshot ends with the same bits as one that did not.

Rank 0 prints "step N loss X", "resumed from step N" after a restore,
"mean-step-ms: X" and "final-params-sha256: <hex>" (SHA-256 over every
parameter's bytes, in model order). --fail-at STEP:RANK makes that rank
SIGKILL itself at the start of STEP, only in a run that did not resume, so a
relaunch with the same flags restores and finishes. Launch with srun -K1 so
that the step ends when a rank dies.

--hold-in-update STEP:TENSOR (needs --undo and srun --reft) makes every rank
stop inside its optimizer.step() of STEP before parameter tensor TENSOR
(0-based, model order), the tensors before it updated, and say so on stderr
("torch_ddp: hold-in-update: rank R holds in step STEP's update before
tensor TENSOR ..."), until a JIT flush interrupts the step; the step is then
undone, the flush saves STEP-1 and the rank exits with an error. Only in a
run that did not resume. It is the test of a node lost while the survivors
are inside the optimizer step (reft.undo.UpdateUndo.hold; docs/UNDO.md).

Snapshots: with REFT_AGENT_SOCKET set (srun --reft=...) reft.torch's
Checkpointer saves every --save-every steps and restores at start-up;
without it the program trains without snapshots and says so. Between saves
every step is declared consistent after optimizer.step(), so when a node of
the job fails (the agent's notice) or the step is killed (SIGTERM), the
state of the last finished step is saved at once (JIT flush): at most the
step in progress is lost whatever --save-every is.

--ckpt-dir DIR replaces reft's snapshots with what jobs do without reft:
rank 0 torch.saves the model and optimizer state to DIR (a shared
filesystem) every --save-every steps, synchronously, and every rank resumes
from the newest one (the goodput benchmark's status quo).

Rank and world come from SLURM_PROCID and SLURM_NTASKS. The rendezvous is
MASTER_ADDR:MASTER_PORT when set; else the first node of the step, or its
Slurm NodeAddr when its name does not resolve (as on the test cluster, where
every node is 127.0.0.1), and a port derived from the job and step ids.
"""

import argparse
import datetime
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time

try:
    import reft  # noqa: F401 - PYTHONPATH=<repo>/client/python
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import reft
from reft.torch import Checkpointer
from reft.undo import UpdateInterrupted

PROG = "torch_ddp"
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


def _step_pair(p, flag, value, second, example):
    """Parse flag's STEP:N value (None, None when unset), STEP >= 1 and
    N >= 0, or exit through p.error naming the form and an example."""
    if not value:
        return None, None
    step, sep, n = value.partition(":")
    try:
        step, n = int(step), int(n)
    except ValueError:
        sep = ""
    if not sep or step < 1 or n < 0:
        p.error("%s %r is not STEP:%s with STEP >= 1 and %s >= 0 (e.g. %s %s)" % (flag, value, second, second, flag, example))
    return step, n


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--size", type=int, default=64, help="model width (default 64)")
    p.add_argument("--layers", type=int, default=3, help="hidden layers (default 3)")
    p.add_argument("--batch", type=int, default=16, help="samples per rank and step (default 16)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: 0.05 for sgd and "
                   "momentum, 0.001 for adam and adamw)")
    p.add_argument("--save-every", type=int, default=1, help="snapshot every N steps (0: never; default 1)")
    p.add_argument("--undo", nargs="?", const="inverse", default=None, choices=("inverse", "copy"),
                   help="make optimizer.step() undoable (reft.undo): a JIT flush that finds a rank inside it saves the "
                   "previous step; advised under --reft=...,every=0. inverse (the default) keeps about a byte per "
                   "element; copy keeps a copy of the parameters and optimizer state during the step, the fast "
                   "one on a GPU (docs/UNDO.md)")
    p.add_argument("--hold-in-update", default="", metavar="STEP:TENSOR",
                   help="test hook (needs --undo and srun --reft): every rank stops in STEP's optimizer.step() before "
                   "parameter tensor TENSOR until a JIT flush interrupts it (only in a run that did not resume)")
    p.add_argument("--log-every", type=int, default=1, help="print rank 0's loss every N steps (default 1)")
    p.add_argument("--fail-at", default="", metavar="STEP:RANK",
                   help="that rank SIGKILLs itself at the start of STEP (only in a run that did not resume)")
    p.add_argument("--ckpt-dir", default="", metavar="DIR",
                   help="instead of reft's snapshots, what jobs do without reft: every --save-every steps rank 0 "
                   "torch.saves the model and optimizer state to DIR (shared by every node; fsynced, then renamed "
                   "into place) while the other ranks wait at a barrier; at start-up every rank loads the newest one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto (default): CUDA when torch sees a GPU, else the CPU")
    a = p.parse_args(argv)
    a.fail_step, a.fail_rank = _step_pair(p, "--fail-at", a.fail_at, "RANK", "5:2")
    a.hold_step, a.hold_tensor = _step_pair(p, "--hold-in-update", a.hold_in_update, "TENSOR", "8:2")
    if a.hold_in_update:
        if not a.undo:
            p.error("--hold-in-update needs --undo: the hold ends when a JIT flush interrupts the update, "
                    "which --undo then undoes")
        if a.ckpt_dir:
            p.error("--hold-in-update needs reft's JIT flush, not --ckpt-dir")
    for name in ("steps", "size", "layers", "batch", "threads", "log_every"):
        if getattr(a, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    if a.save_every < 0:
        p.error("--save-every must be >= 0")
    if a.lr is None:
        a.lr = 0.05 if a.optimizer in ("sgd", "momentum") else 1e-3
    return a


def env_int(name, default):
    v = os.environ.get(name, "")
    try:
        return int(v) if v else default
    except ValueError:
        raise SystemExit("%s: %s=%r is not an integer" % (PROG, name, v)) from None


def first_node():
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                             capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("%s: cannot expand SLURM_STEP_NODELIST=%s with scontrol (%s); set "
                         "MASTER_ADDR to rank 0's address" % (PROG, nodelist, e)) from None
    return out[0] if out else None


def resolve(host):
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return None


def master_addr():
    """Rank 0's address: MASTER_ADDR, else the step's first node by name,
    else by the NodeAddr Slurm itself uses to reach it."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    host = first_node()
    if host is None:
        return "127.0.0.1"
    addr = resolve(host)
    if addr:
        return addr
    try:
        out = subprocess.run(["scontrol", "show", "node", host], check=True, capture_output=True,
                             text=True).stdout
        node_addr = [w.split("=", 1)[1] for w in out.split() if w.startswith("NodeAddr=")]
    except (OSError, subprocess.CalledProcessError):
        node_addr = []
    addr = resolve(node_addr[0]) if node_addr else None
    if not addr:
        raise SystemExit("%s: rank 0's node %s does not resolve and Slurm names no usable NodeAddr "
                         "for it; set MASTER_ADDR to its address" % (PROG, host))
    return addr


def master_port():
    if os.environ.get("MASTER_PORT"):
        return env_int("MASTER_PORT", 0)
    # Each step of an allocation gets its own port, so a relaunch never
    # meets the previous step's sockets; 20000-29999 avoids the ephemeral range.
    return 20000 + (env_int("SLURM_JOB_ID", 0) * 16 + env_int("SLURM_STEP_ID", 0)) % 10000


def pick_device(a):
    if a.device == "cpu" or (a.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("%s: --device cuda, but torch sees no GPU (torch %s)" % (PROG, torch.__version__))
    # One GPU per task, chosen by the task's index on its node.
    dev = torch.device("cuda", env_int("SLURM_LOCALID", 0) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def init_distributed(rank, world, dev):
    if world == 1:
        return
    addr, port = master_addr(), master_port()
    if addr.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
        # All ranks are on this host: bind gloo to loopback instead of the
        # address of a hostname that may not resolve.
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # use_libuv=0: torch >= 2.4's TCPStore defaults to libuv, which Debian's
    # torch is built without; torch 1.13 ignores the parameter.
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method="tcp://%s:%d?use_libuv=0" % (addr, port), rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=5))


def build_model(a):
    torch.manual_seed(a.seed)
    layers = []
    for i in range(a.layers):
        layers.append(torch.nn.Linear(a.size, a.size))
        if i == 0:
            layers.append(torch.nn.BatchNorm1d(a.size))
        layers.append(torch.nn.Tanh())
    layers.append(torch.nn.Linear(a.size, 4))
    return torch.nn.Sequential(*layers)


def build_optimizer(a, params):
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.lr)
    if a.optimizer == "momentum":
        return torch.optim.SGD(params, lr=a.lr, momentum=0.9)
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=a.lr)
    return torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01)


class Data:
    """Batches as a function of (seed, step, rank): nothing to restore."""

    def __init__(self, a, rank, dev):
        g = torch.Generator().manual_seed(a.seed * 7919 + 17)
        self.teacher = torch.randn(a.size, 4, generator=g) / a.size ** 0.5
        self.a, self.rank, self.dev = a, rank, dev

    def batch(self, step):
        g = torch.Generator().manual_seed((self.a.seed * 1000003 + step) * 4099 + self.rank)
        x = torch.randn(self.a.batch, self.a.size, generator=g)
        return x.to(self.dev), torch.tanh(x @ self.teacher).to(self.dev)


def allreduce_per_parameter(_, bucket):
    """DDP communication hook: average each parameter's gradient with its
    own all-reduce. DDP reduces a process's first iteration in one bucket and
    then rebuilds its buckets in gradient order; gloo's ring all-reduce sums
    an element in an order that depends on its offset in the bucket, so the
    first step after a restart would differ in the last bits from the same
    step of an uninterrupted run. Per parameter, the layout never changes."""
    world = dist.get_world_size()
    futs = [dist.all_reduce(g, async_op=True).get_future() for g in bucket.gradients()]
    buf = bucket.buffer()  # the gradients are views into it

    def average(all_done):
        # collect_all completes even when an all-reduce failed (a peer
        # died): value() raises its error, so backward() fails instead of
        # stepping, and saving, on partial sums.
        for f in all_done.value():
            f.value()
        return buf.div_(world)

    return torch.futures.collect_all(futs).then(average)


class FileCheckpoint:
    """The status quo the goodput benchmark measures reft against (make
    bench; docs/BENCHMARKS.md): rank 0 saves the DDP job's whole state (the
    replicas are identical) with torch.save, synchronously, to
    DIR/ckpt-<step>.pt, fsynced and renamed into place, so a file with that
    name is complete; the other ranks wait for it at a barrier. The two
    newest are kept. Every rank restores the newest; the ranks must agree
    on which (a directory that every node sees)."""

    PREFIX, SUFFIX = "ckpt-", ".pt"

    def __init__(self, d, model, opt, rank, world, dev, log):
        self.d, self.model, self.opt, self.rank, self.world, self.dev, self.log = d, model, opt, rank, world, dev, log
        os.makedirs(d, exist_ok=True)

    def steps(self):
        out = []
        for name in os.listdir(self.d):
            if name.startswith(self.PREFIX) and name.endswith(self.SUFFIX):
                try:
                    out.append(int(name[len(self.PREFIX):-len(self.SUFFIX)]))
                except ValueError:
                    pass
        return sorted(out)

    def path(self, step):
        return os.path.join(self.d, "%s%09d%s" % (self.PREFIX, step, self.SUFFIX))

    def restore(self):
        steps = self.steps()
        step = steps[-1] if steps else None
        if self.world > 1:
            seen = [None] * self.world
            dist.all_gather_object(seen, step)
            if len(set(seen)) != 1:
                raise reft.Error("ranks see different newest checkpoints in %s (%s): --ckpt-dir must be a directory "
                                 "that every node shares" % (self.d, seen))
        if step is None:
            return None
        state = torch.load(self.path(step), map_location=self.dev, weights_only=True)
        if state.get("step") != step:
            raise reft.Error("%s holds step %r, its name says %d: remove it or point --ckpt-dir elsewhere"
                             % (self.path(step), state.get("step"), step))
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict({"state": state["optimizer_state"],
                                  "param_groups": self.opt.state_dict()["param_groups"]})
        return step

    def save(self, step):
        t0 = time.perf_counter()
        size = 0
        if self.rank == 0:
            path = self.path(step)
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                # The optimizer's hyperparameters (param_groups, floats that
                # this torch's weights_only loader refuses) come from the
                # flags; its per-parameter state is tensors.
                torch.save({"step": step, "model": self.model.state_dict(),
                            "optimizer_state": self.opt.state_dict()["state"]}, f)
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            os.replace(tmp, path)
            fd = os.open(self.d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            for old in self.steps()[:-2]:
                try:
                    os.remove(self.path(old))
                except OSError:
                    pass  # the next save tries again
        if self.world > 1:
            dist.barrier()  # nobody trains on until the checkpoint is complete
        blocked = time.perf_counter() - t0
        self.log("checkpoint step %d: %d bytes to %s, blocked %.1f ms" % (step, size, self.d, blocked * 1000))
        return blocked


def params_sha256(module):
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def train(a, rank, world, dev):
    log = (lambda *x: print(*x, flush=True)) if rank == 0 else (lambda *x: None)
    model = build_model(a).to(dev)
    if a.hold_step is not None:
        n = len(list(model.parameters()))
        if a.hold_tensor >= n:
            raise reft.Error("--hold-in-update %s: the model has %d parameter tensors (0..%d)"
                             % (a.hold_in_update, n, n - 1))
        if not os.environ.get("REFT_AGENT_SOCKET"):
            raise reft.Error("--hold-in-update needs reft snapshots (srun --reft=...): only a JIT flush "
                             "ends the hold")
    ddp = model
    if world > 1:
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)  # broadcasts rank 0's state
        ddp.register_comm_hook(None, allreduce_per_parameter)
    opt = build_optimizer(a, ddp.parameters())
    data = Data(a, rank, dev)

    ck = None
    fck = None
    resumed = None
    if a.ckpt_dir:
        if os.environ.get("REFT_AGENT_SOCKET"):
            raise reft.Error("--ckpt-dir and reft snapshots (srun --reft) are exclusive: drop --ckpt-dir or launch "
                             "with --reft=off")
        fck = FileCheckpoint(a.ckpt_dir, model, opt, rank, world, dev, log)
        resumed = fck.restore()
        if resumed is not None:
            if resumed > a.steps:
                raise reft.Error("restored step %d is past --steps %d" % (resumed, a.steps))
            log("resumed from step %d" % resumed)
    elif os.environ.get("REFT_AGENT_SOCKET"):
        # rank and world from torch.distributed; JIT flush on notices. rng=False:
        # the ranks draw no random numbers after start-up (batches come from
        # their own generators), so there is no RNG state to keep, and without
        # per-rank state --reft=...,every=0 can restore a lost rank from its peers.
        ck = Checkpointer(ddp, opt, undo=a.undo or False, rng=False)
        ck.flush_on_signal()  # and at Slurm's SIGTERM, within its KillWait
        resumed = ck.restore()
        if resumed is not None:
            if resumed > a.steps:
                raise reft.Error("restored step %d is past --steps %d" % (resumed, a.steps))
            log("resumed from step %d" % resumed)
    else:
        log("snapshots off: REFT_AGENT_SOCKET is not set (run under srun --reft=arc)")
    log("%s: %d ranks on %s, %d layers of width %d (%d parameters), optimizer %s, lr %g, batch %d per rank"
        % (PROG, world, dev.type, a.layers, a.size, sum(p.numel() for p in model.parameters()), a.optimizer,
           a.lr, a.batch))

    total, ran = 0.0, 0
    blocked, saves = 0.0, 0  # time training waited in the file checkpoint's saves
    for step in range((resumed or 0) + 1, a.steps + 1):
        if resumed is None and step == a.fail_step and rank == a.fail_rank:
            print("%s: rank %d: --fail-at %d:%d: SIGKILL" % (PROG, rank, step, rank), file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        x, y = data.batch(step)
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        if resumed is None and step == a.hold_step:
            ck.undo.hold(a.hold_tensor, note=lambda: print(
                "%s: hold-in-update: rank %d holds in step %d's update before tensor %d until a JIT flush "
                "interrupts it" % (PROG, rank, step, a.hold_tensor), file=sys.stderr, flush=True))
        try:
            opt.step()  # the Checkpointer's hook orders it after the last snapshot's copy
        except UpdateInterrupted:
            # The flush that interrupted the step saves step-1 from its own
            # (daemon) thread: wait for it, or save step-1 here, before
            # the process ends and takes that thread with it.
            ck.session.flush("training stopped: step %d's update was interrupted" % step, timeout=10.0)
            raise
        if ck is not None and a.save_every and step % a.save_every == 0:
            ck.save(step)  # copies in the background during the next forward/backward
        elif ck is not None:
            ck.consistent(step)  # a JIT flush after a failure saves this step
        if fck is not None and a.save_every and step % a.save_every == 0:
            blocked += fck.save(step)
            saves += 1
        if step % a.log_every == 0 or step == a.steps:
            log("step %d loss %.9g" % (step, loss.item()))
        total += time.perf_counter() - t0
        ran += 1
    if ck is not None:
        ck.close()

    digest = params_sha256(model)
    if world > 1:
        # DDP keeps replicas identical; a difference is a bug worth failing on.
        digests = [None] * world
        dist.all_gather_object(digests, digest)
        bad = [r for r, d in enumerate(digests) if d != digest]
        if bad:
            raise RuntimeError("replicas differ: ranks %s end with other parameters than rank %d" % (bad, rank))
    if ran:
        log("mean-step-ms: %.3f" % (total * 1000 / ran))
    if saves:
        log("save-blocked-ms: %.3f per save, %d saves" % (blocked * 1000 / saves, saves))
    log("final-params-sha256: %s" % digest)


def main(argv):
    a = parse_args(argv)
    rank, world = env_int("SLURM_PROCID", 0), env_int("SLURM_NTASKS", 1)
    if a.fail_rank is not None and a.fail_rank >= world:
        raise SystemExit("%s: --fail-at %s: rank %d does not exist in a world of %d"
                         % (PROG, a.fail_at, a.fail_rank, world))
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    # cuBLAS is deterministic only with a fixed workspace; set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        dev = pick_device(a)
        init_distributed(rank, world, dev)
        train(a, rank, world, dev)
    except (reft.Error, RuntimeError) as e:
        print("%s: rank %d: %s" % (PROG, rank, e), file=sys.stderr, flush=True)
        return 1
    if world > 1:
        # Every rank past its last collective before any tears gloo down: a
        # rank whose peers closed their connections mid-teardown was seen to
        # abort at exit on PyTorch 2.6 ("terminate called without an active
        # exception" after its final hash), which reft run counts as a rank
        # failure and relaunches.
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
