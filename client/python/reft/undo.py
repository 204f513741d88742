"""Update-undo for torch optimizers (SWIFT, section 2.3).

A rank whose optimizer.step() is interrupted part way holds some
parameters at step t and the others at t-1: a torn state that the JIT
flush cannot save. ``UpdateUndo`` steps the optimizer one parameter tensor
at a time with torch's own step function, records per tensor whether its
update was applied, and keeps what the inverse needs; when the step is
interrupted (an exception out of it, or a flush asking the trainer to stop
at the next tensor boundary), it undoes the applied tensors, so that the
parameters and the optimizer state are step t-1's again, bit for bit.

Supported: torch.optim.SGD (momentum, dampening, weight decay, nesterov,
maximize), torch.optim.Adam and torch.optim.AdamW (weight decay,
maximize), float tensors on CPU or CUDA. Refused, with the reason:
AMSGrad (the running maximum forgets the value it replaced),
differentiable=True, complex or sparse gradients, lr*weight_decay = 1 for
AdamW and for SGD without momentum (the decay zeroes the parameter), and
every other optimizer class.

Exactness: the inverse of torch's expressions (p' = p - lr*d; m' = b1*m +
(1-b1)*g; v' = b2*v + (1-b2)*g*g; AdamW's p*(1-lr*wd)) is estimated in
float32 (float64 for float64 tensors) from the updated values. Rounding in
the forward makes the estimate differ from the original in some elements
(and m' = b1*m + ... loses bits of m outright when |(1-b1)*g| is the larger
term), so right after each tensor's update the difference of the bit
patterns, original minus estimate, is kept: one int8 per element and
buffer, and, where it does not fit, the flat index and original value.
Undo adds it back to the estimate's bits: integer arithmetic, exact
whatever the rounding. The originals are copied one chunk at a time
(parameter and state) and freed once compared. docs/UNDO.md has the
measured rates and cost.

keep="copy" instead keeps each chunk's copy until the step ends and undo
writes it back: no inverse, no comparison, no host synchronization, at
the price of one copy of the parameters and their optimizer state in the
tensors' own memory during the step (the inverse keeps one int8 per
element and buffer, plus the exceptions, and one chunk's copy at a time).
On a GPU the inverse's arithmetic and its per-chunk synchronization cost
about as much as the step itself; the copy is one more pass over memory.

Ordering: step() runs on the training thread. request_stop() may be called
from any thread (a JIT flush's); the training thread honours it at the
next tensor boundary. This module imports torch; reft itself does not.
"""

import math
import threading

import torch

from ._errors import Error
from ._optstep import unwrap_step

__all__ = ["UpdateUndo", "UndoUnsupported", "UpdateInterrupted", "check_undoable", "HOLD_MAX", "KEEP"]

# KEEP: what UpdateUndo keeps to undo a chunk: the inverse's corrections
# (memory-light) or a copy of the originals (fast; one copy of the
# parameters and their state during the step).
KEEP = ("inverse", "copy")

# HOLD_MAX bounds UpdateUndo.hold's wait for a stop request (reft-train's
# --hold-in-update waits as long).
HOLD_MAX = 120.0


class UndoUnsupported(Error):
    """The optimizer's update cannot be undone (the message says why)."""


class UpdateInterrupted(Error):
    """optimizer.step() was interrupted by a request (a JIT flush) and its
    applied part undone: the state is the previous step's."""


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t):
    return t.view(_INT[t.element_size()])


def _kind(opt):
    # AdamW is not a subclass of Adam in torch; check it first anyway.
    if isinstance(opt, torch.optim.AdamW):
        return "adamw"
    if isinstance(opt, torch.optim.Adam):
        return "adam"
    if isinstance(opt, torch.optim.SGD):
        return "sgd"
    return None


