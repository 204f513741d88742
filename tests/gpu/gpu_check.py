"""reft.torch on a GPU: correctness and cost of the CUDA snapshot path.

Run by tests/gpu/run.sh (see there). Prints, for docs/BENCHMARKS.md:

1. bit-exact save and restore of a CUDA model with AdamW (fp32 and bf16;
   foreach, fused and capturable), a resumed run equal to an uninterrupted
   one, and a run with a Checkpointer equal to one without;
2. FSDP2 (fully_shard, one GPU, world 1) save and restore, and a layout
   change refused (when torch has fully_shard);
3. D2H bandwidth into the agent's arena (through reft.torch's copy stream)
   against PyTorch's own pinned copy_(non_blocking=True) of the same bytes;
4. step-time overhead of a snapshot every step on a GPT-style model (bf16,
   AdamW), rounds with and without snapshots interleaved, and the time
   save() blocks the training thread.

--cpu runs the same code on CPU tensors at toy sizes (the dry run of the
script; no numbers worth reporting). Exit status 1 when a check fails.
"""

import argparse
import contextlib
import datetime
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import reft
from reft._streams import CudaStreams
from reft.torch import Checkpointer

FAILED = []


def say(*a):
    print(*a, flush=True)


def check(ok, what):
    say("  %s %s" % ("PASS" if ok else "FAIL", what))
    if not ok:
        FAILED.append(what)


class Agent:
    def __init__(self, binary, store_dir):
        args = [binary] + (["--dir", store_dir] if store_dir else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.path = self.proc.stdout.readline().strip()
        if not self.path:
            raise SystemExit("the agent printed no socket path")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def session(agent):
    return reft.Session(socket_path=agent.path, rank=0, world=1, local_rank=0)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def digest(model, opt):
    """sha256 of every byte of the parameters, buffers and optimizer state."""
    h = hashlib.sha256()
    for n, t in list(model.state_dict().items()):
        t = t.to_local() if hasattr(t, "to_local") else t
        h.update(n.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for i, st in sorted(opt.state_dict()["state"].items()):
        for k, v in sorted(st.items()):
            if torch.is_tensor(v):
                v = v.to_local() if hasattr(v, "to_local") else v
                h.update(("%d %s %s %s %s" % (i, k, v.dtype, tuple(v.shape), v.device.type)).encode())
                h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(("%d %s %r" % (i, k, v)).encode())
    return h.hexdigest()[:16]


# --- 1. bit-exact ------------------------------------------------------------

def small_model(dev, dtype, seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 64),
                      nn.BatchNorm1d(64), nn.Linear(64, 16))
    m.register_buffer("seen", torch.zeros((), dtype=torch.int64))
    return m.to(device=dev, dtype=dtype) if dtype != torch.int64 else m.to(dev)


def small_step(m, opt, step, dev, dtype):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(32, 64, generator=g).to(dev, dtype)
    y = torch.randn(32, 16, generator=g).to(dev, dtype)
    opt.zero_grad()
    F.mse_loss(m(x).float(), y.float()).backward()
    opt.step()
    with torch.no_grad():
        m.seen.add_(1)


def dropout_resume(agent, dev):
    say("\n== 1b. dropout + StepLR + RNG resume bit-identical, and torch.compile names (%s) ==" % dev)

    def build(seed):
        torch.manual_seed(seed)
        m = nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.3), nn.GELU(), nn.Linear(256, 16)).to(dev)
        o = torch.optim.AdamW(m.parameters(), lr=1e-2)
        return m, o, torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)

    def steps(m, o, sch, rng, ck=None):
        for st in rng:
            g = torch.Generator().manual_seed(100 + st)
            x = torch.randn(32, 64, generator=g).to(dev)
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
            sch.step()
            if ck is not None:
                ck.save(st)

    try:
        torch.manual_seed(5)
        m, o, sch = build(1)
        torch.cuda.manual_seed_all(5) if dev.type == "cuda" else None
        steps(m, o, sch, range(1, 9))
        want = digest(m, o) + " " + repr(torch.rand(2, device=dev).tolist())
        m, o, sch = build(1)
        torch.cuda.manual_seed_all(5) if dev.type == "cuda" else None
        ck = Checkpointer(m, o, session=session(agent), jit=False, extra={"sched": sch})
        steps(m, o, sch, range(1, 5), ck)
        ck.close()
        ck.session.close()
        m, o, sch = build(2)
        torch.manual_seed(77)
        torch.cuda.manual_seed_all(77) if dev.type == "cuda" else None
        ck = Checkpointer(m, o, session=session(agent), jit=False, extra={"sched": sch})
        step = ck.restore()
        steps(m, o, sch, range(step + 1, 9), ck)
        ck.wait()
        got = digest(m, o) + " " + repr(torch.rand(2, device=dev).tolist())
        ck.close()
        ck.session.close()
        check(step == 4 and got == want, "dropout/StepLR/RNG resume from step %s bit-identical to "
              "the uninterrupted run (%s == %s)" % (step, got, want))
    except Exception:
        traceback.print_exc()
        check(False, "dropout resume: raised")
    if not hasattr(torch, "compile"):
        say("  torch.compile: not in torch %s" % torch.__version__)
        return
    try:
        m, o, sch = build(3)
        cm = torch.compile(m)
        ck = Checkpointer(cm, o, session=session(agent), jit=False)
        names = [n for n, _ in cm.named_parameters()][:2]
        steps(cm, o, sch, range(1, 3), ck)
        ck.wait()
        want = digest(m, o)
        ck.close()
        ck.session.close()
        m2, o2, _ = build(4)
        ck = Checkpointer(m2, o2, session=session(agent), jit=False)
        step = ck.restore()
        sync(dev)
        check(step == 2 and digest(m2, o2) == want, "torch.compile'd model (names %s) restores into "
              "the plain one bit-exact" % names)
        ck.close()
        ck.session.close()
    except Exception:
        traceback.print_exc()
        check(False, "torch.compile: raised")


