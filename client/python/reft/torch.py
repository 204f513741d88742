"""reft.torch: snapshots of a PyTorch model, optimizer and the rest of a
trainer's state through reft, from GPU (CUDA) or CPU tensors.

    from reft.torch import Checkpointer
    model = DDP(Net().cuda())                # or FSDP2 fully_shard, torch.compile, CPU tensors
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1000)
    ck = Checkpointer(model, opt, extra={"sched": sched, "sampler": sampler})
    start = (ck.restore() or 0) + 1          # None: nothing to restore
    for step in range(start, steps + 1):
        loss = loss_fn(model(x), y); loss.backward()
        opt.step(); opt.zero_grad()          # ordered after the last snapshot's copy
        sched.step()
        ck.save(step)                        # returns at once; copies in the background
    ck.close()

What is snapshotted, with each generation: every parameter and buffer of
the model; the optimizer's state (SGD momentum; Adam/AdamW exp_avg,
exp_avg_sq, max_exp_avg_sq with amsgrad, and the step tensor, as torch
1.13 and 2.x make it: foreach, fused and capturable included) and its
param_groups hyperparameters (lr, betas, ...: what an LR scheduler
changes); the state_dict() of every object in ``extra`` (LR schedulers,
samplers, a stateful data loader, the user's own: anything with
state_dict/load_state_dict, as PyTorch DCP's Stateful); the RNG states
(torch's CPU generator, every CUDA device's when the process uses CUDA,
Python's random and numpy's; rng=False leaves them out); the saved step.
Not: gradients (a save comes after optimizer.step). A trainer with dropout,
a scheduler with state and a shuffled sampler resumes bit for bit with no
glue beyond passing those objects. Each extra object gets a fixed room when
the Checkpointer is created (4x its state then, at least 64 KiB); a state
that outgrows it fails save() with reft.Error saying so.

Names: torch.compile's "_orig_mod." segments are dropped, so a compiled
model and the plain one share snapshots. FSDP2 and DTensor: each rank
snapshots its local shard (DTensor.to_local(): its own memory, no
gather), and the generation records the device mesh, the placements and
the global shapes; restoring into another layout (another mesh, a sharded
model restored unsharded, ...) raises reft.Error (resharding is out of
scope). With FSDP2, create the Checkpointer after the first forward pass
(its lazy initialization may re-pad the shards); the Checkpointer calls
reshard() on the fully_shard modules first (and before a restore), since
after a forward with reshard_after_forward=False they hold the unsharded
parameters, not the shards the optimizer updates. A sharded DTensor (a
Shard or Partial placement), its optimizer state and the meta record (its
fingerprint covers the local shapes) are registered as not replicated:
the ranks hold different bytes, which arc/aec must not cut across the
group. A layout change that keeps every local size is refused by the
layout check; one that changes a size is refused by the agent (the
generation's buffers do not fit), and the error then adds that a changed
sharding layout is the likely cause. Tested on torch 2.6 over gloo (tests_torch2/): FSDP2 (world 2) and
distribute_tensor(Shard(0)) (worlds 2 and 3) resume bit for bit.

How the bytes move. The tensors are registered with the reft.Session as
external buffers (Session.register_external): a save copies them itself
through a copy stream (reft._streams):

- CUDA tensors: the session maps the agent's arena and registers it with
  the CUDA runtime (cudaHostRegister, portable; reft._arena), so the
  device-to-host copy lands in the agent's memory directly: one copy, no
  staging, at the speed of PyTorch's own pinned copy (docs/BENCHMARKS.md).
  consistent() (which save() calls) records an event on the compute stream
  (the current stream); the copies run on a dedicated copy stream that
  waits for that event, and save() returns once they are issued. The next
  optimizer.step() is fenced by the Checkpointer's hook: the compute stream
  waits for the copy's done event, on the GPU (no host synchronisation),
  so forward and backward of the next step overlap the copy. The source
  tensors are referenced until the copy has finished, so the caching
  allocator cannot reuse their memory mid-copy. The session's thread waits
  for the done event (the GIL released) and commits; the agent checksums
  the arena as for any save. Only one CUDA device per rank.
- CPU tensors: the same code path, with CpuStreams: the compute "stream"
  is the training thread (CPU work is done when the call returns), the copy
  stream a worker thread (torch's copy releases the GIL), and the fence
  before optimizer.step() is a host wait for the copy (not the commit).

Any dtype (the bytes are copied as they are). A non-contiguous tensor is
gathered into a contiguous temporary on the copy stream at every save (one
more pass over its bytes, and a temporary of its size) and restored through
one; contiguous tensors cost nothing extra. Module buffers are staged:
BatchNorm updates its running statistics during forward and DDP
rebroadcasts buffers in forward, so they would change under the copy; they
are copied into a private staging tensor (on their device) at consistent()
and the staging tensor is snapshotted.

The contract: between save() and the end of its copy the parameters and
optimizer state must not change except through optimizer.step(), which the
hook orders after the copy (register_step_pre_hook on torch >= 2.0; on
torch 1.13 optimizer.step is wrapped on the instance, in a way LR
schedulers still recognise). Do not change parameters in place outside
optimizer.step() while a save is pending (or call ck.wait() first). A
save() while the previous snapshot is still copying or committing waits
for it (one save is open per rank). A failed snapshot raises reft.Error
from the next optimizer.step() when the failure is known by then (always
for CPU tensors: the copy failed), else from the next save() or wait().

Optimizer state. torch creates it lazily at the first optimizer.step(), but
restore() at start-up must have somewhere to write it and the arena layout is
fixed at registration. So the Checkpointer creates it first, exactly as torch
would: Adam/AdamW zeros for the moments and the step tensor of the running
torch's shape, dtype and device (torch 1.13: a CPU scalar, or a 1-element
tensor with capturable/fused; torch 2.x: a 0-dim tensor, on the parameter's
device with capturable or fused). A run with a Checkpointer is then
bit-identical to one without, and resumed runs to uninterrupted ones.
SGD caveat: torch's first momentum step sets buf = clone(grad); a zero
buffer gives buf = 0*momentum + (1-dampening)*grad instead. With dampening=0
(the default) that is the same value, except that a gradient element of -0.0
gives +0.0; with dampening != 0 the first step differs from plain torch (a
warning says so). Runs with a Checkpointer agree with each other bit for bit
in every case. Other optimizers must already have their state (create the
Checkpointer after one step or after optimizer.load_state_dict); every state
value must be a tensor.

Create the Checkpointer after the model and optimizer have their final
tensors: model.to(), param.data = ..., optimizer.load_state_dict() or
add_param_group() afterwards replace tensors the session reads, and save()
raises reft.Error saying so.

Restore copies host to device into the existing tensors (in place: their
strides and storage stay), then checks the generation's fingerprint (names,
dtypes, shapes; the sharding layout) and loads the extra states.
Restore agreement: a snapshot is restorable only if every rank holds it.
When torch.distributed is initialized and the world is larger than one,
restore() all-gathers every rank's steps (dist.all_gather_object) and
restores the newest common one; a rank whose copy is found corrupt drops it
and the ranks agree again. World 1 needs no agreement. Without
torch.distributed, pass a reft.Session with agree=.

DDP: restoring the state is not all a resumed run needs to match an
uninterrupted one bit for bit. DDP builds its gradient buckets at
construction and rebuilds them once, after the first iteration, in the
order the gradients became ready (the C++ Reducer's rebuild_buckets; no
public API sets or restores that layout). A restarted process therefore
reduces its first step in the initial layout where the uninterrupted run
used the rebuilt one, and with three or more ranks the all-reduce sums an
element in an order that depends on its offset in the bucket, so that step
differs in the last bits (with two ranks a + b = b + a, and it does not).
The Checkpointer cannot restore the layout. Two ways need no other glue:
DDP(find_unused_parameters=True) never rebuilds its buckets (the reducer
rebuilds only with static_graph or without find_unused_parameters; it
costs a traversal of the autograd graph per iteration), and
static_graph=True does not help (it rebuilds too); or a communication hook
that all-reduces each parameter's gradient separately
(examples/torch_ddp.py), whose layout never changes. Checked on torch 1.13
with gloo, 3 ranks: default and static_graph differ after a resume,
find_unused_parameters=True and the hook are bit-identical.

Communication phases: under DDP the Checkpointer tells the agent that the
backward pass (DDP's gradient all-reduce) is a communication phase, from
the end of a training forward pass to optimizer.step(): the agent pauses
its background replication of unreplicated state meanwhile, and measures
each rank's own work between the phases, from which `reft status` and the
recovery log name stragglers. A forward hook, no change to the gradients.

JIT flush: with jit=True (the default) the Checkpointer's session watches
the agent's failure notices (reft.Session.watch_failures): when another node
of the job fails, the state of the last step declared consistent is saved at
once if newer than the last snapshot, so with save every N steps at most the
step in progress is lost. The optimizer hook declares the state updating
before every optimizer.step(); save(step) declares it consistent, and on
steps not saved call ck.consistent(step) after optimizer.step(). For the
step kill (SIGTERM, then SIGKILL after Slurm's KillWait) call
ck.flush_on_signal() once from the main thread. A flush issues the copies
from its own thread after the event recorded at consistent(): for CUDA
tensors it needs the GPU to reach that point of the compute stream (work
queued before consistent(), a hung collective included, must finish), else
it gives up after its timeout and says so. Module buffers and the extra
states are staged at consistent(), so a forward pass that changes them
(BatchNorm) does not tear a flushed snapshot.

undo=True (reft.undo.UpdateUndo; docs/UNDO.md) steps the optimizer in
chunks (a parameter tensor at a time on the CPU, runs of tensors on a GPU)
and keeps what undoing the step needs: a JIT flush that finds the trainer
inside optimizer.step() has it stop at the next chunk and undo the applied
ones, bit for bit (step() then raises reft.undo.UpdateInterrupted), and
saves the previous step; an exception out of the step undoes it too. SGD,
Adam and AdamW; others are refused with reft.undo.UndoUnsupported. An LR
scheduler may be created before or after the Checkpointer (undo takes over
what the scheduler's step wrapper does, in torch 1 and 2); other wrappers
of optimizer.step must come after it. undo=True (= "inverse") keeps about
one byte per element and buffer; undo="copy" keeps a copy of the chunk's
parameters and optimizer state until the step ends instead: on a GPU the
fast one, for the memory of that copy (docs/UNDO.md has both costs).

Under --reft=...,every=0 (no snapshot on the step path; docs/UNDO.md) only
replicated state survives a lost rank, through its peers' JIT flushes: with
several ranks the Checkpointer refuses per-rank state (rng=True, extra=,
sharded_optimizer=True, sharded DTensors) with reft.Error, and registers the
optimizer's param_groups as replicated.

sharded_optimizer=True registers the optimizer state as not replicated
(ZeRO-style: each rank holds a different shard); the extra states are never
replicated (RNG states differ per rank; under every=0 the param_groups are).
streams= replaces the copy stream
(tests: reft._streams.CpuStreams with a hook). This module imports torch,
reft does not.
"""

