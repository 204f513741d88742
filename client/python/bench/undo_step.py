"""The step cost of reft.undo.UpdateUndo against torch's own step, in the
same run (docs/BENCHMARKS.md, "Update-undo"): a 4 x 1024x1024 Linear MLP
(4.2M parameters) on CPU, one thread, 8 steps per round (2 warm-up),
rounds alternating plain and undo, twice each. Prints, per optimizer, the
ratio of optimizer.step() times and of whole iterations.

    cd client/python && /usr/bin/python3 bench/undo_step.py
"""
import os
import sys, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from reft.undo import UpdateUndo
torch.set_num_threads(1)
def mk(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])  # 4.2M params
for name, ctor in [("sgd-momentum", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)),
                   ("adam", lambda ps: torch.optim.Adam(ps, lr=1e-3)),
                   ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3))]:
    res = {}
    for undo in (False, True, False, True):
        m = mk(0); opt = ctor(m.parameters())
        if undo: UpdateUndo(opt).install()
        x = torch.randn(64, 1024)
        fb = st = 0.0
        for s in range(8):
            opt.zero_grad()
            t0 = time.perf_counter(); m(x).square().mean().backward(); t1 = time.perf_counter()
            opt.step(); t2 = time.perf_counter()
            if s >= 2: fb += t1 - t0; st += t2 - t1
        res.setdefault(undo, []).append((fb, st))
    f = lambda u, i: sum(r[i] for r in res[u])
    print("%-13s step() undo/plain %.2f; fwd+bwd+step undo/plain %.2f (plain step %.1f ms, fwd+bwd %.1f ms)" % (
        name, f(True,1)/f(False,1), (f(True,0)+f(True,1))/(f(False,0)+f(False,1)), f(False,1)/12*1e3, f(False,0)/12*1e3))
