"""The job's parallel layout: data, pipeline and tensor parallel degrees.

The agent records the layout in every manifest, so that a later run (or a
peer protecting this rank's shard) knows which ranks hold replicated state.
"""

import os

from ._errors import Error

_DIMS = ("dp", "pp", "tp")
_MAX_DIM = 1 << 20  # same bound as the --reft SPEC parser


class Layout:
    """dp x pp x tp ranks; ``order`` lists the dimensions from the fastest
    varying in the rank number to the slowest. The default ``tp-dp-pp``
    (Megatron's) puts the tensor-parallel peers of a rank on consecutive
    ranks, so usually on one node.

    A dimension left as None is derived by :meth:`resolve`: pp and tp
    default to 1 and dp takes the remaining ranks.
    """

    def __init__(self, dp=None, pp=None, tp=None, order="tp-dp-pp"):
        for name, v in (("dp", dp), ("pp", pp), ("tp", tp)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                  or not 1 <= v <= _MAX_DIM):
                raise Error("reft.Layout: %s=%r must be a positive integer (at most %d)"
                            % (name, v, _MAX_DIM))
        parts = order.split("-") if isinstance(order, str) else []
        if sorted(parts) != sorted(_DIMS):
            raise Error("reft.Layout: order=%r must name dp, pp and tp once each, joined by "
                        "'-', fastest varying first (e.g. \"tp-dp-pp\")" % (order,))
        self.dp, self.pp, self.tp, self.order = dp, pp, tp, order

    @classmethod
    def parse(cls, text):
        """Parse "dp=2,pp=1,tp=4,order=tp-dp-pp" (the form str() writes;
        any key may be left out)."""
        kw = {}
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in _DIMS + ("order",) or key in kw:
                raise Error("reft.Layout: cannot read %r in %r; write dp=N,pp=N,tp=N,order=tp-dp-pp"
                            % (part, text))
            kw[key] = value if key == "order" else _positive(key, value, text)
        return cls(**kw)

    @classmethod
    def from_spec(cls, spec):
        """The dp=, pp= and tp= keys of a --reft SPEC (REFT_SPEC), or None
        when it has none of them."""
        kw = {}
        for part in (spec or "").split(",")[1:]:  # the first element is the modes
            key, sep, value = part.strip().partition("=")
            key = key.strip()
            if sep and key in _DIMS:
                kw[key] = _positive(key, value.strip(), "REFT_SPEC=" + spec)
        return cls(**kw) if kw else None

    def resolve(self, world):
        """A copy with every dimension set, checked against the world size."""
        pp, tp = self.pp or 1, self.tp or 1
        dp = self.dp
        if dp is None:
            if world % (pp * tp):
                raise Error("reft layout: pp=%d x tp=%d = %d does not divide the %d ranks of the "
                            "job; fix dp=/pp=/tp= in --reft or in reft.Layout" % (pp, tp, pp * tp, world))
            dp = world // (pp * tp)
        if dp * pp * tp != world:
            raise Error("reft layout: dp=%d x pp=%d x tp=%d = %d ranks, but the job has %d "
                        "(SLURM_NTASKS); fix dp=/pp=/tp= in --reft or in reft.Layout"
                        % (dp, pp, tp, dp * pp * tp, world))
        return Layout(dp=dp, pp=pp, tp=tp, order=self.order)

    def coords(self, rank):
        """{'dp': i, 'pp': j, 'tp': k} of rank in a resolved layout."""
        if None in (self.dp, self.pp, self.tp):
            raise Error("reft.Layout.coords: resolve the layout first")
        out = {}
        for dim in self.order.split("-"):
            size = getattr(self, dim)
            out[dim] = rank % size
            rank //= size
        return out

    def __str__(self):
        dims = ",".join("%s=%s" % (d, getattr(self, d)) for d in _DIMS if getattr(self, d) is not None)
        return (dims + "," if dims else "") + "order=" + self.order

    def __repr__(self):
        return "reft.Layout(dp=%r, pp=%r, tp=%r, order=%r)" % (self.dp, self.pp, self.tp, self.order)

    def __eq__(self, other):
        return isinstance(other, Layout) and (self.dp, self.pp, self.tp, self.order) == (
            other.dp, other.pp, other.tp, other.order)

    def __hash__(self):
        return hash((self.dp, self.pp, self.tp, self.order))


def _positive(key, value, where):
    try:
        v = int(value)
    except ValueError:
        v = 0
    if not 1 <= v <= _MAX_DIM:
        raise Error("reft layout: %s=%s in %r must be a positive integer (at most %d)"
                    % (key, value, where, _MAX_DIM))
    return v


def default_layout(layout, world):
    """The session's layout: the one given (Layout or its string), else the
    dp=/pp=/tp= of REFT_SPEC, else pure data parallel over all ranks."""
    if layout is None:
        layout = Layout.from_spec(os.environ.get("REFT_SPEC", "")) or Layout(dp=world)
    elif isinstance(layout, str):
        layout = Layout.parse(layout)
    elif not isinstance(layout, Layout):
        raise Error("reft.Session: layout must be a reft.Layout, its string form or None, not %s"
                    % type(layout).__name__)
    return layout.resolve(world)
