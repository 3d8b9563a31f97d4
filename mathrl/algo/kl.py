"""Per-token estimators of KL(pi || pi_ref) from log-probabilities of sampled tokens.

With tokens sampled from ``pi`` and ``log r = ref_logp - logp`` (the log ratio
``pi_ref / pi`` at the sampled token), J. Schulman's note "Approximating KL
Divergence" (2020) gives three Monte-Carlo estimators of ``KL(pi || pi_ref)``:

======  ==============================  ===========================================
kind    formula                         properties
======  ==============================  ===========================================
k1      ``logp - ref_logp = -log r``    unbiased, high variance, can be negative
k2      ``0.5 * (logp - ref_logp)^2``   biased, low variance, >= 0; its gradient
                                        (as a loss) is the on-policy gradient of KL
k3      ``r - log r - 1``               unbiased, low variance, >= 0 (= 0 iff r = 1);
                                        the form used in GRPO's loss (DeepSeekMath,
                                        Shao et al. 2024, eq. 4)
======  ==============================  ===========================================

Each is registered by its kind in :data:`mathrl.registry.KL_ESTIMATORS` (the choices of
``algo.kl_estimator``); :func:`estimate` dispatches by name.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mathrl.registry import KL_ESTIMATORS

__all__ = ["KL_ESTIMATORS", "estimate", "k1", "k2", "k3"]


@KL_ESTIMATORS.register("k1", doc="logp - ref_logp: unbiased, high variance, can be negative")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k1 = logp - ref_logp`` (Schulman 2020). Unbiased estimate of KL(pi || pi_ref)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2", doc="0.5 * (logp - ref_logp)^2: biased, low variance, >= 0")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k2 = 0.5 * (logp - ref_logp)^2`` (Schulman 2020). Non-negative, biased."""
    d = logp - ref_logp
    return 0.5 * d * d


@KL_ESTIMATORS.register("k3", doc="r - log r - 1 with r = pi_ref / pi: unbiased, low variance, >= 0 (GRPO)")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1`` (Schulman 2020; DeepSeekMath eq. 4).

    Non-negative because ``e^x >= 1 + x``, with equality iff ``logp == ref_logp``.
    """
    x = ref_logp - logp
    # expm1(x) - x is e^x - 1 - x computed without cancellation for small |x|.
    return torch.expm1(x) - x


def estimate(
    logp: Tensor,
    ref_logp: Tensor,
    kind: str,
    *,
    mask: Tensor | None = None,
    log_ratio_clip: float | None = None,
) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate of the given ``kind`` (``k1``, ``k2`` or ``k3``).

    ``logp`` and ``ref_logp`` are ``[N, T]`` log-probabilities of the sampled tokens
    under the current and the reference policy. Returns ``[N, T]``.

    Options (both off by default, so the result is the exact formula):

    * ``mask``: positions where it is 0 are returned as exactly 0, whatever the
      inputs hold there (even inf/NaN); gradients there are 0.
    * ``log_ratio_clip``: clamp ``logp - ref_logp`` to ``[-c, c]`` first, so that
      ``k3``'s exponential cannot overflow (verl uses c = 20). Clamped positions get
      no gradient.
    """
    fn = KL_ESTIMATORS.get(kind)  # an unknown kind: UnknownNameError, a ValueError naming the allowed ones
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp shape {tuple(logp.shape)} does not match ref_logp shape {tuple(ref_logp.shape)}"
        )
    ref = ref_logp
    m: Tensor | None = None
    if mask is not None:
        if mask.shape != logp.shape:
            raise ValueError(
                f"mask shape {tuple(mask.shape)} does not match logp shape {tuple(logp.shape)}"
            )
        m = mask if mask.dtype == torch.bool else mask != 0
        # Replace padding by a harmless pair (0, 0) before any arithmetic so that
        # inf/NaN at padding reach neither the output nor the gradient.
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        logp = torch.where(m, logp, zero)
        ref = torch.where(m, ref, zero.to(ref.dtype))
    if log_ratio_clip is not None:
        if log_ratio_clip <= 0:
            raise ValueError(f"log_ratio_clip must be > 0, got {log_ratio_clip}")
        d = (logp - ref).clamp(-log_ratio_clip, log_ratio_clip)
        out = fn(d, torch.zeros_like(d))
    else:
        out = fn(logp, ref)
    if m is not None:
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out
