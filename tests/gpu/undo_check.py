"""reft.undo on a GPU: exactness of update-undo on CUDA tensors, a JIT flush
that interrupts a held CUDA update, and the steady-state cost of
--reft=arc,every=0 with undo against plain training (issue 20).

Run by tests/gpu/run.sh --undo (see there). Prints, for docs/BENCHMARKS.md:

1. per optimizer (SGD, SGD with momentum and nesterov, Adam, AdamW in its
   foreach, fused and capturable forms) and dtype (fp32, bf16): a step
   interrupted half way through its parameter tensors is undone to the
   exact bits of the state before it; the step then taken again, and the
   run continued, ends with the bits of a plain run that never had undo
   (per-tensor stepping equals torch's multi-tensor step); the inverse's
   own largest error before the kept corrections (measure=True) and how
   many exceptions were kept; the same with keep="copy" (undo writes
   back the kept originals).
2. a JIT flush that interrupts a held update on CUDA (UpdateUndo.hold under
   a Checkpointer on an agent serving arc,every=0) saves step t-1; a fresh
   model restores it bit-exact.
3. step time of a GPT-style model (bf16, AdamW) under every=0 + undo (each
   step a heartbeat to the agent and an undoable update), with each of
   undo's kinds (keep="inverse", keep="copy"), against the same model
   without reft, rounds interleaved; GPU memory of the undo data.

--cpu runs the same code on CPU tensors at toy sizes (the dry run).
Exit status 1 when a check fails.
"""

import argparse
import datetime
import os
import platform
import statistics
import sys
import threading
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check as g  # noqa: E402  (Agent, session, digest, GPT, check, say)

import reft  # noqa: E402
from reft.torch import Checkpointer  # noqa: E402
from reft.undo import KEEP, UpdateInterrupted, UpdateUndo  # noqa: E402

say, check = g.say, g.check


class Agent(g.Agent):
    """The conformance agent serving a given --reft SPEC."""

    def __init__(self, binary, store_dir, spec):
        import subprocess
        args = [binary, "--spec", spec] + (["--dir", store_dir] if store_dir else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.path = self.proc.stdout.readline().strip()
        if not self.path:
            raise SystemExit("the agent printed no socket path")


class Stop(Exception):
    pass


def model(dev, dtype, seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 16))
    return m.to(device=dev, dtype=dtype)


def grads(m, step, dev, dtype):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(32, 64, generator=gen).to(dev, dtype)
    y = torch.randn(32, 16, generator=gen).to(dev, dtype)
    for p in m.parameters():
        p.grad = None
    F.mse_loss(m(x).float(), y.float()).backward()


OPTS = [
    ("SGD", lambda ps: torch.optim.SGD(ps, lr=0.05, weight_decay=0.01)),
    ("SGD momentum nesterov", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True,
                                                         weight_decay=0.01)),
    ("Adam", lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01)),
    ("AdamW foreach", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01)),
    ("AdamW maximize", lambda ps: torch.optim.AdamW(ps, lr=1e-3, maximize=True)),
]
CUDA_OPTS = [
    ("AdamW fused", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True)),
    ("Adam fused", lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True)),
    ("AdamW capturable", lambda ps: torch.optim.AdamW(ps, lr=1e-3, capturable=True, foreach=False)),
    ("SGD fused", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True)),
]


def exactness(dev):
    say("\n== U1. update-undo on %s tensors: undone bits, resumed bits ==" % dev.type)
    opts = OPTS + (CUDA_OPTS if dev.type == "cuda" else [])
    steps, cut = 6, 4
    rows = []
    for name, mk, dtype, keep in ((n, mk, dt, k) for n, mk in opts for k in KEEP
                                  for dt in (torch.float32, torch.bfloat16)):
        label = "%s %s%s" % (name, str(dtype).replace("torch.", ""), "" if keep == "inverse" else ", keep=copy")
        try:
            m0 = model(dev, dtype, 1)
            o0 = mk(m0.parameters())
            for st in range(1, steps + 1):
                grads(m0, st, dev, dtype)
                o0.step()
            want = g.digest(m0, o0)

            m1 = model(dev, dtype, 1)
            o1 = mk(m1.parameters())
            ntensors = sum(1 for _ in m1.parameters())
            # Chunks of at most 70,000 elements: [0..3] and [4..7] here
            # (the default makes the whole model one chunk); the stop
            # comes before the second, the first applied.
            starts, arm = [], {"at": None}

            def before(i):
                if arm["at"] is None:
                    starts.append(i)
                elif i == arm["at"]:
                    raise Stop()

            u = UpdateUndo(o1, before_tensor=before, measure=keep == "inverse", chunk_elements=70000, keep=keep)
            u.install()
            max_abs, kept, elems, nbytes = 0.0, 0, 0, 0
            undone_ok, k = None, None
            for st in range(1, steps + 1):
                grads(m1, st, dev, dtype)
                if st == cut:
                    g.sync(dev)
                    pre = g.digest(m1, o1)
                    k = arm["at"] = starts[-2] if len(starts) > 2 else None
                    try:
                        o1.step()
                        raise AssertionError("the armed step did not stop (chunk starts %s)" % starts[:4])
                    except Stop:
                        pass
                    arm["at"] = -1
                    g.sync(dev)
                    undone_ok = g.digest(m1, o1) == pre
                elif arm["at"] is None:
                    starts.clear()
                o1.step()
                s = u.stats
                max_abs = max(max_abs, float(s.get("max_abs", 0.0)))
                kept += int(s.get("exceptions", 0))
                nbytes += int(s.get("bytes", 0))
                elems += int(s.get("elements", 0))
            u.uninstall()
            got = g.digest(m1, o1)
            rows.append((label, undone_ok, got == want, max_abs, kept, elems, nbytes))
            check(undone_ok, "%s: step %d stopped before tensor %d of %d, undone to the exact prior bits"
                  % (label, cut, k, ntensors))
            check(got == want, "%s: the run then ends with the bits of a plain run without undo (%s == %s)"
                  % (label, got, want))
        except Exception:
            traceback.print_exc()
            check(False, "%s: raised" % label)
    say("\n  | optimizer, dtype | undone = prior bits | run = plain run | inverse alone, max |error| | "
        "exceptions (index + value) / elements updated | undo data B/elem |")
    say("  | --- | --- | --- | --- | --- | --- |")
    for label, u_ok, r_ok, mx, kept, el, nb in rows:
        say("  | %s | %s | %s | %.3g | %d / %d | %.2f |" % (label, u_ok, r_ok, mx, kept, el, nb / max(el, 1)))