import ctypes
import hashlib
import io
import random
import sys
import types
import warnings
import weakref

try:
    import torch
except ImportError as e:  # reft itself needs no torch; this adapter does
    raise ImportError("reft.torch needs PyTorch (%s): install it (pip install torch, or Debian's "
                      "python3-torch) or use reft.Session directly" % e) from e

import numpy

from ._errors import Error
from ._optstep import unwrap_step
from ._streams import CpuStreams, CudaStreams
from .session import Session, common_newest

__all__ = ["Checkpointer"]

_MAGIC = 0x7265667430746368  # "reft0tch": marks a generation written by this module
_META_VERSION = 2  # 2: a fifth word, the sharding layout's fingerprint
_MAX_NAME = 256  # bytes, the agent's limit on a buffer name

# What a rank waits in between a DDP training forward pass and the
# optimizer step: a hang verdict names it (Session.comm_phase's op).
DDP_COMM_OP = "DDP backward pass and gradient all-reduce"


def _dist():
    """torch.distributed when it is initialized, else None."""
    d = getattr(torch, "distributed", None)
    if d is not None and d.is_available() and d.is_initialized():
        return d
    return None


def _bytes_view(what, t):
    """A writable, C-contiguous uint8 numpy view of a CPU tensor's memory
    (no copy): the meta tensor's registration."""
    return t.detach().view(-1).view(torch.uint8).numpy()