def bit_exact(agent, dev):
    say("\n== 1. bit-exact save and restore (%s) ==" % dev)
    variants = [("fp32 foreach", torch.float32, {}), ("bf16 foreach", torch.bfloat16, {})]
    if dev.type == "cuda":
        variants += [("fp32 fused", torch.float32, {"fused": True}),
                     ("bf16 fused", torch.bfloat16, {"fused": True}),
                     ("fp32 capturable", torch.float32, {"capturable": True, "foreach": False})]
    for name, dtype, kw in variants:
        try:
            # plain torch, 6 steps
            m0 = small_model(dev, dtype, 1)
            o0 = torch.optim.AdamW(m0.parameters(), lr=1e-3, **kw)
            for st in range(1, 7):
                small_step(m0, o0, st, dev, dtype)
            plain6 = digest(m0, o0)
            # with reft: 3 steps, save each
            m1 = small_model(dev, dtype, 1)
            o1 = torch.optim.AdamW(m1.parameters(), lr=1e-3, **kw)
            ck = Checkpointer(m1, o1, session=session(agent), jit=False)
            kinds = type(ck._streams).__name__
            for st in range(1, 4):
                small_step(m1, o1, st, dev, dtype)
                ck.save(st)
            ck.wait()
            at3 = digest(m1, o1)
            ck.close()
            ck.session.close()
            # a fresh process' model: other seed, restore, continue to 6
            m2 = small_model(dev, dtype, 2)
            o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3, **kw)
            ck2 = Checkpointer(m2, o2, session=session(agent), jit=False)
            step = ck2.restore()
            sync(dev)
            restored = digest(m2, o2)
            for st in range(step + 1, 7):
                small_step(m2, o2, st, dev, dtype)
                ck2.save(st)
            ck2.wait()
            resumed6 = digest(m2, o2)
            ck2.close()
            ck2.session.close()
            check(step == 3 and restored == at3,
                  "%s %s: restore of step %s bit-exact (%s == %s)" % (kinds, name, step, restored, at3))
            check(resumed6 == plain6,
                  "%s %s: resumed run == uninterrupted run without reft at step 6 (%s == %s)"
                  % (kinds, name, resumed6, plain6))
        except Exception:
            traceback.print_exc()
            check(False, "%s: raised" % name)


# --- 2. FSDP2 ------------------------------------------------------------------

