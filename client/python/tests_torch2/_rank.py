"""One rank of the FSDP2 / DTensor runs of test_torch2_sharded.py
(a separate process per rank, gloo over loopback, both ranks' sessions on
the test's agent).

    python3 _rank.py CONFIG_JSON

CONFIG: kind ("fsdp": fully_shard; "dtensor": distribute_module with
Shard(0); "shard1": the weights Shard(1), the biases Shard(0);
"shard1same": only the first weight Shard(1)), phase ("plain": train steps 1..last
without reft; "save": train 1..last saving every step, then die without
closing anything, as a killed rank does; "resume": a new model from another
seed, restore, train restored+1..last saving every step), rank, init
(tcp://...), last, world (default 2). Prints JSON lines: {"step": s, "hash": ...} after each
step, {"restored": s, "state": hash after the restore} or {"error": msg}.
"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

cfg = json.loads(sys.argv[1])
rank, kind, phase = cfg["rank"], cfg["kind"], cfg["phase"]
torch.set_num_threads(1)
world = cfg.get("world", 2)
dist.init_process_group("gloo", init_method=cfg["init"], rank=rank, world_size=world)

from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

try:
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
except ImportError:  # torch 2.3, 2.4
    from torch.distributed._tensor import Replicate, Shard, distribute_module, distribute_tensor

import reft  # noqa: E402
from reft.torch import Checkpointer  # noqa: E402


def emit(**kw):
    print(json.dumps(kw), flush=True)


def cpu_fsdp2_shim():
    """torch 2.6's FSDP2 drives its collectives through torch.cpu's stream
    stand-ins on a CPU mesh, and torch.cpu.Stream has no record_event()
    (foreach_all_gather calls all_gather_stream.record_event(): an
    AttributeError at the first forward). CPU work is synchronous, so there
    is nothing to wait for: record_event() returns None, which FSDP2 takes
    for "no event" (a returned torch.cpu.Event() instead reaches
    finalize_backward's torch.cuda.current_stream().wait_event(), which
    fails without CUDA). The shim is the test's, not reft's."""
    import torch.cpu as c
    if not hasattr(c.Stream, "record_event"):
        c.Stream.record_event = lambda self, event=None: None
    if not hasattr(c.Stream, "wait_event"):
        c.Stream.wait_event = lambda self, event: None


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6 upstream
        return fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4, 2.5
        return fully_shard


mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0 if phase != "resume" else 77)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

if kind == "fsdp":
    cpu_fsdp2_shim()
    fully_shard = fully_shard_fn()
    # reshard_after_forward=False: with resharding after forward, torch
    # 2.6's CPU path fails the backward ("one of the variables needed for
    # gradient computation has been modified by an inplace operation": the
    # all-gather output, reused in place by the backward's all-gather, was
    # saved by forward; on CUDA the streams keep them apart).
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
else:
    def partition(name, mod, mesh):
        for n, p in list(mod.named_parameters(recurse=False)):
            # shard1: the weights sharded along their other dimension (the
            # local sizes change); shard1same: only the first layer's
            # weight, [8, 6]: [8, 3] where Shard(0) gives [4, 6], the same size.
            other = (kind == "shard1" and p.dim() == 2) or (kind == "shard1same" and name == "0" and n == "weight")
            placement = Shard(1) if other else Shard(0)
            mod.register_parameter(n, torch.nn.Parameter(distribute_tensor(p, mesh, [placement])))

    model = distribute_module(
        model, mesh, partition,
        input_fn=lambda mod, inputs, mesh: tuple(
            x if hasattr(x, "placements") else
            __import__("torch.distributed.tensor", fromlist=["DTensor"]).DTensor.from_local(
                x, mesh, [Replicate()]) for x in inputs),
        output_fn=lambda mod, out, mesh: out.full_tensor())


def batch(step):
    # FSDP is data parallel: each rank its own batch. The DTensor model
    # shards the weights of one computation: every rank the same batch.
    g = torch.Generator().manual_seed(1000 + step * 2 + (rank if kind == "fsdp" else 0))
    x = torch.randn(5, 6, generator=g)
    return x, torch.sin(x[:, :3] * 2)


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def digest():
    """Every byte this rank holds: its parameter shards and its shards of
    the optimizer state."""
    h = hashlib.sha256()
    for n, p in model.named_parameters():
        h.update(n.encode())
        h.update(local(p).detach().contiguous().numpy().tobytes())
    for p in model.parameters():
        for k, v in sorted(opt.state.get(p, {}).items()):
            h.update(k.encode())
            h.update(local(v).detach().contiguous().reshape(-1).numpy().tobytes())
    return h.hexdigest()


opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
for p in model.parameters():
    assert hasattr(p, "placements"), "parameter %s is not a DTensor" % type(p).__name__
if kind == "fsdp":
    with torch.no_grad():
        model(batch(0)[0])  # FSDP2's lazy initialization, before the Checkpointer

ck = None
first = 1
if phase != "plain":
    os.environ["REFT_AGENT_SOCKET"] = cfg["socket"]
    ck = Checkpointer(model, opt, jit=False)  # rank and world from torch.distributed
    emit(registered=[{"name": b.name, "replicated": b.replicated} for b in ck.session._buffers])
    if phase == "resume":
        try:
            got = ck.restore()
        except reft.Error as e:
            emit(error=str(e))
            ck.close()
            dist.barrier()  # see the end
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        emit(restored=got, state=digest())
        first = got + 1

for step in range(first, cfg["last"] + 1):
    x, y = batch(step)
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    if ck is not None:
        ck.save(step).wait()
    emit(step=step, hash=digest())

if phase == "save":
    dist.barrier()
    os._exit(0)  # killed: no close(), no destroy_process_group()
if ck is not None:
    ck.close()
# torch 2.6 (gloo) sometimes aborts a rank in its teardown after a
# restore's all_gather_object ("terminate called without an active
# exception", SIGABRT): first seen when a rank tore the group down while
# its peer was still in it, and seen again (a CI run's unit-trixie, rank 1
# of "dtensor resume") with both ranks past a barrier first. The test's
# results are the lines emitted above; the group's teardown is torch's,
# not under test, so after the barrier the rank leaves without it.
dist.barrier()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