def check_undoable(optimizer):
    """Raise UndoUnsupported naming the reason when optimizer's update
    cannot be undone exactly; return its kind ("sgd", "adam", "adamw")."""
    kind = _kind(optimizer)
    name = type(optimizer).__name__
    if kind is None:
        raise UndoUnsupported("update-undo: %s cannot be undone: undo supports torch.optim.SGD, Adam "
                              "and AdamW; use one of them or run without undo (snapshots every step)"
                              % name)
    for i, g in enumerate(optimizer.param_groups):
        where = "%s param_groups[%d]" % (name, i)
        if g.get("amsgrad", False):
            raise UndoUnsupported("update-undo: %s has amsgrad=True: AMSGrad's running maximum "
                                  "forgets the value it replaced, so its update cannot be undone; "
                                  "use amsgrad=False or run without undo" % where)
        if g.get("differentiable", False):
            raise UndoUnsupported("update-undo: %s has differentiable=True: undo works on the values "
                                  "outside autograd; use differentiable=False" % where)
        lr, wd = float(g["lr"]), float(g.get("weight_decay", 0) or 0)
        if kind == "adamw" and 1 - lr * wd == 0:
            raise UndoUnsupported("update-undo: %s has lr*weight_decay = 1, which zeroes the parameters; "
                                  "lower lr or weight_decay" % where)
        if kind == "sgd" and g.get("nesterov", False) is False and g.get("momentum", 0) == 0 and 1 - lr * wd == 0:
            raise UndoUnsupported("update-undo: %s has lr*weight_decay = 1 without momentum, which zeroes "
                                  "the parameters; lower lr or weight_decay" % where)
        if kind == "sgd" and g.get("nesterov", False) and 1 - lr * wd == 0:
            raise UndoUnsupported("update-undo: %s has lr*weight_decay = 1 with nesterov; lower lr or "
                                  "weight_decay" % where)
        for p in g["params"]:
            if torch.is_complex(p):
                raise UndoUnsupported("update-undo: %s holds a complex parameter; undo supports real "
                                      "floating-point parameters" % where)
            if not p.is_floating_point():
                raise UndoUnsupported("update-undo: %s holds a %s parameter; undo supports floating-point "
                                      "parameters" % (where, p.dtype))
    return kind


# CHUNK_ELEMENTS bounds how many elements one chunk of the update steps at
# once on a GPU (see UpdateUndo), per kind of undo data. keep="inverse":
# its temporaries at the step are about eleven float32 copies of a chunk
# for Adam (the originals, the concatenated current values and the
# inverse's work): ~350 MiB at 2^23 elements. keep="copy": the chunk's
# copy is the undo data itself, so a chunk costs no extra memory, and
# fewer launches are faster (an H100, docs/UNDO.md: 1.04x the plain step
# at 2^23, 1.02x at 2^26; a stop waits for at most one chunk's update,
# well under a millisecond there). On the CPU, where a launch costs
# nothing and the concatenations are extra passes over memory, a tensor
# is its own chunk.
CHUNK_ELEMENTS = {"inverse": 1 << 23, "copy": 1 << 26}


class _Rec:
    """One chunk's update: consecutive parameter tensors of one param
    group with the same dtype, device, state keys and step count, stepped
    by one call of torch's step (its multi-tensor kernels), their
    exceptions kept over the chunk's flattened concatenation (name ->
    (int8 corrections, flat indices, original values))."""
    __slots__ = ("ps", "first", "gi", "group", "grads", "applied", "exc", "new_buf", "before", "created",
                 "had_state", "plain", "pre", "step", "orig")

    def __init__(self, ps, first, group, key):
        self.ps, self.first, self.gi, self.group = ps, first, key[0], group
        self.grads = [p.grad for p in ps]
        _, _, _, self.had_state, self.pre, self.before, self.new_buf = key
        # The step count the update leaves (Adam's bias corrections use it):
        # torch adds 1 to it (to 0, for a tensor without state).
        self.step = None if self.pre is None else self.pre + 1
        if not self.had_state:
            self.pre = None
        self.applied, self.exc, self.created, self.orig = False, {}, (), None
        self.plain = [{} for _ in ps]  # per tensor, the state's non-tensor values before (SGD's None buffer)