def fsdp2(agent, dev):
    say("\n== 2. FSDP2 fully_shard, world 1 (%s) ==" % dev)
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except Exception as e:  # ImportError; Debian's 1.13 on Python 3.11 fails with ValueError
        say("  not run: torch %s has no torch.distributed.fsdp.fully_shard (%s)" % (torch.__version__, e))
        return
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        def build(seed):
            torch.manual_seed(seed)
            m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)).to(dev)
            for layer in m:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(m)
            with torch.no_grad():  # FSDP2's lazy init, before the Checkpointer sees the shards
                m(torch.zeros(1, 64, device=dev))
            return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

        m, o = build(1)
        ck = Checkpointer(m, o, session=session(agent), jit=False)
        for st in range(1, 4):
            small_step_fsdp(m, o, st, dev)
            ck.save(st)
        ck.wait()
        want = digest(m, o)
        ck.close()
        ck.session.close()
        m2, o2 = build(2)
        ck2 = Checkpointer(m2, o2, session=session(agent), jit=False)
        step = ck2.restore()
        sync(dev)
        check(step == 3 and digest(m2, o2) == want, "FSDP2 restore of step %s bit-exact" % step)
        ck2.close()
        ck2.session.close()
        # The same model, not sharded: its state no longer matches the layout.
        torch.manual_seed(3)
        m3 = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)).to(dev)
        o3 = torch.optim.AdamW(m3.parameters(), lr=1e-3)
        ck3 = Checkpointer(m3, o3, session=session(agent), jit=False)
        try:
            ck3.restore()
            check(False, "a layout change (FSDP2 -> plain) is refused: it restored")
        except reft.Error as e:
            check("layout" in str(e), "a layout change is refused: %s" % e)
        ck3.close()
        ck3.session.close()
    except Exception:
        traceback.print_exc()
        check(False, "FSDP2: raised")
    finally:
        dist.destroy_process_group()


def small_step_fsdp(m, opt, step, dev):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(8, 64, generator=g).to(dev)
    opt.zero_grad()
    m(x).square().mean().backward()
    opt.step()


# --- 3. bandwidth ---------------------------------------------------------------

def bandwidth(agent, dev, nbytes):
    say("\n== 3. D2H bandwidth: into the arena vs PyTorch pinned copy_(non_blocking=True) (%s) =="
        % dev)
    m = nn.Module()
    m.w = nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev).normal_())
    cuda = dev.type == "cuda"
    s = session(agent)
    ck = Checkpointer(m, None, session=s, jit=False,
                      streams=CudaStreams(dev, timing=True) if cuda else None)
    ck.save(0).wait()  # maps (and registers) the arena
    regs = [(p, mp._cudart is not None) for p, mp in s._arenas._maps.items()]
    say("  arena mappings registered with cudaHostRegister: %s" % regs)
    src = m.w.detach().view(-1).view(torch.uint8)
    pinned = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=cuda)
    side = torch.cuda.Stream(dev) if cuda else None
    arena, torch_pinned = [], []
    for i in range(5):
        h = ck.save(i + 1)
        done = ck._mover.done
        h.wait()
        if cuda:
            arena.append(done.reft_start.elapsed_time(done) / 1e3)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(side):
                a.record(side)
                pinned.copy_(src, non_blocking=True)
                b.record(side)
            b.synchronize()
            torch_pinned.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            pinned.copy_(src)
            torch_pinned.append(time.perf_counter() - t)
            arena.append(float("nan"))
    gbs = lambda secs: nbytes / statistics.median(secs) / 1e9  # noqa: E731
    if cuda:
        ratio = gbs(arena) / gbs(torch_pinned)
        say("  %.2f GiB: arena %.1f GB/s, torch pinned %.1f GB/s, ratio %.3f (target >= 0.9)"
            % (nbytes / 2**30, gbs(arena), gbs(torch_pinned), ratio))
        say("  arena copies (s): %s" % ["%.4f" % x for x in arena])
        say("  pinned copies (s): %s" % ["%.4f" % x for x in torch_pinned])
        check(ratio >= 0.9, "D2H into the arena at >= 0.9x of torch's pinned copy (%.3f)" % ratio)
    else:
        say("  (CPU dry run: torch copy %.1f GB/s; no arena timing on CPU)" % gbs(torch_pinned))
    ck.close()
    s.close()


