"""Wrapping an optimizer's step() per instance, and taking a wrapper off."""


def unwrap_step(opt, bound, inner):
    """Take the per-instance step wrapper `bound` off `opt`, putting back
    `inner` (the instance attribute it replaced; None: the class's step).
    A no-op when step() was wrapped again since: the newer wrapper (a
    scheduler's, say) calls ours, which then passes through."""
    if opt.__dict__.get("step") is bound:
        if inner is None:
            del opt.step
        else:
            opt.step = inner