class UpdateUndo:
    """Make ``optimizer``'s step undoable; see the module docstring.

    install() replaces optimizer.step (on the instance) with step(), which
    updates the parameter tensors in chunks and keeps the undo data until
    the step ends; an exception out of the step, or request_stop() before a
    chunk, undoes the applied chunks, calls ``on_undone(tensors, cause)``
    and re-raises (UpdateInterrupted for a request). A chunk is a run of
    consecutive tensors of one param group alike in dtype, device, state
    and step count, of at most ``chunk_elements`` elements (one tensor
    when it alone is larger; 1 makes every tensor its own chunk): torch's
    step runs once per chunk with its multi-tensor kernels, and the undo
    data is computed over the chunk's concatenation, so the work launched
    per step grows with the chunks, not the tensors (on a GPU, per-tensor
    stepping cost 4.2x the step of a 148-tensor model: docs/UNDO.md).
    The default (None) is CHUNK_ELEMENTS[keep] for CUDA tensors and 1 for
    CPU tensors.
    ``before_tensor(i)`` (for tests) is called before the chunk that
    starts at tensor i and once more, with i = the number of tensors,
    after the last. hold() makes the next step wait before a tensor until
    request_stop() (a test hook; a chunk starts at that tensor).

    ``keep``: "inverse" (the default) keeps the inverse's corrections,
    "copy" the originals themselves until the step ends (see the module
    docstring for what each costs).

    ``stats`` after a step: {"elements", "bytes", "exceptions", "chunks",
    ...}: how many elements the step updated, in how many chunks, what the
    undo data took, and, with measure=True, how many elements the inverse
    alone got wrong per buffer and by how much at most ("max_abs").
    """

    def __init__(self, optimizer, on_undone=None, before_tensor=None, measure=False, chunk_elements=None,
                 keep="inverse"):
        self.kind = check_undoable(optimizer)
        if keep not in KEEP:
            raise Error("update-undo: keep must be one of %s, not %r" % (", ".join(repr(k) for k in KEEP), keep))
        if keep == "copy" and measure:
            raise Error("update-undo: measure=True measures the inverse, which keep='copy' does not compute")
        self.keep = keep
        if chunk_elements is not None and (isinstance(chunk_elements, bool) or
                                           not isinstance(chunk_elements, int) or chunk_elements < 1):
            raise Error("update-undo: chunk_elements must be an integer >= 1 or None, not %r"
                        % (chunk_elements,))
        self.chunk_elements = chunk_elements
        self.measure = measure
        self.optimizer = optimizer
        self.on_undone = on_undone
        self.before_tensor = before_tensor
        self.stats = {}
        self._recs = []
        self._stop = threading.Event()
        self._hold = None  # (tensor, note, timeout) for the next step; hold()
        self._installed = None

    # --- installation ----------------------------------------------------------

    def install(self):
        """Replace optimizer.step with the undoable step (idempotent)."""
        opt = self.optimizer
        if self._installed is not None:
            return
        inner = opt.__dict__.get("step")
        # An LR scheduler created before us wrapped step on the instance
        # (torch < 2.0: counting calls, "_with_counter"; torch >= 2.0:
        # noting the call, "_wrapped_by_lr_sched"). Ours replaces its
        # wrapper and does what it did, so that the scheduler neither warns
        # that step() was overridden nor that it ran before step().
        counted = inner is not None and getattr(inner, "_with_counter", False)
        noted = inner is not None and getattr(inner, "_wrapped_by_lr_sched", False)
        if inner is not None and not (counted or noted):
            raise UndoUnsupported("update-undo: %s.step is already wrapped on the instance (by %r); "
                                  "install undo first (reft.torch.Checkpointer(undo=True) before "
                                  "other wrappers)" % (type(opt).__name__, inner))
        undo = self

        def step(o, closure=None):
            if counted:
                o._step_count += 1
            if noted:
                o._opt_called = True
            return undo.step(closure)

        if counted:
            step._with_counter = True
        if noted:
            step._wrapped_by_lr_sched = True
        import types
        opt.step = bound = types.MethodType(step, opt)
        self._installed = (bound, inner)

    def uninstall(self):
        if self._installed is None:
            return
        bound, inner = self._installed
        unwrap_step(self.optimizer, bound, inner)
        self._installed = None

    def request_stop(self):
        """Ask the step in progress to stop at the next chunk boundary and
        undo what it applied (thread-safe; a no-op between steps)."""
        self._stop.set()

    def hold(self, tensor, note=None, timeout=HOLD_MAX):
        """Test hook: the next step() stops before parameter tensor
        ``tensor`` (0-based, in the order step() updates them: the param
        groups' tensors that have a gradient; a chunk starts there), the
        ones before it applied, calls ``note()`` and waits until
        request_stop() — a JIT flush's interrupt — then undoes the applied
        tensors and raises UpdateInterrupted, as at any stop. It stands for
        an update that a failure keeps from ending (a collective inside the
        step, held open while a test kills a node). After ``timeout``
        seconds without a request the step is undone and raises
        reft.Error. One step only; call it from the training thread between
        steps.

        With torch >= 2.0 the Checkpointer's step pre-hook (which declares
        the update to the session) runs per chunk, so before tensor 0 the
        session does not yet know the trainer is updating, and a flush then
        saves without interrupting: hold before tensor 1 or later there."""
        n = sum(len(g["params"]) for g in self.optimizer.param_groups)
        if isinstance(tensor, bool) or not isinstance(tensor, int) or not 0 <= tensor < n:
            raise Error("update-undo: hold before tensor %r: the optimizer updates parameter tensors 0..%d"
                        % (tensor, n - 1))
        if not timeout > 0:
            raise Error("update-undo: hold's timeout must be > 0 seconds, not %r" % (timeout,))
        self._hold = (tensor, note, float(timeout))

    # --- the step ----------------------------------------------------------------

    @torch.no_grad()
    def _one(self, gi, ps):
        """torch's own step on the parameters ps of group gi alone."""
        groups = self.optimizer.param_groups
        for gj, g in enumerate(groups):
            g["params"] = ps if gj == gi else []
        type(self.optimizer).step(self.optimizer)

    def _counts(self, todo):
        """Each tensor's optimizer step count before this update (Adam's;
        None for SGD and for a tensor without state): read once per step,
        one transfer per device, not one per tensor (a CUDA step count is a
        device tensor under capturable or fused)."""
        if self.kind == "sgd" or self.keep == "copy":
            # keep="copy" puts the counts back from its copies: reading a
            # device count would make the host wait for the device every
            # step (fused and capturable keep them on the GPU), and torch's
            # step applies each tensor's own count, so a chunk may mix them.
            return [None] * len(todo)
        out, on = [None] * len(todo), {}
        for i, (_, p) in enumerate(todo):
            st = self.optimizer.state.get(p)
            v = None if not st else st.get("step")
            if torch.is_tensor(v):
                on.setdefault(v.device, []).append((i, v))
            elif v is not None:
                out[i] = float(v)
            else:
                out[i] = 0.0  # no state yet: the step creates the count at 0 and adds 1
        for items in on.values():
            vals = torch.stack([v.reshape(()) for _, v in items]).tolist()  # one copy, not one per tensor
            for (i, _), x in zip(items, vals):
                out[i] = x
        return out

    def _chunks(self, todo, split_at):
        """Split todo into _Rec chunks (see the class docstring); a chunk
        also starts at split_at (hold's tensor)."""
        opt, counts = self.optimizer, self._counts(todo)
        chunks, size = [], 0
        for i, (gi, p) in enumerate(todo):
            st = opt.state.get(p, {})
            new_buf = self.kind == "sgd" and opt.param_groups[gi].get("momentum", 0) != 0 and \
                st.get("momentum_buffer") is None
            key = (gi, p.dtype, p.device, p in opt.state, counts[i],
                   tuple(sorted(k for k, v in st.items() if torch.is_tensor(v))), new_buf)
            last = chunks[-1] if chunks else None
            cap = self.chunk_elements or (CHUNK_ELEMENTS[self.keep] if p.is_cuda else 1)
            if last is not None and last[2] == key and i != split_at and size + p.numel() <= cap:
                last[1].append(p)
                size += p.numel()
            else:
                chunks.append((i, [p], key))
                size = p.numel()
        groups = opt.param_groups
        return [_Rec(ps, first, groups[key[0]], key) for first, ps, key in chunks]

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        opt = self.optimizer
        groups = opt.param_groups
        saved = [g["params"] for g in groups]
        self._recs = []
        self.stats = {}
        # A stop requested since the last step ended applies to this one
        # (the flush found the trainer updating before the step began).
        todo = [(gi, p) for gi, g in enumerate(groups) for p in saved[gi] if p.grad is not None]
        hold, self._hold = self._hold, None
        if hold is not None and hold[0] >= len(todo):
            raise Error("update-undo: hold before tensor %d, but this step updates %d tensors (the others "
                        "have no gradient): hold before 0..%d" % (hold[0], len(todo), len(todo) - 1))
        cur, orig = None, None
        try:
            for p in (p for _, p in todo):
                if p.grad.is_sparse:
                    raise UndoUnsupported("update-undo: a sparse gradient cannot be undone; use dense "
                                          "gradients or run without undo")
            for rec in self._chunks(todo, hold[0] if hold is not None else None):
                i = rec.first
                if self.before_tensor is not None:
                    self.before_tensor(i)
                if hold is not None and i == hold[0]:
                    if hold[1] is not None:
                        hold[1]()
                    if not self._stop.wait(hold[2]):
                        raise Error("update-undo: held before parameter tensor %d, and no JIT flush "
                                    "interrupted the update within %.0f s" % (i, hold[2]))
                if self._stop.is_set():
                    raise UpdateInterrupted("optimizer.step() stopped before parameter tensor %d of %d "
                                            "at a JIT flush's request" % (i, len(todo)))
                cur = rec
                for j, p in enumerate(rec.ps):
                    rec.plain[j] = {k: v for k, v in opt.state.get(p, {}).items() if not torch.is_tensor(v)}
                orig = self._originals(rec)
                self._one(rec.gi, rec.ps)
                if self.keep == "copy":
                    rec.orig = orig
                else:
                    self._record(rec, orig)
                rec.applied = True
                self._recs.append(rec)
                cur, orig = None, None
            if self.before_tensor is not None:
                self.before_tensor(len(todo))
        except BaseException as e:
            for g, ps in zip(groups, saved):
                g["params"] = ps
            if cur is not None and orig is not None:
                self._put_back(cur, orig)  # interrupted inside its update
            n = self.undo()
            self._stop.clear()
            if self.on_undone is not None:
                self.on_undone(n, e)
            raise
        for g, ps in zip(groups, saved):
            g["params"] = ps
        self._summarize()
        self._recs = []
        self._stop.clear()
        return loss

    def _state_lists(self, rec, names):
        st = self.optimizer.state
        return {k: [st[p][k] for p in rec.ps] for k in names}

    def _originals(self, rec):
        """Copies of the chunk's parameters and tensor state, flattened and
        concatenated; the step counts too under keep="copy" (else restored
        from rec.pre)."""
        o = {"p": _flat(rec.ps, copy=True)}  # no state key is named "p"
        for k, ts in self._state_lists(rec, [k for k in rec.before if k != "step"]).items():
            o[k] = _flat(ts, copy=True)
        if self.keep == "copy" and "step" in rec.before:
            steps = self._state_lists(rec, ["step"])["step"]
            if all(torch.is_tensor(x) and x.device == steps[0].device for x in steps):
                o["step"] = torch.stack([x.detach().reshape(()) for x in steps])  # one copy, no host wait
            else:
                o["step"] = [x.detach().clone() if torch.is_tensor(x) else x for x in steps]
        return o

    def _current(self, rec):
        """The chunk's current values, flattened (a view for one tensor)."""
        # .get: indexing the optimizer's state (a defaultdict) would create
        # an entry, and the next step would chunk the tensor apart.
        names = [k for k, v in self.optimizer.state.get(rec.ps[0], {}).items()
                 if torch.is_tensor(v) and k != "step"]
        c = {"p": _flat(rec.ps)}
        for k, ts in self._state_lists(rec, names).items():
            c[k] = _flat(ts)
        return c

    def _restore_plain(self, rec, keys):
        """Drop the state keys in keys that the step created (or give back
        their non-tensor value), and the state of tensors that had none."""
        opt = self.optimizer
        for p, plain in zip(rec.ps, rec.plain):
            st = opt.state.get(p, {})
            for k in keys:
                if k in plain:
                    st[k] = plain[k]
                else:
                    st.pop(k, None)
            if not rec.had_state:
                opt.state.pop(p, None)

    def _put_back(self, rec, orig):
        """Restore a chunk from its copies (an update interrupted inside
        torch's step of it)."""
        opt = self.optimizer
        with torch.no_grad():
            _scatter(orig["p"], rec.ps)
            for k, ts in self._state_lists(rec, [k for k in orig if k not in ("p", "step")]).items():
                _scatter(orig[k], ts)
            created = set()
            for i, p in enumerate(rec.ps):
                st = opt.state.get(p, {})
                created.update(k for k, v in st.items() if torch.is_tensor(v) and k not in rec.before)
                if "step" in orig:
                    v = orig["step"][i]
                    if torch.is_tensor(st["step"]):
                        st["step"].copy_(v)
                    else:
                        st["step"] = v
                elif rec.pre is not None and "step" in rec.before:
                    if torch.is_tensor(st["step"]):
                        st["step"].fill_(rec.pre)
                    else:
                        st["step"] = rec.pre
            self._restore_plain(rec, sorted(created))

    def _record(self, rec, orig):
        st = self.optimizer.state.get(rec.ps[0], {})
        rec.created = tuple(k for k, v in st.items() if torch.is_tensor(v) and k not in rec.before)
        cand = self._inverse(rec, self._current(rec))
        for name, c in cand.items():
            if name in rec.created:
                continue  # dropped by undo: it did not exist before
            o = orig[name]
            rec.exc[name] = _encode(c, o)
            if self.measure:  # the estimate alone: how many differ, by how much
                diff = _bits(c) != _bits(o)
                self.stats[name] = self.stats.get(name, 0) + int(diff.sum())
                if diff.any():
                    err = (c.double() - o.double()).abs()[diff]
                    self.stats["max_abs"] = max(self.stats.get("max_abs", 0.0), float(err.max()))

    @torch.no_grad()
    def _inverse(self, rec, cur):
        """The estimates of the chunk's values before the update, from the
        updated ones (cur: name -> flat tensor): a dict name -> flat tensor
        (the dtype of the tensor it inverts), "p" and the state tensors;
        "step" is handled by undo. PyTorch's expressions
        (torch/optim/sgd.py, adam.py, adamw.py), inverted operand for
        operand, in float32 (float64 for float64 tensors); elementwise, so
        a chunk's concatenation gives each element the bits its tensor
        alone would. A pure function of the updated values: record and undo
        both call it."""
        g, p = rec.group, cur["p"]
        work = torch.float64 if p.dtype == torch.float64 else torch.float32

        def w(t):  # a float32 tensor is itself: only out-of-place ops on it
            return t.detach().to(work)

        lr, wd = float(g["lr"]), float(g.get("weight_decay", 0) or 0)
        grad = _flat(rec.grads)
        if g.get("maximize", False):
            grad = -grad
        out = {}
        if self.kind == "sgd":
            mom, damp = float(g.get("momentum", 0)), float(g.get("dampening", 0))
            if mom == 0:
                # p' = p - lr*(g + wd*p)
                x = w(grad).mul(lr).add_(w(p))
                if wd != 0:
                    x.div_(1 - lr * wd)
                out["p"] = x.to(p.dtype)
                return out
            buf = cur["momentum_buffer"]
            if g.get("nesterov", False):
                # d = g + wd*p; buf' = mom*buf + (1-damp)*d; p' = p - lr*(d + mom*buf')
                x = w(buf).mul(mom).add_(w(grad)).mul_(lr).add_(w(p))
                if wd != 0:
                    x.div_(1 - lr * wd)
            else:
                x = w(buf).mul(lr).add_(w(p))  # p' = p - lr*buf'
            pp = x.to(p.dtype)
            out["p"] = pp
            if rec.new_buf:
                return out  # the buffer is dropped: it did not exist before
            d = grad.add(pp, alpha=wd) if wd != 0 else grad
            out["momentum_buffer"] = w(d).mul(-(1 - damp)).add_(w(buf)).div_(mom).to(buf.dtype)
            return out
        b1, b2 = (float(b) for b in g["betas"])
        eps = float(g["eps"])
        m, v = cur["exp_avg"], cur["exp_avg_sq"]
        step = rec.step
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        step_size = lr / bc1
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)  # as adam.py computes it
        x = w(m).div(w(denom)).mul_(step_size).add_(w(p))  # p' = p - step_size*m'/denom
        if self.kind == "adamw":
            x.div_(1 - lr * wd)  # p*(1 - lr*wd) came first
        pp = x.to(p.dtype)
        out["p"] = pp
        ge = grad.add(pp, alpha=wd) if self.kind == "adam" and wd != 0 else grad
        gw = w(ge)
        out["exp_avg"] = gw.mul(-(1 - b1)).add_(w(m)).div_(b1).to(m.dtype)
        out["exp_avg_sq"] = gw.mul(gw).mul_(-(1 - b2)).add_(w(v)).div_(b2).to(v.dtype)
        return out

    @torch.no_grad()
    def undo(self):
        """Undo the applied chunks of the step in progress (newest first);
        return how many tensors."""
        n = 0
        opt = self.optimizer
        for rec in reversed(self._recs):
            if not rec.applied:
                continue
            if rec.orig is not None:
                self._put_back(rec, rec.orig)
                rec.orig, rec.applied = None, False
                n += len(rec.ps)
                continue
            cand = self._inverse(rec, self._current(rec))
            dec = {name: _decode(c, *rec.exc[name]) for name, c in cand.items() if name not in rec.created}
            for name, flat in dec.items():
                _scatter(flat, rec.ps if name == "p" else [opt.state[p][name] for p in rec.ps])
            if self.kind != "sgd" and "step" not in rec.created:
                for p in rec.ps:
                    opt.state[p]["step"] -= 1
            self._restore_plain(rec, rec.created)
            rec.applied = False
            n += len(rec.ps)
        self._recs = []
        return n

    def _summarize(self):
        s = {"elements": 0, "bytes": 0, "exceptions": 0, "chunks": len(self._recs)}
        for k in ("max_abs", "p", "exp_avg", "exp_avg_sq", "momentum_buffer"):
            if k in self.stats:
                s[k] = self.stats[k]
        for rec in self._recs:
            s["elements"] += sum(p.numel() for p in rec.ps)
            if rec.orig is not None:
                s["bytes"] += sum(t.numel() * t.element_size() for t in rec.orig.values() if torch.is_tensor(t))
                rec.orig = None
            for name, (dense, idx, vals) in rec.exc.items():
                s["exceptions"] += idx.numel()
                s["bytes"] += idx.numel() * (idx.element_size() + vals.element_size()) + dense.numel()
        self.stats = s