# --- 4. overhead ------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 (the CPU dry run)
            w = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
            w = w.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            a = w.softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def overhead(agent, dev, cfg, rounds, per_round):
    say("\n== 4. step-time overhead of a snapshot every step (%s) ==" % dev)
    vocab, d, layers, heads, ctx, batch = cfg
    torch.manual_seed(0)
    model = GPT(vocab, d, layers, heads, ctx).to(dev, torch.bfloat16)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=dev).manual_seed(1)
    data = torch.randint(0, vocab, (batch, ctx + 1), device=dev, generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(data[:, :-1])
        F.cross_entropy(logits.view(-1, vocab).float(), data[:, 1:].reshape(-1)).backward()
        opt.step()

    s = session(agent)
    ck = Checkpointer(model, opt, session=s, jit=False)
    state_bytes = sum(b.size for b in s._buffers)
    say("  GPT: %.0fM params, d=%d, %d layers, batch %d x %d tokens, bf16, AdamW; snapshot %.2f GiB"
        % (nparams / 1e6, d, layers, batch, ctx, state_bytes / 2**30))
    for i in range(3):  # warm up both ways (the first save maps and registers the arena)
        step()
        ck.save(i)
    ck.wait()
    step()
    sync(dev)
    if dev.type == "cuda":
        say("  GPU memory: %.1f GiB allocated, %.1f GiB peak"
            % (torch.cuda.memory_allocated(dev) / 2**30, torch.cuda.max_memory_allocated(dev) / 2**30))
    with_s, without, blocking, waiting, commits = [], [], [], [], []
    n = 100
    for r in range(rounds):
        for mode in (("reft", "plain") if r % 2 == 0 else ("plain", "reft")):
            ck.wait()
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(per_round):
                step()
                if mode == "reft":
                    n += 1
                    b0 = time.perf_counter()
                    ck.wait()  # the previous snapshot's commit (save() waits for it anyway)
                    b1 = time.perf_counter()
                    h = ck.save(n)
                    b2 = time.perf_counter()
                    waiting.append(b1 - b0)
                    blocking.append(b2 - b0)
            # Until the compute stream has run every step. The last
            # snapshot's copy and commit overlap the next round's steps in a
            # run that goes on; here they are waited for outside the timing.
            if dev.type == "cuda":
                torch.cuda.current_stream(dev).synchronize()
            (with_s if mode == "reft" else without).append((time.perf_counter() - t0) / per_round)
            if mode == "reft":
                h.wait()
                commits.append(h.checksum_s)
    ratios = [a / b for a, b in zip(with_s, without)]
    say("  step time, plain:        %s s (median %.4f)" % (["%.4f" % x for x in without], statistics.median(without)))
    say("  step time, snapshot/step: %s s (median %.4f)" % (["%.4f" % x for x in with_s], statistics.median(with_s)))
    say("  per-round ratio: %s; median %.4f (target <= 1.01)"
        % (["%.4f" % x for x in ratios], statistics.median(ratios)))
    say("  save() blocking per snapshot: median %.2f ms, max %.2f ms (%d saves); of it waiting "
        "for the previous commit: median %.2f ms, max %.2f ms; issuing (T_SAVE + copies): median %.2f ms"
        % (statistics.median(blocking) * 1e3, max(blocking) * 1e3, len(blocking),
           statistics.median(waiting) * 1e3, max(waiting) * 1e3,
           statistics.median([b - w for b, w in zip(blocking, waiting)]) * 1e3))
    say("  agent checksum per commit (checksum_s): %s" % (["%.3f" % (c or 0) for c in commits]))
    if dev.type == "cuda":
        # What a checksum on the GPU would cost: one memory-bound pass over
        # the same tensors (an int32 sum per tensor, standing in for a hash).
        srcs = [e.source() for e in ck._params + ck._state if e.copied.device.type == "cuda"]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(2):
            a.record()
            for x in srcs:
                (x.view(torch.int32) if x.numel() % 4 == 0 else x).sum(dtype=torch.int64)
            b.record()
            b.synchronize()
        say("  one pass over the snapshot's %d device tensors on the GPU (int32 sums): %.2f ms"
            % (len(srcs), a.elapsed_time(b)))
        bound = state_bytes / 55e9 + statistics.median([c or 0 for c in commits])
        say("  a snapshot every step is sustainable when a step takes longer than the copy plus the "
            "agent's checksum: ~%.3f s here" % bound)
    if dev.type == "cuda":
        check(statistics.median(ratios) <= 1.01, "snapshot every step costs <= 1.01x (%.4f)"
              % statistics.median(ratios))
    ck.close()
    s.close()


def example_and_flush(agent, dev):
    say("\n== 5. examples/torch_ddp.py resumes bit-identical; a JIT flush of device state (%s) ==" % dev)
    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch_ddp.py")
    if not os.path.exists(ex):
        say("  examples/torch_ddp.py: not in this tree")
    else:
        env = dict(os.environ, REFT_AGENT_SOCKET=agent.path)
        env.pop("SLURM_PROCID", None)
        env.pop("SLURM_NTASKS", None)
        flags = ["--device", dev.type, "--size", "256", "--layers", "4"]
        out = {}
        for name, steps, e in (("first", 4, env), ("resumed", 8, env),
                               ("plain", 8, {k: v for k, v in env.items() if k != "REFT_AGENT_SOCKET"})):
            r = subprocess.run([sys.executable, ex, "--steps", str(steps)] + flags, env=e,
                               capture_output=True, text=True, timeout=120)
            lines = r.stdout.splitlines()
            out[name] = ([l for l in lines if l.startswith("final-params-sha256")],
                         [l for l in lines if "resumed" in l or "ranks on" in l], r.returncode, r.stderr[-500:])
            say("  %s: rc %d %s %s" % (name, r.returncode, out[name][1], out[name][0]))
            if r.returncode:
                say(r.stderr[-2000:])
        check(out["resumed"][0] and out["resumed"][0] == out["plain"][0] and
              any("resumed from step 4" in l for l in out["resumed"][1]),
              "torch_ddp.py on %s: resumed at step 4, ends with the bits of the uninterrupted run" % dev.type)
    try:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Linear(64, 8)).to(dev)
        o = torch.optim.AdamW(m.parameters(), lr=1e-2)
        s = session(agent)
        ck = Checkpointer(m, o, session=s, jit=False)
        for st in range(1, 4):
            x = torch.randn(16, 64, device=dev)
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
            ck.consistent(st)  # no save: a flush must take step 3
        want = digest(m, o)
        m(torch.randn(16, 64, device=dev))  # the next forward changes BatchNorm's stats
        step, saved = s.flush("test", timeout=30)
        ck.close()
        s.close()
        torch.manual_seed(9)
        m2 = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Linear(64, 8)).to(dev)
        o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
        ck2 = Checkpointer(m2, o2, session=session(agent), jit=False)
        got_step = ck2.restore()
        got = digest(m2, o2)
        ck2.close()
        ck2.session.close()
        check((step, saved, got_step, got) == (3, True, 3, want),
              "JIT flush of the consistent step 3 from device tensors restores bit-exact (%s %s %s)"
              % (step, saved, got_step))
    except Exception:
        traceback.print_exc()
        check(False, "JIT flush: raised")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--store-dir", default="")
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU tensors at toy sizes")
    ap.add_argument("--only", default="12345")
    a = ap.parse_args()
    dev = torch.device("cpu" if a.cpu else "cuda:0")
    say("reft tests/gpu: %s UTC, torch %s, python %s, %s" % (
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), torch.__version__, platform.python_version(),
        torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU dry run"))
    if dev.type == "cuda":
        torch.cuda.init()
        rt = torch.cuda.cudart()
        say("cudart bindings: cudaHostRegister %s" % hasattr(rt, "cudaHostRegister"))
    agent = Agent(a.agent, a.store_dir)
    t0 = time.time()
    try:
        if "1" in a.only:
            bit_exact(agent, dev)
            dropout_resume(agent, dev)
        if "2" in a.only:
            fsdp2(agent, dev)
        if "3" in a.only:
            bandwidth(agent, dev, (64 << 20) if a.cpu else (4 << 30))
        if "4" in a.only:
            # vocab,d,layers,heads,ctx,batch; ';' between configurations
            cfgs = "512,64,2,4,32,4" if a.cpu else os.environ.get(
                "GPT", "50304,1536,16,12,2048,40;50304,1536,16,12,2048,12")
            for c in cfgs.split(";"):
                overhead(agent, dev, tuple(int(x) for x in c.split(",")), rounds=2 if a.cpu else 4,
                         per_round=3 if a.cpu else 8)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
        if "5" in a.only:
            # A fresh agent: the example registers rank 0 of its own job,
            # and the sections above left their generations under rank 0.
            agent.close()
            agent = Agent(a.agent, a.store_dir)
            example_and_flush(agent, dev)
    finally:
        agent.close()
    say("\ntotal %.0f s; %s" % (time.time() - t0, "FAILED: %s" % FAILED if FAILED else "all checks passed"))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