def flush_interrupts(agent, dev):
    say("\n== U2. a JIT flush interrupts a held update on %s, saves step t-1 ==" % dev.type)
    try:
        m = model(dev, torch.float32, 3)
        o = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
        s = g.session(agent)
        if s.every != 0:
            check(False, "the agent's hello says every=%s, not 0" % s.every)
            return
        ck = Checkpointer(m, o, session=s, undo=True)
        for st in range(1, 4):
            grads(m, st, dev, torch.float32)
            o.step()
            ck.save(st)
        grads(m, 4, dev, torch.float32)
        g.sync(dev)
        want = g.digest(m, o)  # step 3's state
        out = {}

        def flush():
            out["r"] = s.flush("gpu undo check", timeout=30)

        th = []
        ck.undo.hold(2, note=lambda: th.append(threading.Thread(target=flush)) or th[0].start())
        interrupted = False
        try:
            o.step()
        except UpdateInterrupted:
            interrupted = True
        th[0].join(60)
        g.sync(dev)
        same = g.digest(m, o) == want
        ck.close()
        s.close()
        m2 = model(dev, torch.float32, 9)
        o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3, weight_decay=0.01)
        s2 = g.session(agent)
        ck2 = Checkpointer(m2, o2, session=s2, undo=True)
        got_step = ck2.restore()
        g.sync(dev)
        got = g.digest(m2, o2)
        ck2.close()
        s2.close()
        check(interrupted and same and out.get("r") == (3, True) and got_step == 3 and got == want,
              "held in step 4's update: interrupted %s, live state = step 3's %s, flush %s, restored step %s "
              "bit-exact %s" % (interrupted, same, out.get("r"), got_step, got == want))
    except Exception:
        traceback.print_exc()
        check(False, "U2: raised")