def _is_dtensor(t):
    return hasattr(t, "placements") and hasattr(t, "device_mesh") and hasattr(t, "to_local")


def _local(t):
    """A DTensor's local shard (the tensor holding this rank's bytes; the
    same storage, no autograd), else t."""
    if _is_dtensor(t):
        loc = getattr(t, "_local_tensor", None)
        return loc if loc is not None else t.to_local()
    return t


def _layout(t):
    """What must match between save and restore beyond dtype and local
    shape: a DTensor's mesh, placements and global shape."""
    if not _is_dtensor(t):
        return "plain"
    mesh = t.device_mesh
    return "dtensor mesh %s %s placements %s global %s" % (
        getattr(mesh, "mesh_dim_names", None), tuple(mesh.mesh.shape), tuple(str(p) for p in t.placements),
        tuple(t.shape))


def _sharded(t):
    """A DTensor whose bytes differ between the ranks of its mesh (a Shard
    or Partial placement on some mesh dimension): not replicated state,
    which the agent may cut across the data-parallel group (arc, aec) and
    rebuild from the other ranks' copies."""
    if not _is_dtensor(t):
        return False
    return not all(p.is_replicate() for p in t.placements)


def _fsdp_modules(model):
    """The FSDP2 (fully_shard) modules of ``model``, outermost first. Only
    a program that imported FSDP2 has them: nothing is imported here
    (torch 1.13's torch.distributed.fsdp does not even import on Python
    3.11)."""
    classes = tuple(c for c in (getattr(sys.modules.get(m), "FSDPModule", None) for m in (
        "torch.distributed.fsdp", "torch.distributed._composable.fsdp")) if isinstance(c, type))
    if not classes:
        return []
    return [m for m in model.modules() if isinstance(m, classes)]


def _reshard(model):
    """Put FSDP2's sharded parameters back on the modules. Between a forward
    pass with reshard_after_forward=False (or unshard()) and the backward,
    FSDP2 leaves the unsharded parameters registered on its modules: plain
    tensors of the full shape that the next all-gather replaces, not the
    DTensors the optimizer updates, so they must be neither snapshotted nor
    restored into."""
    for m in _fsdp_modules(model):
        m.reshard()


def _check_tensor(what, t):
    if t.layout != torch.strided:
        raise Error("reft.torch: %s is a %s tensor; only dense (strided) tensors can be "
                    "snapshotted" % (what, t.layout))
    if t.device.type not in ("cpu", "cuda"):
        raise Error("reft.torch: %s is on %s; reft.torch snapshots CPU and CUDA tensors"
                    % (what, t.device))


def _flat(t):
    """t's bytes as a flat uint8 tensor: a view when t is contiguous."""
    return t.detach().reshape(-1).view(torch.uint8) if t.is_contiguous() else \
        t.detach().contiguous().view(-1).view(torch.uint8)


def _plain_name(n):
    """A parameter's name without torch.compile's wrapper ("_orig_mod."
    segments): a compiled model and the plain one share snapshots."""
    return ".".join(p for p in n.split(".") if p != "_orig_mod")


def _name(*parts):
    """A buffer name within the agent's length limit; the leading index
    parts keep it unique when the label is cut."""
    name = "/".join(parts)
    b = name.encode("utf-8")
    if len(b) > _MAX_NAME:
        name = b[:_MAX_NAME].decode("utf-8", "ignore")
    return name


_TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def _adam_step(opt, group, p, is_adam):
    """Adam's and AdamW's initial step, as torch's _init_group makes it."""
    if not _TORCH2:
        # torch 1.13: Adam checks capturable or fused, AdamW only capturable;
        # a 1-element float tensor on the parameter's device, else a CPU scalar.
        one = opt.defaults.get("capturable", False) or (is_adam and opt.defaults.get("fused", False))
        return torch.zeros((1,), dtype=torch.float, device=p.device) if one else torch.tensor(0.)
    # torch 2.x: a 0-dim tensor on the parameter's device with capturable or
    # fused (float32 when fused), else a CPU scalar of the default float type.
    fused = bool(group.get("fused") or False)
    try:
        from torch.optim.optimizer import _get_scalar_dtype
        dtype = _get_scalar_dtype(is_fused=fused) if fused else _get_scalar_dtype()
    except (ImportError, TypeError):  # torch 2.0
        dtype = torch.float32
    if group.get("capturable", False) or fused:
        return torch.zeros((), dtype=dtype, device=p.device)
    return torch.tensor(0.0, dtype=dtype)


def _materialize(opt):
    """Create the optimizer state torch would create at the first step (see
    the module docstring); return the classes it cannot create state for."""
    is_adam = isinstance(opt, torch.optim.Adam)
    is_adamw = isinstance(opt, torch.optim.AdamW)
    is_sgd = isinstance(opt, torch.optim.SGD)
    missing, warned = [], False
    for group in opt.param_groups:
        for p in group["params"]:
            if not p.requires_grad or opt.state.get(p):
                continue  # torch never steps a frozen parameter; existing state stays
            if is_adam or is_adamw:
                st = opt.state[p]
                st["step"] = _adam_step(opt, group, p, is_adam)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad", False):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif is_sgd:
                if group.get("momentum", 0) == 0:
                    continue  # plain SGD keeps no state
                if group.get("dampening", 0) != 0 and not warned:
                    warned = True
                    warnings.warn(
                        "reft.torch: SGD with dampening=%r: the momentum buffer is created as zeros "
                        "before the first step, so that step uses (1-dampening)*grad where plain "
                        "torch uses grad; runs with a Checkpointer still agree with each other bit "
                        "for bit" % group["dampening"], RuntimeWarning, stacklevel=4)
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            else:
                missing.append(type(opt).__name__)
    return missing