def _flat(ts, copy=False):
    """The tensors' values flattened and concatenated, in order: a new
    tensor, or for one tensor with copy=False a view of it."""
    if len(ts) == 1:
        f = ts[0].detach().reshape(-1)
        return f.clone() if copy else f
    return torch.cat([t.detach().reshape(-1) for t in ts])


def _scatter(flat, ts):
    """Write flat (a chunk's concatenation) back into the tensors ts."""
    off = 0
    for t in ts:
        n = t.numel()
        t.detach().copy_(flat[off:off + n].view(t.shape))
        off += n


# The corrections: the difference of the bit patterns, original minus
# estimate, as one int8 per element (integer arithmetic: c + d is o again),
# and the elements whose difference does not fit an int8 as flat index and
# original value.


def _encode(c, o):
    ci, oi = _bits(c).reshape(-1), _bits(o).reshape(-1)
    d = oi - ci  # wraps like the addition in _decode
    d8 = d.to(torch.int8)
    big = d8.to(d.dtype) != d
    idx = big.nonzero().squeeze(1)
    if idx.numel():
        d8.masked_fill_(big, 0)
    return d8, idx, o.reshape(-1)[idx].clone()


def _decode(c, dense, idx, vals):
    """The original of c from its corrections (a new tensor)."""
    out = c.clone()
    flat = out.view(-1)
    b = _bits(flat)
    b.add_(dense.to(b.dtype))
    if idx.numel():
        flat[idx] = vals
    return out