def cost(agent, dev, cfg, rounds, per_round, fused, chunk=None, profile=False):
    say("\n== U3. steady-state cost of every=0 + undo (%s, AdamW %s) ==" % (dev.type, "fused" if fused else "foreach"))
    vocab, d, layers, heads, ctx, batch = cfg
    kw = {"fused": True} if fused else {}
    built = []
    for _ in range(2):
        torch.manual_seed(0)
        mm = g.GPT(vocab, d, layers, heads, ctx).to(dev, torch.bfloat16)
        built.append((mm, torch.optim.AdamW(mm.parameters(), lr=1e-4, **kw)))
    (mp, op), (mr, orr) = built
    gen = torch.Generator(device=dev).manual_seed(1)
    data = torch.randint(0, vocab, (batch, ctx + 1), device=dev, generator=gen)
    s = g.session(agent)
    ck = Checkpointer(mr, orr, session=s, undo=True)
    if chunk is not None:
        ck.undo.chunk_elements = chunk
    nparams = sum(p.numel() for p in mr.parameters())
    ntensors = sum(1 for _ in mr.parameters())

    def step(mm, oo):
        oo.zero_grad(set_to_none=True)
        logits = mm(data[:, :-1])
        F.cross_entropy(logits.view(-1, vocab).float(), data[:, 1:].reshape(-1)).backward()
        oo.step()

    n = 0
    for keep in KEEP:  # warm both kinds up
        ck.undo.keep = keep
        step(mp, op)
        step(mr, orr)
        n += 1
        ck.save(n)
    g.sync(dev)
    peak = {}
    if dev.type == "cuda":
        g.sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        step(mp, op)
        g.sync(dev)
        peak["plain"] = (torch.cuda.max_memory_allocated(dev) - base) / 2**30
        for keep in KEEP:
            ck.undo.keep = keep
            g.sync(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
            step(mr, orr)
            n += 1
            ck.save(n)
            g.sync(dev)
            peak[keep] = (torch.cuda.max_memory_allocated(dev) - base) / 2**30
    state_gib = sum(p.numel() * p.element_size() for p in mr.parameters()) * 3 / 2**30
    say("  GPT: %.0fM params in %d tensors, d=%d, %d layers, batch %d x %d "
        "tokens, bf16; AdamW %s; parameters + optimizer state %.2f GiB"
        % (nparams / 1e6, ntensors, d, layers, batch,
           ctx, "fused" if fused else "foreach (default)", state_gib))
    modes = ("plain",) + KEEP
    times, chunks = {m: [] for m in modes}, {}
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]  # each mode first in turn
        for mode in order:
            g.sync(dev)
            t0 = time.perf_counter()
            if mode != "plain":
                ck.undo.keep = mode
            for _ in range(per_round):
                if mode != "plain":
                    step(mr, orr)
                    n += 1
                    ck.save(n)
                else:
                    step(mp, op)
            g.sync(dev)
            times[mode].append((time.perf_counter() - t0) / per_round)
            if mode != "plain":
                chunks[mode] = ck.undo.stats.get("chunks", "?")
    plain = times["plain"]
    say("  step time, plain:          %s s (median %.4f)" % (["%.4f" % x for x in plain], statistics.median(plain)))
    if "plain" in peak:
        say("    GPU memory peak above the steady state during a plain step (grads, activations): %.2f GiB"
            % peak["plain"])
    ratios = []
    for keep in KEEP:
        t = times[keep]
        rs = [a / b for a, b in zip(t, plain)]
        ratios += rs
        say("  step time, every=0 + undo (keep=%s, %s chunks): %s s (median %.4f)"
            % (keep, chunks[keep], ["%.4f" % x for x in t], statistics.median(t)))
        say("    per-round ratio against plain: %s; median %.4f" % (["%.4f" % x for x in rs], statistics.median(rs)))
        if keep in peak:
            say("    GPU memory peak above the steady state during an undoable step (grads, activations, "
                "the undo data): %.2f GiB" % peak[keep])
    check(all(x > 0 for x in ratios), "U3 measured (%d rounds)" % len(ratios))
    if profile:
        # Where an undoable step's extra time goes: torch.profiler over 3
        # steps of each mode, the ops of most self time on the device and
        # on the host.
        from torch.profiler import ProfilerActivity, profile as prof
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        for mode in modes:
            if mode != "plain":
                ck.undo.keep = mode
            g.sync(dev)
            with prof(activities=acts) as pr:
                for _ in range(3):
                    if mode != "plain":
                        step(mr, orr)
                        n += 1
                        ck.save(n)
                    else:
                        step(mp, op)
                g.sync(dev)
            ka = pr.key_averages()
            for key in (("self_cuda_time_total", "self_device_time_total") if dev.type == "cuda" else ()) + ("self_cpu_time_total",):
                try:
                    table = ka.table(sort_by=key, row_limit=12, max_name_column_width=60)
                except Exception:  # the key's name differs between torch versions
                    continue
                say("  profile, %s, 3 steps, by %s:\n%s" % (mode, key, table))
                if key != "self_cpu_time_total":
                    break
    ck.close()
    s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--store-dir", default="")
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU tensors at toy sizes")
    ap.add_argument("--only", default="123")
    ap.add_argument("--chunk", type=int, default=None, help="U3: UpdateUndo's chunk_elements (default: its own)")
    ap.add_argument("--profile", action="store_true", help="U3: print torch.profiler's top ops per mode")
    ap.add_argument("--fused-only", action="store_true", help="U3: only fused AdamW")
    a = ap.parse_args()
    dev = torch.device("cpu" if a.cpu else "cuda:0")
    say("reft tests/gpu/undo_check: %s UTC, torch %s, python %s, %s" % (
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), torch.__version__,
        platform.python_version(), torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU dry run"))
    t0 = time.time()
    if "1" in a.only:
        exactness(dev)
    agent = Agent(a.agent, a.store_dir, "arc,every=0")
    try:
        if "2" in a.only:
            flush_interrupts(agent, dev)
        if "3" in a.only:
            cfgs = "512,64,2,4,32,4" if a.cpu else os.environ.get("GPT", "50304,1024,12,16,1024,16")
            for c in cfgs.split(";"):
                for fused in ((False,) if a.cpu else (True,) if a.fused_only else (False, True)):
                    cost(agent, dev, tuple(int(x) for x in c.split(",")), rounds=2 if a.cpu else 4,
                         per_round=3 if a.cpu else 6, fused=fused, chunk=a.chunk, profile=a.profile)
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
    finally:
        agent.close()
    say("\ntotal %.0f s; %s" % (time.time() - t0, "FAILED: %s" % g.FAILED if g.FAILED else "all checks passed"))
    sys.exit(1 if g.FAILED else 0)


if __name__ == "__main__":
    main()
