"""Rollout-trainer mismatch: truncated importance sampling (TIS) and the statistics that show the gap.

The rollout engine samples from ``pi_sampler`` (vLLM, bf16 kernels, possibly weights one step old with
asynchronous rollout); the trainer computes ``pi_old`` for the same tokens with the training engine.
They should be the same distribution but are not exactly: different kernels, precision, batch shapes,
stale weights. The PPO/GRPO ratio ``pi / pi_old`` corrects for the trainer's own policy change, not for
this gap. Truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
You Off-Policy RL Training"; verl's ``tis_imp_ratio_cap``, TRL's ``vllm_importance_sampling_correction``)
multiplies each token's policy-gradient loss by::

    w_t = min(pi_old(y_t) / pi_sampler(y_t), C)                       (level = "token")
    w_i = min(prod_t pi_old(y_t) / pi_sampler(y_t), C)   for all t     (level = "sequence")

The weights are constants (no gradient); the cap ``C`` bounds the variance (Yao et al. use 2).
All functions here are pure tensor functions: ``mask`` is ``[N, T]`` bool/0-1 of real tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["TIS_LEVELS", "tis_weights", "mismatch_stats"]

TIS_LEVELS = ("token", "sequence")


def _check(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    if not (trainer_logp.shape == sampler_logp.shape == mask.shape):
        raise ValueError("trainer_logp, sampler_logp and mask must have the same [N, T] shape, got "
                         f"{tuple(trainer_logp.shape)}, {tuple(sampler_logp.shape)}, {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def tis_weights(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float,
                level: Literal["token", "sequence"] = "token") -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights ``[N, T]`` (1 on padding) and ``stats``.

    ``trainer_logp``: the trainer's logprobs of the sampled tokens before the update (pi_old);
    ``sampler_logp``: the rollout engine's logprobs of the same tokens. ``cap`` > 0 is ``C``.
    The log-ratio is clamped to [-20, 20] before ``exp`` against overflow (the cap is far below).

    ``stats`` (detached): ``tis/weight_mean`` (over valid tokens), ``tis/capped_frac`` (the fraction of
    valid tokens, or with level "sequence" of responses, whose weight was cut to ``C``).
    """
    if not cap > 0:
        raise ValueError(f"the TIS cap must be > 0 (e.g. 2.0), got {cap}")
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown TIS level {level!r}; allowed: {', '.join(TIS_LEVELS)}")
    m = _check(trainer_logp, sampler_logp, mask)
    zero = torch.zeros((), dtype=trainer_logp.dtype, device=trainer_logp.device)
    log_ratio = torch.where(m, trainer_logp.detach() - sampler_logp.detach(), zero)
    if level == "sequence":
        seq = log_ratio.sum(dim=-1, keepdim=True).clamp(-20.0, 20.0)
        raw = torch.exp(seq).expand_as(log_ratio)
    else:
        raw = torch.exp(log_ratio.clamp(-20.0, 20.0))
    w = torch.where(m, raw.clamp(max=cap), torch.ones_like(raw))
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        if level == "sequence":
            valid = m.any(dim=-1)
            capped = ((raw[:, 0] > cap) & valid).sum() / valid.sum().clamp(min=1)
        else:
            capped = (m & (raw > cap)).sum() / n
        stats = {"tis/weight_mean": torch.where(m, w, zero).sum() / n, "tis/capped_frac": capped}
    return w, stats


def mismatch_stats(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the sampler's logprobs are from the trainer's on the sampled tokens (valid ones only).

    ``mismatch/logp_diff_mean`` and ``_max``: mean and max of ``|log pi_old - log pi_sampler|``;
    ``mismatch/kl``: KL(pi_sampler || pi_old) estimated on the sampler's own tokens with the
    non-negative k3 estimator, mean over tokens of ``r - 1 - log r`` with ``r = pi_old / pi_sampler``
    (Schulman 2020); ``mismatch/ratio_max``: the largest token ratio ``pi_old / pi_sampler``.
    """
    m = _check(trainer_logp, sampler_logp, mask)
    if not bool(m.any()):
        return {"mismatch/logp_diff_mean": 0.0, "mismatch/logp_diff_max": 0.0, "mismatch/kl": 0.0,
                "mismatch/ratio_max": 1.0}
    d = (trainer_logp.detach() - sampler_logp.detach()).double()[m].clamp(-20.0, 20.0)
    r = torch.exp(d)
    return {"mismatch/logp_diff_mean": float(d.abs().mean()), "mismatch/logp_diff_max": float(d.abs().max()),
            "mismatch/kl": float((r - 1.0 - d).mean()), "mismatch/ratio_max": float(r.max())}