class _Entry:
    """One registered tensor. ``tensor`` is what training updates (the
    Parameter itself, to notice param.data = ...); ``addr`` its data address
    at registration (None: not checked, a module buffer); ``copied`` the
    tensor whose bytes are snapshotted (the staging tensor of a buffer)."""

    __slots__ = ("name", "tensor", "addr", "owner", "copied", "_src")

    def __init__(self, name, tensor, owner=None, copied=None, check=True):
        self.name, self.tensor, self.owner = name, tensor, owner
        self.copied = _local(tensor) if copied is None else copied
        self.addr = _local(tensor).data_ptr() if check else None
        c = self.copied
        # A contiguous tensor is copied from its own memory (a cached byte
        # view); a non-contiguous one is gathered into a contiguous
        # temporary on the copy stream at every save (one more pass over
        # its bytes on the device, and a temporary of its size).
        self._src = c.detach().reshape(-1).view(torch.uint8) if c.is_contiguous() else \
            (lambda: c.detach().contiguous().view(-1).view(torch.uint8))

    def source(self):
        if self.addr is not None and _local(self.tensor).data_ptr() != self.addr:
            raise Error("reft.torch: %s was replaced after the Checkpointer was created "
                        "(param.data = ..., model.to(), optimizer.load_state_dict(), ...); "
                        "create the Checkpointer after the model and optimizer have their final "
                        "tensors" % self.name)
        return self._src


class _Fence:
    """A save's copies: wait() until they are in the arena (the session's
    copier thread calls it, the GIL released) and then drops the sources."""

    def __init__(self, streams, done, keep):
        self._streams, self.done, self._keep = streams, done, keep

    def wait(self):
        try:
            self._streams.synchronize(self.done)
        finally:
            self._keep = None


class _Mover:
    """Moves a Checkpointer's tensors between their memory and the arena
    (reft.Session.register_external's mover) through its streams."""

    def __init__(self, streams):
        self.streams = streams
        self.mark = None  # event on the compute stream at the last consistent()
        self.done = None  # the newest copy's done event
        self._dst = None  # (addr, size, uint8 tensor over the arena)
        self._prepared = None  # (jobs, arena, entries, copies) of the last issue

    def _arena(self, arena):
        c = self._dst
        if c is None or c[0] != arena.addr or c[1] != arena.size:
            # A tensor over the mapping's address, not a buffer export of the
            # mmap (which would stop the session from unmapping it). The
            # session maps it for its whole life; registered with the CUDA
            # runtime when CUDA is in use (reft._arena), so a device-to-host
            # copy lands in it directly.
            arr = numpy.ctypeslib.as_array((ctypes.c_uint8 * arena.size).from_address(arena.addr))
            c = self._dst = (arena.addr, arena.size, torch.from_numpy(arr))
        return c[2]

    def issue(self, arena, jobs):
        p = self._prepared
        if p is None or p[0] is not jobs or p[1] != (arena.addr, arena.size):
            dst = self._arena(arena)
            # Regions of one tensor that follow each other in the tensor and
            # in the arena (the agent's chunks) are one copy.
            merged = []
            for e, off, size, at in sorted(jobs, key=lambda j: (id(j[0]), j[1])):
                if merged and merged[-1][0] is e and merged[-1][1] + merged[-1][2] == off and \
                        merged[-1][3] + merged[-1][2] == at:
                    merged[-1][2] += size
                else:
                    merged.append([e, off, size, at])
            entries = list({id(m[0]): m[0] for m in merged}.values())
            p = self._prepared = (jobs, (arena.addr, arena.size), entries,
                                  [(e, off, size, dst[at:at + size]) for e, off, size, at in merged])
        for e in p[2]:
            e.source()  # raises if the tensor was replaced
        copies = [(e._src, off, size, d) for e, off, size, d in p[3]]
        after = self.mark if self.mark is not None else self.streams.record()
        done = self.streams.copy(after, copies)
        self.done = done
        return _Fence(self.streams, done, copies)

    def fill(self, jobs):
        groups = {}
        for e, off, size, view in jobs:
            groups.setdefault(id(e), (e, []))[1].append((off, size, view))
        cuda = set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # frombuffer of the read-only arena: we only read it
            for e, parts in groups.values():
                t = e.copied
                if t.device.type == "cuda":
                    cuda.add(t.device)
                direct = t.is_contiguous()
                flat = _flat(t)  # a copy when not contiguous, written back below
                for off, size, view in parts:
                    flat[off:off + size].copy_(torch.frombuffer(view, dtype=torch.uint8))
                if not direct:
                    with torch.no_grad():
                        t.copy_(flat.view(t.dtype).view(t.shape))
        for d in cuda:
            torch.cuda.synchronize(d)


