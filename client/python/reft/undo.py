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
whatever the rounding. The originals are copied one tensor at a time
(parameter and state) and freed once compared. docs/UNDO.md has the
measured rates and cost.

Ordering: step() runs on the training thread. request_stop() may be called
from any thread (a JIT flush's); the training thread honours it at the
next tensor boundary. This module imports torch; reft itself does not.
"""

import math
import threading

import torch

from ._errors import Error
from ._optstep import unwrap_step

__all__ = ["UpdateUndo", "UndoUnsupported", "UpdateInterrupted", "check_undoable", "HOLD_MAX"]

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


class _Rec:
    """One parameter tensor's update: applied or not, and its exceptions
    (name -> (flat indices, original values))."""
    __slots__ = ("p", "group", "grad", "applied", "exc", "new_buf", "created", "had_state", "plain")

    def __init__(self, p, group):
        self.p, self.group, self.grad = p, group, p.grad
        self.applied, self.exc, self.new_buf = False, {}, False
        self.created, self.had_state = (), True  # state keys the step created
        self.plain = {}  # the state's non-tensor values before the step (SGD's None buffer)


class UpdateUndo:
    """Make ``optimizer``'s step undoable; see the module docstring.

    install() replaces optimizer.step (on the instance) with step(), which
    updates tensor by tensor and keeps the undo data until the step ends;
    an exception out of the step, or request_stop() before a tensor,
    undoes the applied tensors, calls ``on_undone(tensors, cause)`` and
    re-raises (UpdateInterrupted for a request). ``before_tensor(i)`` (for
    tests) is called before tensor i and once more, with i = the number of
    tensors, after the last. hold() makes the next step wait before a
    tensor until request_stop() (a test hook).

    ``stats`` after a step: {"elements", "p", "exp_avg", ...}: how many
    elements the step updated and how many exceptions it kept per buffer.
    """

    def __init__(self, optimizer, on_undone=None, before_tensor=None, measure=False):
        self.kind = check_undoable(optimizer)
        self.measure = measure  # stats also get "max_abs": the inverse alone's largest error
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
        counted = inner is not None and getattr(inner, "_with_counter", False)
        if inner is not None and not counted:
            raise UndoUnsupported("update-undo: %s.step is already wrapped on the instance (by %r); "
                                  "install undo first (reft.torch.Checkpointer(undo=True) before "
                                  "other wrappers)" % (type(opt).__name__, inner))
        undo = self

        def step(o, closure=None):
            if counted:
                o._step_count += 1  # what the LR scheduler's wrapper we replace did
            return undo.step(closure)

        if counted:
            step._with_counter = True
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
        """Ask the step in progress to stop at the next tensor boundary and
        undo what it applied (thread-safe; a no-op between steps)."""
        self._stop.set()

    def hold(self, tensor, note=None, timeout=HOLD_MAX):
        """Test hook: the next step() stops before parameter tensor
        ``tensor`` (0-based, in the order step() updates them: the param
        groups' tensors that have a gradient), the ones before it applied,
        calls ``note()`` and waits until request_stop() — a JIT flush's
        interrupt — then undoes the applied tensors and raises
        UpdateInterrupted, as at any stop. It stands for an update that a
        failure keeps from ending (a collective inside the step, held open
        while a test kills a node). After ``timeout`` seconds without a
        request the step is undone and raises reft.Error. One step only;
        call it from the training thread between steps.

        With torch >= 2.0 the Checkpointer's step pre-hook (which declares
        the update to the session) runs per tensor, so before tensor 0 the
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
    def _one(self, gi, p):
        """torch's own step on parameter p alone."""
        groups = self.optimizer.param_groups
        for gj, g in enumerate(groups):
            g["params"] = [p] if gj == gi else []
        type(self.optimizer).step(self.optimizer)

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
            for i, (gi, p) in enumerate(todo):
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
                cur = _Rec(p, groups[gi])
                if p.grad.is_sparse:
                    raise UndoUnsupported("update-undo: a sparse gradient cannot be undone; use dense "
                                          "gradients or run without undo")
                cur.had_state = p in opt.state
                st = opt.state.get(p, {})
                cur.new_buf = self.kind == "sgd" and groups[gi].get("momentum", 0) != 0 and \
                    st.get("momentum_buffer") is None
                orig = self._originals(p, st)
                cur.plain = {k: v for k, v in st.items() if not torch.is_tensor(v)}
                self._one(gi, p)
                self._record(cur, orig)
                cur.applied = True
                self._recs.append(cur)
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

    def _originals(self, p, st):
        o = {"p": p.detach().clone()}  # no state key is named "p"
        for k, v in st.items():
            if torch.is_tensor(v):
                o[k] = v.detach().clone()
        return o

    def _put_back(self, rec, orig):
        """Restore one tensor from its copy (an update interrupted inside
        torch's step of it)."""
        p = rec.p
        st = self.optimizer.state.get(p, {})
        with torch.no_grad():
            p.copy_(orig["p"])
            for k in list(st.keys()):
                if k in orig and k != "p":
                    st[k].copy_(orig[k])
                elif torch.is_tensor(st[k]):  # created by this step (the first step's state)
                    if k in rec.plain:
                        st[k] = rec.plain[k]
                    else:
                        del st[k]
            if not rec.had_state:
                self.optimizer.state.pop(p, None)

    def _record(self, rec, orig):
        st = self.optimizer.state[rec.p]
        rec.created = tuple(k for k, v in st.items() if torch.is_tensor(v) and k not in orig)
        cand = self._inverse(rec, st)
        for name, c in cand.items():
            if name in rec.created:
                continue  # dropped by undo: it did not exist before
            o = orig[name]
            if not o.is_contiguous():
                raise UndoUnsupported("update-undo: a non-contiguous %s tensor; undo keeps flat indices "
                                      "and needs contiguous parameters and state" % name)
            rec.exc[name] = _encode(c, o)
            if self.measure:  # the estimate alone: how many differ, by how much
                diff = (_bits(c) != _bits(o)).reshape(-1)
                self.stats[name] = self.stats.get(name, 0) + int(diff.sum())
                if diff.any():
                    err = (c.double() - o.double()).abs().reshape(-1)[diff]
                    self.stats["max_abs"] = max(self.stats.get("max_abs", 0.0), float(err.max()))

    @torch.no_grad()
    def _inverse(self, rec, st):
        """The estimates of the values before the update, from the updated
        ones: a dict name -> tensor (the dtype of the tensor it inverts),
        "p" and the state tensors; "step" is handled by undo. PyTorch's
        expressions (torch/optim/sgd.py, adam.py, adamw.py), inverted
        operand for operand, in float32 (float64 for float64 tensors). A
        pure function of the updated values: record and undo both call it."""
        g, p = rec.group, rec.p
        work = torch.float64 if p.dtype == torch.float64 else torch.float32

        def w(t):  # a float32 tensor is itself: only out-of-place ops on it
            return t.detach().to(work)

        lr, wd = float(g["lr"]), float(g.get("weight_decay", 0) or 0)
        grad = rec.grad if not g.get("maximize", False) else -rec.grad
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
            buf = st["momentum_buffer"]
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
        m, v = st["exp_avg"], st["exp_avg_sq"]
        step = float(st["step"].item()) if torch.is_tensor(st["step"]) else float(st["step"])
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
        """Undo the applied tensors of the step in progress (newest first);
        return how many."""
        n = 0
        for rec in reversed(self._recs):
            if not rec.applied:
                continue
            st = self.optimizer.state[rec.p]
            cand = self._inverse(rec, st)
            for name, c in cand.items():
                if name in rec.created:
                    continue
                t = rec.p if name == "p" else st[name]
                t.copy_(_decode(c, *rec.exc[name]))
            if self.kind != "sgd" and "step" not in rec.created:
                st["step"] -= 1
            for k in rec.created:
                if k in rec.plain:
                    st[k] = rec.plain[k]
                else:
                    del st[k]
            if not rec.had_state:
                del self.optimizer.state[rec.p]
            rec.applied = False
            n += 1
        self._recs = []
        return n

    def _summarize(self):
        s = {"elements": 0, "bytes": 0, "exceptions": 0}
        for k in ("max_abs", "p", "exp_avg", "exp_avg_sq", "momentum_buffer"):
            if k in self.stats:
                s[k] = self.stats[k]
        for rec in self._recs:
            s["elements"] += rec.p.numel()
            for name, (dense, idx, vals) in rec.exc.items():
                s["exceptions"] += idx.numel()
                s["bytes"] += idx.numel() * (idx.element_size() + vals.element_size()) + dense.numel()
        self.stats = s


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