class _RNG:
    """The random number generators a trainer draws from, as one stateful
    object: torch's CPU generator, every CUDA device's (when this process
    has initialized CUDA; never initializes it), Python's random and
    numpy's global generator."""

    def state_dict(self):
        st = {"torch": torch.get_rng_state(), "random": random.getstate(),
              "numpy": numpy.random.get_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            st["cuda"] = torch.cuda.get_rng_state_all()
        return st

    def load_state_dict(self, st):
        torch.set_rng_state(st["torch"])
        random.setstate(st["random"])
        numpy.random.set_state(st["numpy"])
        cuda = st.get("cuda")
        if cuda is not None:
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n != len(cuda):
                raise Error("Checkpointer.restore(): the snapshot holds the RNG states of %d CUDA "
                            "devices, this process sees %d; restore with the same devices visible "
                            "(CUDA_VISIBLE_DEVICES), or pass rng=False" % (len(cuda), n))
            torch.cuda.set_rng_state_all(cuda)


class _ParamGroups:
    """The optimizer's hyperparameters (lr, betas, weight_decay, ...: what
    an LR scheduler changes), every key of its param_groups but the
    parameters."""

    def __init__(self, opt):
        self.opt = opt

    def state_dict(self):
        return [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]

    def load_state_dict(self, groups):
        if len(groups) != len(self.opt.param_groups):
            raise Error("Checkpointer.restore(): the snapshot has %d optimizer parameter groups, "
                        "the optimizer %d" % (len(groups), len(self.opt.param_groups)))
        for g, st in zip(self.opt.param_groups, groups):
            g.update(st)


class _Extra:
    """An object's state_dict(), serialized (torch.save) into a host buffer
    of fixed capacity at every consistent(): [length, 8 bytes LE][bytes]."""

    def __init__(self, name, obj):
        self.name, self.obj = name, obj
        self.buf = None
        self.replicated = False  # per rank, unless the Checkpointer knows better (every=0)

    def _blob(self):
        out = io.BytesIO()
        torch.save(self.obj.state_dict(), out)
        return out.getvalue()

    def register(self):
        # The arena layout is fixed at registration: room for 4x today's
        # state, at least 64 KiB (a sampler's position, a scheduler's counters).
        n = len(self._blob())
        self.buf = bytearray(8 + max(64 << 10, 4 * n))
        return self.buf

    def capture(self):
        b = self._blob()
        if 8 + len(b) > len(self.buf):
            raise Error("Checkpointer: the state of %r (%s) grew to %d bytes, past the %d bytes "
                        "reserved for it when the Checkpointer was created; create the "
                        "Checkpointer when that object holds its largest state"
                        % (self.name, type(self.obj).__name__, len(b), len(self.buf) - 8))
        self.buf[:8] = len(b).to_bytes(8, "little")
        self.buf[8:8 + len(b)] = b

    def load(self, step):
        n = int.from_bytes(self.buf[:8], "little")
        if n > len(self.buf) - 8:
            raise Error("Checkpointer.restore(): generation %d holds an unreadable state of %r "
                        "(%d bytes in a %d-byte buffer)" % (step, self.name, n, len(self.buf) - 8))
        try:
            st = torch.load(io.BytesIO(bytes(self.buf[8:8 + n])), **_LOAD_KW)
        except Exception as e:  # noqa: BLE001 - say which object
            raise Error("Checkpointer.restore(): the state of %r in generation %d cannot be read: "
                        "%s" % (self.name, step, e)) from e
        self.obj.load_state_dict(st)


# torch.load of our own blobs: they hold Python objects (RNG tuples, numpy
# states), which torch >= 2.6 refuses by default (weights_only=True).
_LOAD_KW = {"weights_only": False} if _TORCH2 else {}


class Checkpointer:
    """Snapshots of ``model`` (a Module, DDP included) and ``optimizer``
    (or None) through ``session`` (default: a new reft.Session for this
    rank, ``optional`` as in reft.Session; with torch.distributed
    initialized its rank and world size). See the module docstring."""

    def __init__(self, model, optimizer=None, session=None, sharded_optimizer=False, *,
                 optional=False, jit=True, streams=None, extra=None, rng=True, undo=False):
        if not isinstance(model, torch.nn.Module):
            raise Error("Checkpointer: model must be a torch.nn.Module, not %s" % type(model).__name__)
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise Error("Checkpointer: optimizer must be a torch.optim.Optimizer or None, not %s"
                        % type(optimizer).__name__)
        self.model, self.optimizer = model, optimizer
        self.sharded_optimizer = bool(sharded_optimizer)
        self._pending = None
        self._closed = False
        self._streams = streams  # None: chosen from the tensors' device in _register
        if extra is None:
            extra = {}
        if not isinstance(extra, dict) or not all(
                isinstance(k, str) and k and callable(getattr(v, "state_dict", None)) and
                callable(getattr(v, "load_state_dict", None)) for k, v in extra.items()):
            raise Error("Checkpointer: extra must be a dict of name -> object with state_dict() "
                        "and load_state_dict() (LR schedulers, samplers, your own), not %r"
                        % (extra if not isinstance(extra, dict) else
                           {k: type(v).__name__ for k, v in extra.items()},))
        self._extra = [_Extra(k, v) for k, v in sorted(extra.items())]
        if optimizer is not None:
            self._extra.append(_Extra("reft.torch/param_groups", _ParamGroups(optimizer)))
        if rng:
            self._extra.append(_Extra("reft.torch/rng", _RNG()))
        self._unhook = None
        self._unhook_comm = None
        self._undo = None
        if not (isinstance(undo, bool) or undo in ("inverse", "copy")):
            raise Error("Checkpointer: undo must be False, True (= 'inverse'), 'inverse' or 'copy', not %r "
                        "(docs/UNDO.md: 'copy' is fast and keeps a copy of the parameters and optimizer "
                        "state during the step; 'inverse' keeps about one byte per element)" % (undo,))
        if undo and optimizer is None:
            raise Error("Checkpointer(undo=True): undo needs the optimizer; pass it")
        self._own_session = session is None
        if session is None:
            d = _dist()
            kw = {"rank": d.get_rank(), "world": d.get_world_size()} if d is not None else {}
            session = Session(optional=optional, **kw)
        self.session = session
        try:
            if session.enabled and session.every == 0:
                if not jit:
                    raise Error("Checkpointer(jit=False) under --reft=...,every=0: no snapshot is taken on "
                                "the step path, so without the JIT flush nothing would ever be saved; "
                                "pass jit=True or launch without every=0")
                if session.world > 1:
                    self._every0_state(rng, extra, sharded_optimizer)
                if not undo:
                    warnings.warn("reft.torch: every=0 without undo=True: a failure while this rank is inside "
                                  "optimizer.step() leaves no consistent step to flush until the step ends; "
                                  "pass undo=True (docs/UNDO.md)", RuntimeWarning, stacklevel=2)
            self._register()
            if session.enabled and session.every == 0 and session.world > 1 and self._any_sharded:
                raise Error("Checkpointer under --reft=...,every=0 with %d ranks: the model is sharded "
                            "(DTensor, FSDP2), and a rank's own shard is copied to no peer before a "
                            "failure (no snapshot on the step path), so a lost rank could not be "
                            "restored; launch with every=1 (the default)" % session.world)
            if undo:
                from .undo import UpdateUndo  # raises UndoUnsupported naming the reason
                self._undo = UpdateUndo(optimizer, on_undone=self._undone,
                                        keep="inverse" if undo is True else undo)
                self._undo.install()  # before the hook below, which calls it (torch 1.13)
                session.set_update_interrupt(self._undo.request_stop)
            self._install_hook()
            self._install_comm_hook()
            if jit:
                try:
                    session.watch_failures()
                except Error as e:  # an agent from before notices: train on without
                    warnings.warn("reft.torch: the JIT flush on failure notices is off: %s" % e,
                                  RuntimeWarning, stacklevel=2)
        except BaseException:
            if self._own_session:
                session.close()
            raise

    def _every0_state(self, rng, extra, sharded_optimizer):
        """every=0 in a job of several ranks: the JIT flush of a survivor
        carries its ring successor's copy of the replicated state only, so
        state that differs per rank never leaves a rank that dies. Refuse
        it, and register the optimizer's hyperparameters (the same on every
        data-parallel rank: one optimizer built alike) as replicated."""
        per_rank = []
        if rng:
            per_rank.append("rng=True (each rank's RNG states)")
        if extra:
            per_rank.append("extra= (%s)" % ", ".join(sorted(extra)))
        if sharded_optimizer:
            per_rank.append("sharded_optimizer=True (each rank's optimizer shard)")
        if per_rank:
            raise Error("Checkpointer under --reft=...,every=0 with %d ranks: %s is state of its own rank, "
                        "which every=0 copies to no peer before a failure (no snapshot on the step path; "
                        "a survivor's JIT flush carries only the replicated state), so a lost rank could "
                        "not be restored and the job would start over. Drop it (rng=False when the "
                        "ranks draw no random numbers after start-up; no extra=; an optimizer that is "
                        "not sharded), or launch with every=1 (the default)" % (self.session.world, " and ".join(per_rank)))
        for x in self._extra:
            if x.name == "reft.torch/param_groups":
                x.replicated = True

    @property
    def undo(self):
        """The reft.undo.UpdateUndo that makes optimizer.step() undoable
        (undo=True), or None: for its test hook, UpdateUndo.hold()."""
        return self._undo

    # --- registration ------------------------------------------------------

    def _register(self):
        s = self.session
        self._params, self._buffers, self._state = [], [], []
        fp = hashlib.sha256(b"reft.torch 1\n")

        pending = []  # (entry, replicated): registered once the streams are known
        self._any_sharded = False
        lfp = hashlib.sha256(b"reft.torch layout 1\n")

        def add(entry, replicated):
            t = entry.copied
            _check_tensor(entry.name, t)
            fp.update(("%s %s %s\n" % (entry.name, t.dtype, tuple(t.shape))).encode())
            lfp.update(("%s %s\n" % (entry.name, _layout(entry.tensor))).encode())
            sharded = _sharded(entry.tensor)
            self._any_sharded = self._any_sharded or sharded
            if t.numel():  # an empty tensor has no bytes to keep
                pending.append((entry, replicated and not sharded))

        _reshard(self.model)
        names = {}
        for i, (n, p) in enumerate(self.model.named_parameters()):
            n = _plain_name(n)
            names[p] = n
            e = _Entry(_name("param", "%d:%s" % (i, n)), p)
            add(e, True)
            self._params.append(e)
        for i, (n, b) in enumerate(self.model.named_buffers()):
            n = _plain_name(n)
            # Staged: forward may change buffers while the copy runs.
            staging = torch.empty_like(b, memory_format=torch.contiguous_format)
            with torch.no_grad():
                staging.copy_(b)
            e = _Entry(_name("buffer", "%d:%s" % (i, n)), b, owner=staging, copied=staging,
                       check=False)
            add(e, True)
            self._buffers.append(e)

        opt = self.optimizer
        if opt is not None:
            missing = _materialize(opt)
            if missing:
                raise Error("Checkpointer: %s has no state yet and reft.torch cannot create it "
                            "before its first step (it can for SGD, Adam and AdamW); create the "
                            "Checkpointer after the state exists (one optimizer.step() or "
                            "optimizer.load_state_dict())" % missing[0])
            fp.update(("optimizer %s\n" % type(opt).__name__).encode())
            idx = 0
            for group in opt.param_groups:
                for p in group["params"]:
                    label = names.get(p)
                    if label is None:  # in the optimizer but not the model: keep it too
                        label = "optimizer-only"
                        e = _Entry(_name("param", "opt%d:%s" % (idx, label)), p)
                        add(e, True)
                        self._params.append(e)
                    for key in sorted(opt.state.get(p, {})):
                        v = opt.state[p][key]
                        what = "optimizer state %r of parameter %d (%s)" % (key, idx, label)
                        if not torch.is_tensor(v):
                            raise Error("Checkpointer: %s is a %s, not a tensor; reft.torch "
                                        "snapshots tensors only" % (what, type(v).__name__))
                        e = _Entry(_name("optim", str(idx), "%s:%s" % (key, label)), v, owner=(p, key))
                        add(e, not self.sharded_optimizer)
                        self._state.append(e)
                    idx += 1
            self._nparams = idx

        devices = {e.copied.device for e, _ in pending if e.copied.device.type == "cuda"}
        if len(devices) > 1:
            raise Error("Checkpointer: the state is on %d CUDA devices (%s); reft.torch snapshots "
                        "one device per rank: one process per GPU (torchrun, srun -n)"
                        % (len(devices), sorted(str(d) for d in devices)))
        if self._streams is None:
            self._streams = CudaStreams(devices.pop()) if devices else CpuStreams()
        self._mover = _Mover(self._streams)
        for e, replicated in pending:
            s.register_external(e.name, e.copied.numel() * e.copied.element_size(), self._mover,
                                key=e, replicated=replicated)

        for x in self._extra:
            fp.update(("extra %s\n" % x.name).encode())
            s.register(_name("extra", x.name), x.register(), replicated=x.replicated)

        # meta: magic, format version, step, fingerprint of names, dtypes and shapes.
        self._fingerprint = int.from_bytes(fp.digest()[:8], "little", signed=True)
        self._layout_fp = int.from_bytes(lfp.digest()[:8], "little", signed=True)
        self._meta = torch.tensor([_MAGIC, _META_VERSION, -1, self._fingerprint, self._layout_fp],
                                  dtype=torch.int64)
        # The fingerprint covers each rank's local shapes, which differ
        # between the ranks of a sharded model: its meta is per rank.
        s.register("reft.torch/meta", _bytes_view("meta", self._meta), replicated=not self._any_sharded)

    def _install_hook(self):
        opt = self.optimizer
        if opt is None:
            return
        ref = weakref.ref(self)

        def before_step():
            ck = ref()
            if ck is not None and not ck._closed:
                ck._fence()
                if ck._unhook_comm is not None:
                    ck._comm(False)  # the backward pass, and DDP's all-reduce, are over
                ck.session.updating()  # waits while a JIT flush copies the state

        if hasattr(opt, "register_step_pre_hook"):  # torch >= 2.0
            handle = opt.register_step_pre_hook(lambda o, args, kwargs: before_step())
            self._unhook = handle.remove
            return
        # torch 1.13: wrap step on the instance. A bound method with
        # __self__/__func__ is what LR schedulers' with_counter expects, and
        # an instance-level wrapper already there (a scheduler's) is kept.
        inner = opt.__dict__.get("step")

        def step(o, *args, **kwargs):
            before_step()
            if inner is not None:
                return inner(*args, **kwargs)
            return type(o).step(o, *args, **kwargs)

        if getattr(inner, "_with_counter", False):
            step._with_counter = True  # bound methods forward attribute reads to __func__
        opt.step = bound = types.MethodType(step, opt)

        def unhook():
            unwrap_step(opt, bound, inner)  # wrapped again since: ours passes through once closed

        self._unhook = unhook

    def _install_comm_hook(self):
        """Under DDP the backward pass, in which DDP all-reduces the
        gradients, is the step's communication phase: from the end of a
        training forward pass to the optimizer step. The Checkpointer says
        so to the agent (Session.comm_phase), which pauses its background
        replication meanwhile (GEMINI's interleaving) and measures each
        rank's own work between the phases, from which reft status names
        stragglers. A forward hook and the optimizer hook only: DDP's
        gradients and their numerics are untouched. Under gradient
        accumulation with no_sync() the phase also covers the
        non-synchronizing backward passes."""
        ddp = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
        if ddp is None or not isinstance(self.model, ddp) or self.optimizer is None:
            return
        ref = weakref.ref(self)

        def after_forward(module, inputs, output):
            ck = ref()
            if ck is not None and module.training and torch.is_grad_enabled():
                ck._comm(True, DDP_COMM_OP)

        self._unhook_comm = self.model.register_forward_hook(after_forward).remove

    def _undone(self, tensors, cause):
        """UpdateUndo undid the step in progress: the state is the last
        consistent step's again; a flush may save it."""
        if self._closed:
            return
        # CUDA: the flush copies after this event, so after the undo's kernels.
        self._mover.mark = self._streams.record()
        self.session.undone()
        warnings.warn("reft.torch: optimizer.step() was interrupted (%s: %s); undid the update of %d "
                      "parameter tensors, the state is the last consistent step again"
                      % (type(cause).__name__, cause, tensors), RuntimeWarning, stacklevel=2)

    def _comm(self, active, op=None):
        """comm_phase, never raising into the trainer's forward or step."""
        if self._closed:
            return
        try:
            self.session.comm_phase(active, op)
        except Error:
            pass  # a closed session; the next save or restore says why

    # --- checks --------------------------------------------------------------

    def _check_open(self, what):
        if self._closed:
            raise Error("Checkpointer.%s after close()" % what)

    def _check_live(self):
        """The tensors the session reads are still the training state."""
        for e in self._params:
            if _local(e.tensor).data_ptr() != e.addr:
                raise Error("Checkpointer: parameter %s was replaced after the Checkpointer was "
                            "created (param.data = ..., model.to(), ...); create the Checkpointer "
                            "after the model has its final tensors" % e.name)
        for e in self._buffers:
            if e.tensor.shape != e.owner.shape or e.tensor.dtype != e.owner.dtype:
                raise Error("Checkpointer: buffer %s changed shape or dtype after the "
                            "Checkpointer was created" % e.name)
        opt = self.optimizer
        if opt is None:
            return
        n = sum(len(g["params"]) for g in opt.param_groups)
        ok = n == self._nparams
        expected = {}
        for e in self._state:
            expected.setdefault(e.owner[0], {})[e.owner[1]] = e.tensor
        if ok:
            for p, st in opt.state.items():
                keys = {k for k, v in st.items() if torch.is_tensor(v)}
                want = expected.get(p, {})
                if keys != set(want) or any(st[k] is not want[k] for k in keys):
                    ok = False
                    break
            ok = ok and all(p in opt.state for p in expected)
        if not ok:
            raise Error("Checkpointer: the optimizer's parameters or state changed after the "
                        "Checkpointer was created (optimizer.load_state_dict(), "
                        "add_param_group(), or state created by torch for a parameter that was "
                        "frozen); create the Checkpointer after the optimizer is set up")

    # --- snapshots -------------------------------------------------------------

    def _fence(self):
        """Order the next optimizer.step() after the pending copy: on CUDA
        the compute stream waits for the copy's done event (on the GPU; the
        host goes on), on the CPU the host waits for the copy. A copy known
        to have failed raises here (reft.Error), as wait() would."""
        done = self._mover.done
        if done is None:
            return
        self._streams.fence(done)
        if getattr(done, "error", None) is not None:  # the CPU stream says so at once
            self._mover.done = None
            self.wait()
            return
        h = self._pending
        if h is not None and h.done():
            self.wait()  # raises if the save failed
        if self._streams.query(done):
            self._mover.done = None

    def save(self, step):
        """Start a snapshot of the current state as ``step`` (call it after
        optimizer.step() of that step) and return the reft.SaveHandle at
        once. Waits first for the previous snapshot."""
        self._check_open("save()")
        self.consistent(step)
        self._pending = self.session.save(step)
        return self._pending

    def consistent(self, step):
        """Declare the model and optimizer to hold the state of ``step``
        (call it after optimizer.step() on steps not saved; save() does it
        itself), so that a JIT flush after a failure saves it. Stages the
        module buffers."""
        self._check_open("consistent()")
        self.wait()  # the previous copy must be done before staging changes
        self._check_live()
        self.session.updating()  # a flush must not copy the staging as it changes
        with torch.no_grad():
            for e in self._buffers:
                e.owner.copy_(e.tensor)
        for x in self._extra:
            x.capture()
        self._meta[2] = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else -1
        self._mover.mark = self._streams.record()  # the copies start after the staging
        if self._meta[2] >= 0:
            self.session.consistent(step)

    def flush_on_signal(self, timeout=3.0):
        """Save the consistent state at SIGTERM (Slurm's step kill) before
        dying of it (reft.Session.flush_on_signal); call from the main
        thread."""
        self.session.flush_on_signal(timeout=timeout)

    def wait(self, timeout=None):
        """Wait for the pending snapshot: True when there is none or it
        committed, False after ``timeout`` seconds (wait again). Raises
        reft.Error when it failed. Call it before optimizer.step()."""
        h = self._pending
        if h is None:
            return True
        try:
            if not h.wait(timeout):
                return False
        except Error:
            self._pending = None
            raise
        self._pending = None
        return True

    def hint_idle(self, ms):
        """Pass an idle window to the session (reft.Session.hint_idle). Only
        the host-side buffers (the extra states and the meta record) wait for
        windows; the tensors' copies run on the copy stream at once (on a
        GPU the copy engine moves them, beside the compute kernels)."""
        self.session.hint_idle(ms)

    def generations(self):
        """This rank's committed steps on this node, newest first."""
        return self.session.generations()

    def restore(self):
        """Fill the model and optimizer from the newest snapshot every rank
        holds and return its step (training continues at step + 1), or None
        when there is none. Call it on every rank, before training."""
        self._check_open("restore()")
        self.wait()
        _reshard(self.model)  # else the next forward may use stale unsharded parameters
        s = self.session
        d = _dist()
        if s.world > 1 and d is not None:
            if d.get_world_size() != s.world:
                raise Error("Checkpointer.restore(): torch.distributed has %d ranks but the reft "
                            "session %d; launch with one task per rank (srun -n) so that "
                            "SLURM_NTASKS matches" % (d.get_world_size(), s.world))
        try:
            step = self._restore_agreed(d) if s.world > 1 and d is not None else s.restore()
        except Error as e:
            if not self._any_sharded or e.code in ("corrupt", "not_found"):
                raise
            # A DTensor whose local shape changed (another mesh, placements
            # or world) no longer fits the generation's buffers, so the agent
            # refuses it before the layout check (_after_restore) can say why.
            raise Error("%s\nThe model is sharded (DTensor, FSDP2): if its sharding layout changed "
                        "since the snapshot (another device mesh, placements or world size), that "
                        "is the cause: reft.torch does not reshard; restore with the mesh and "
                        "fully_shard calls that saved it" % e.message, code=e.code) from e
        if step is None:
            return None
        self._after_restore(step)
        return step

    def _restore_agreed(self, d):
        s = self.session
        world = s.world
        partial = None  # a step some ranks restored before another rank failed it
        while True:
            # Failures travel with the lists, so that no rank is left
            # waiting in a collective the failed rank never joins.
            try:
                mine = (s.generations(), None)
            except Error as e:
                mine = (None, (e.code, str(e)))
            lists = [None] * world
            d.all_gather_object(lists, mine)
            for r, (_, err) in enumerate(lists):
                if err is not None:
                    raise Error("Checkpointer.restore(): rank %d could not list its snapshots: %s"
                                % (r, err[1]), code=err[0])
            step = common_newest([steps for steps, _ in lists])
            if step is None and partial is None and any(steps for steps, _ in lists):
                # Not silent: the job starts over although some ranks hold
                # snapshots (a lost rank's state is gone, e.g. per-rank state
                # under every=0, or beyond the SPEC's tolerance).
                none = [r for r, (steps, _) in enumerate(lists) if not steps]
                who = "rank(s) %s hold none" % none[:16] if none else "the ranks' steps have none in common"
                s._log("restore: no step is held by every rank (%s; this rank holds %s), so training "
                       "starts from the beginning; the agents' logs say what was lost"
                       % (who, sorted(lists[d.get_rank()][0] or []) or "none"))
            if step is None:
                if partial is not None:
                    raise Error("Checkpointer.restore(): step %d could not be restored on every "
                                "rank and no older step is held by all ranks, but some ranks "
                                "already hold step %d's state; start the job afresh (a new "
                                "allocation) instead of mixing states" % (partial, partial))
                return None
            err = None
            try:
                s.restore(step=step)
            except Error as e:
                err = (e.code, str(e))
            results = [None] * world
            d.all_gather_object(results, err)
            failed = [(r, e) for r, e in enumerate(results) if e is not None]
            if not failed:
                return step
            # A corrupt copy has left that rank's generations: agree again.
            partial = step
            fatal = [(r, e) for r, e in failed if e[0] not in ("corrupt", "not_found")]
            if fatal:
                r, (code, msg) = fatal[0]
                raise Error("Checkpointer.restore(): rank %d could not restore step %d: %s"
                            % (r, step, msg), code=code)
            warnings.warn("reft.torch: step %d is not restorable on rank(s) %s (%s); agreeing on "
                          "an older step" % (step, [r for r, _ in failed], failed[0][1][1]),
                          RuntimeWarning, stacklevel=3)

    def _after_restore(self, step):
        m = self._meta.tolist()
        if m[0] != _MAGIC or m[1] != _META_VERSION:
            raise Error("Checkpointer.restore(): generation %d was not written by reft.torch "
                        "(format %r); the model and optimizer now hold its bytes: start fresh "
                        "(new job) or restore with the program that wrote it" % (step, m[:2]))
        if m[4] != self._layout_fp:
            raise Error("Checkpointer.restore(): generation %d was saved with another sharding "
                        "layout (DTensor device mesh, placements or global shapes, e.g. FSDP2's "
                        "fully_shard on another mesh, or a sharded model restored unsharded); "
                        "reft.torch does not reshard: restore with the mesh and fully_shard "
                        "calls that saved it" % step)
        if m[3] != self._fingerprint:
            raise Error("Checkpointer.restore(): generation %d was written for another model or "
                        "optimizer (same sizes, different names, shapes or dtypes); rerun with "
                        "the original model and optimizer settings" % step)
        if m[2] != step:
            raise Error("Checkpointer.restore(): generation %d holds the state of step %d; the "
                        "snapshot store is inconsistent" % (step, m[2]))
        with torch.no_grad():
            for e in self._buffers:
                e.tensor.copy_(e.owner)
        for x in self._extra:
            x.load(step)

    def close(self):
        """Wait for the pending snapshot, remove the optimizer hook and close
        the session if the Checkpointer opened it. Idempotent."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._streams.close()
            if self._unhook is not None:
                self._unhook()
                self._unhook = None
            if self._unhook_comm is not None:
                self._unhook_comm()
                self._unhook_comm = None
            if self._undo is not None:
                self._undo.uninstall()
                self.session.set_update_interrupt(None)
                self._undo = None
            if self._own_session:
                self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return "<reft.torch.Checkpointer %d params %d buffers %d optimizer tensors, %r>" % (
            len(self._params), len(self._buffers), len(self._state), self.session)
