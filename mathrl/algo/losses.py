"""Policy and value losses and their aggregation modes.

Everything here is a pure tensor function (no model, engine or config object, no
distributed call inside a loss). Shapes: ``N`` responses, ``T`` response tokens;
``mask`` is a 0/1 float or bool ``[N, T]`` tensor of real tokens. The per-token log-probs
and entropies these losses take come from :mod:`mathrl.algo.logprobs`.

Aggregation and the global normaliser
-------------------------------------
A loss is first a per-token matrix ``l[i, t]``; :func:`agg_loss` reduces it with one of the modes
registered in :data:`mathrl.registry.LOSS_AGG_MODES` (the choices of ``algo.loss_agg``):

===========================  =================================================  ===================
mode                         formula for one micro-batch                        invariant when
===========================  =================================================  ===================
``token-mean``               ``sum_it m*l / norm_tokens``                       ``norm_tokens`` is
                             (DAPO's token-level loss, Yu et al. 2025)          the global count
``seq-mean-token-mean``      ``sum_i [sum_t m*l / sum_t m] / norm_seqs``        ``norm_seqs`` is
                             (GRPO's per-sequence mean, Shao et al. 2024)       the global count
``seq-mean-token-sum``       ``sum_i [sum_t m*l] / norm_seqs``                  ``norm_seqs`` global
``seq-mean-token-sum-norm``  ``sum_i [sum_t m*l / norm_const] / norm_seqs``     ``norm_seqs`` global
                             (Dr. GRPO, Liu et al. 2025: a constant such as     and ``norm_const``
                             the max response length replaces ``1/|o_i|``)      fixed
===========================  =================================================  ===================

``norm_tokens`` = number of valid tokens and ``norm_seqs`` = number of responses with at
least one valid token **in the whole optimizer step** (all micro-batches, accumulation
steps and ranks); :func:`global_normalizers` computes both. When they are left ``None``
the micro-batch's own counts are used, which is correct for a single micro-batch on one
process but makes the gradient depend on how the batch is split (the classic
gradient-accumulation bug). With the global normalisers, the **sum** of the micro-batch
gradients over all micro-batches and ranks equals the full-batch gradient exactly.
Engines that *average* instead of sum (DDP and DeepSpeed divide by the world size;
DeepSpeed also divides the loss by ``gradient_accumulation_steps``) need the loss
multiplied by ``world_size * accumulation_steps`` to compensate.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from mathrl.registry import LOSS_AGG_MODES, POLICY_LOSSES

__all__ = [
    "LOSS_AGG_MODES",
    "Normalizers",
    "agg_loss",
    "global_normalizers",
    "POLICY_LOSSES",
    "cispo_loss",
    "gspo_loss",
    "policy_loss",
    "value_loss",
]


# --------------------------------------------------------------------------- aggregation


def _bool_mask(mask: Tensor, like: Tensor, what: str) -> Tensor:
    if mask.shape != like.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} does not match {what} shape {tuple(like.shape)}"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def _check_norm(name: str, value: float | Tensor | None) -> None:
    if value is None or isinstance(value, Tensor):
        return
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _masked_zero(x: Tensor, m: Tensor) -> Tensor:
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _seq_count(m: Tensor, norm_seqs: float | Tensor | None) -> Tensor | float:
    if norm_seqs is not None:
        return norm_seqs
    return m.any(dim=-1).sum().clamp(min=1)


@LOSS_AGG_MODES.register("token-mean", doc="mean over the tokens of the whole step (DAPO)")
def _agg_token_mean(lm, m, norm_tokens, norm_seqs, norm_const):
    denom = norm_tokens if norm_tokens is not None else m.sum().clamp(min=1)
    return lm.sum() / denom


@LOSS_AGG_MODES.register("seq-mean-token-mean", doc="mean over responses of each response's token mean (GRPO)")
def _agg_seq_mean_token_mean(lm, m, norm_tokens, norm_seqs, norm_const):
    per_seq = lm.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)
    return per_seq.sum() / _seq_count(m, norm_seqs)


@LOSS_AGG_MODES.register("seq-mean-token-sum", doc="mean over responses of each response's token sum")
def _agg_seq_mean_token_sum(lm, m, norm_tokens, norm_seqs, norm_const):
    return lm.sum() / _seq_count(m, norm_seqs)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm",
                         doc="token sums over algo.norm_const, mean over responses (Dr. GRPO)")
def _agg_seq_mean_token_sum_norm(lm, m, norm_tokens, norm_seqs, norm_const):
    if norm_const is None:
        raise ValueError(
            "agg='seq-mean-token-sum-norm' needs norm_const (Dr. GRPO's constant, e.g. the "
            "maximum response length); it must not depend on the micro-batch"
        )
    return lm.sum() / norm_const / _seq_count(m, norm_seqs)


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
    *,
    norm_tokens: float | Tensor | None = None,
    norm_seqs: float | Tensor | None = None,
    norm_const: float | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[N, T]`` to a scalar with the aggregation mode ``agg``.

    Padding positions are excluded with ``torch.where`` (inf/NaN there cannot leak).
    ``norm_tokens``/``norm_seqs`` are the global normalisers (see the module docstring
    and :func:`global_normalizers`); ``norm_const`` is Dr. GRPO's constant for
    ``seq-mean-token-sum-norm`` (required there).
    """
    fn = LOSS_AGG_MODES.get(agg)  # an unknown mode: UnknownNameError, a ValueError naming the allowed ones
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [N, T], got shape {tuple(loss_mat.shape)}")
    _check_norm("norm_tokens", norm_tokens)
    _check_norm("norm_seqs", norm_seqs)
    _check_norm("norm_const", norm_const)
    m = _bool_mask(mask, loss_mat, "loss_mat")
    return fn(_masked_zero(loss_mat, m), m, norm_tokens, norm_seqs, norm_const)


class Normalizers(NamedTuple):
    """Global counts for one optimizer step (pass as ``norm_tokens=``, ``norm_seqs=``)."""

    tokens: float
    """Valid tokens in the whole step (all micro-batches, all ranks)."""
    seqs: float
    """Responses with at least one valid token in the whole step."""


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED = _Required()


def global_normalizers(
    masks: Tensor | Sequence[Tensor], *,
    reduce: Callable[[Tensor], Tensor] | None | _Required = _REQUIRED,
) -> Normalizers:
    """Count valid tokens and non-empty responses over all micro-batches of a step.

    ``masks`` are the ``[n_k, T_k]`` masks of this process's micro-batches (or one
    mask). ``reduce`` is required: a sum over ranks returning the summed tensor, so every
    rank gets the same global numbers (the trainer passes :func:`mathrl.dist.collectives.global_sum`,
    which moves the counts to the engine's device, as NCCL needs), or ``None`` for this
    process's counts only (one process). This module issues no collective itself (algo/ has
    no ``torch.distributed``), so forgetting ``reduce`` is an error rather than a silent
    per-rank count. Call it once per optimizer step, before the micro-batch loop, and pass
    the result to every loss of the step::

        n = global_normalizers([mb.mask for mb in micro_batches], reduce=global_sum)
        loss, stats = policy_loss(..., agg="token-mean", norm_tokens=n.tokens, norm_seqs=n.seqs)
    """
    if reduce is _REQUIRED:
        raise TypeError(
            "global_normalizers(masks, reduce=...): reduce is required: pass "
            "reduce=mathrl.dist.collectives.global_sum when several processes train (it sums the counts over "
            "ranks on the engine's device), or reduce=None for this process's counts only")
    if reduce is not None and not callable(reduce):
        raise TypeError(f"global_normalizers: reduce must be a callable (a sum over ranks) or None, got {reduce!r}")
    if isinstance(masks, Tensor):
        masks = [masks]
    masks = list(masks)
    if not masks:
        raise ValueError("global_normalizers needs at least one mask")
    device = masks[0].device
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for m in masks:
        if m.dim() != 2:
            raise ValueError(f"each mask must be [n, T], got shape {tuple(m.shape)}")
        b = m if m.dtype == torch.bool else m != 0
        counts[0] += b.sum().to(device)
        counts[1] += b.any(dim=-1).sum().to(device)
    if reduce is not None:
        counts = reduce(counts)
    tokens, seqs = counts.tolist()
    return Normalizers(tokens=max(tokens, 1.0), seqs=max(seqs, 1.0))


# --------------------------------------------------------------------------- losses


def _check_policy_args(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float,
                       dual_clip: float | None, weights: Tensor | None) -> None:
    if not (logp.shape == old_logp.shape == advantages.shape):
        raise ValueError(
            "logp, old_logp and advantages must have the same [N, T] shape, got "
            f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(advantages.shape)}"
        )
    if weights is not None and weights.shape != logp.shape:
        raise ValueError(f"weights must have the [N, T] shape {tuple(logp.shape)}, got {tuple(weights.shape)}")
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low must be in [0, 1] (1 = no lower bound), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")


def _ratio_stats(r: Tensor, log_ratio: Tensor, m: Tensor, low: Tensor, high: Tensor, dual: Tensor
                 ) -> dict[str, Tensor]:
    """The statistics every policy loss reports (detached; over this call's valid tokens)."""
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        any_valid = m.any()
        inf = torch.tensor(float("inf"), dtype=r.dtype, device=r.device)
        one = torch.ones((), dtype=r.dtype, device=r.device)
        return {
            "clipfrac_low": low.sum() / n,
            "clipfrac_high": high.sum() / n,
            "clipfrac": (low | high).sum() / n,
            "dual_clipfrac": dual.sum() / n,
            "approx_kl": _masked_zero(r - 1.0 - log_ratio, m).sum() / n,
            "ratio_min": torch.where(any_valid, torch.where(m, r, inf).min(), one),
            "ratio_max": torch.where(any_valid, torch.where(m, r, -inf).max(), one),
            "ratio_mean": _masked_zero(r, m).sum() / n,
        }


def _clipped_surrogate(ratio: Tensor, adv: Tensor, m: Tensor, clip_low: float, clip_high: float,
                       dual_clip: float | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's per-token clipped loss for a ratio tensor (with gradient) and the masks of where the clip
    (low, high) and the dual clip are active."""
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    r = ratio.detach()
    high = m & (adv > 0) & (r > 1.0 + clip_high)
    low = m & (adv < 0) & (r < 1.0 - clip_low)
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, -adv * dual_clip), loss_mat)
        dual = m & (adv < 0) & (r > dual_clip)
    return loss_mat, low, high, dual


def _weighted(loss_mat: Tensor, weights: Tensor | None, m: Tensor) -> Tensor:
    """Per-token importance weights (truncated importance sampling, :mod:`mathrl.algo.correction`) are
    constants that scale each token's loss."""
    if weights is None:
        return loss_mat
    return loss_mat * _masked_zero(weights.detach(), m)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    norm_tokens: float | Tensor | None = None,
    norm_const: float | None = None,
    norm_seqs: float | Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with asymmetric and dual clip.

    Per valid token, with ``rho = exp(logp - old_logp)`` and advantage ``A``::

        l     = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
        l     = min(l, -A * c)      if dual_clip = c (c > 1) and A < 0
        l     = w * l               with importance weights w (``weights``, constants; e.g. TIS)

    ``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025); the dual-clip
    lower bound for negative advantages is from Ye et al. 2020 ("Mastering Complex
    Control in MOBA Games"). The gradient is 0 where the ratio has left the clip range
    in the direction the advantage pushes it (``A > 0, rho > 1 + clip_high`` or
    ``A < 0, rho < 1 - clip_low``; also ``A < 0, rho > c`` with dual clip). The
    per-token losses are reduced with :func:`agg_loss` (``agg``, ``norm_tokens``,
    ``norm_seqs``, ``norm_const``). ``log(rho)`` is clamped to [-20, 20] against
    overflow; padding positions use ``rho = 1`` and are excluded.

    ``stats`` (detached 0-dim tensors, means over this call's valid tokens):
    ``clipfrac_low``, ``clipfrac_high``, ``clipfrac`` (their sum), ``dual_clipfrac``,
    ``approx_kl`` (k3 estimate of KL(pi_old || pi) = mean(rho - 1 - log rho)),
    ``ratio_min``, ``ratio_max``, ``ratio_mean``.
    """
    _check_policy_args(logp, old_logp, advantages, clip_low, clip_high, dual_clip, weights)
    m = _bool_mask(mask, logp, "logp")
    adv = _masked_zero(advantages.detach(), m)
    log_ratio = _masked_zero(logp - old_logp.detach(), m).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_mat, low, high, dual = _clipped_surrogate(ratio, adv, m, clip_low, clip_high, dual_clip)
    loss = agg_loss(_weighted(loss_mat, weights, m), m, agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs,
                    norm_const=norm_const)
    return loss, _ratio_stats(ratio.detach(), log_ratio.detach(), m, low, high, dual)


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    agg: str = "seq-mean-token-mean",
    norm_tokens: float | Tensor | None = None,
    norm_const: float | None = None,
    norm_seqs: float | Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one importance ratio per
    response, the geometric mean of its token ratios, clipped per response::

        s_i = exp( (1/|y_i|) sum_t (logp_it - old_logp_it) )
        J   = mean_i min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)

    Written per token in the paper's GSPO-token form, ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]``: its
    value is ``s_i`` at every token of response ``i`` and its gradient ``s_i * grad log pi(y_it)``, so
    with ``agg = "seq-mean-token-mean"`` (the default here) the gradient is exactly GSPO's
    ``mean_i s_i A_i (1/|y_i|) sum_t grad log pi(y_it)``, and a clipped response contributes nothing.
    Per-token advantages are allowed (the GSPO-token variant); GRPO's are constant in a response.
    The paper's clip ranges are small (3e-4, 4e-4: sequence ratios stay near 1), hence the defaults.
    Dual clip and ``weights`` behave as in :func:`policy_loss`; ``stats`` as there, with the sequence
    ratio repeated on every token (so ``clipfrac`` is the token-weighted fraction of clipped responses).
    """
    _check_policy_args(logp, old_logp, advantages, clip_low, clip_high, dual_clip, weights)
    m = _bool_mask(mask, logp, "logp")
    adv = _masked_zero(advantages.detach(), m)
    tok_log_ratio = _masked_zero(logp - old_logp.detach(), m)
    seq_log_ratio = (tok_log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)).clamp(-20.0, 20.0)
    # value s_i, gradient s_i * grad logp_t
    log_ratio = _masked_zero(seq_log_ratio.detach() + logp - logp.detach(), m)
    ratio = torch.exp(log_ratio)
    loss_mat, low, high, dual = _clipped_surrogate(ratio, adv, m, clip_low, clip_high, dual_clip)
    loss = agg_loss(_weighted(loss_mat, weights, m), m, agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs,
                    norm_const=norm_const)
    return loss, _ratio_stats(ratio.detach(), log_ratio.detach(), m, low, high, dual)


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    norm_tokens: float | Tensor | None = None,
    norm_const: float | None = None,
    norm_seqs: float | Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update. Per valid token::

        l = -sg[clip(rho, 1 - clip_low, 1 + clip_high)] * A * logp

    The gradient ``-clip(rho) * A * grad logp`` equals PPO's unclipped one inside the range, and outside
    it every token still contributes with a bounded weight (PPO drops those tokens' gradient). MiniMax-M1
    imposes no lower bound on the weight ("we did not impose a lower bound ... only tuned epsilon_high"):
    ``clip_low = 1.0`` (the default) is exactly that, the weight may fall to 0; its ``epsilon_high`` is not
    published, 0.28 (DAPO's clip-higher, Trinity-RFT's CISPO default) is the default. The objective is
    normalised by the step's total token count, ``agg = "token-mean"``. ``dual_clip`` must be None
    (the weight is already bounded); ``weights`` and ``stats`` as in :func:`policy_loss`
    (``clipfrac_*``: where the weight was cut).
    """
    _check_policy_args(logp, old_logp, advantages, clip_low, clip_high, dual_clip, weights)
    if dual_clip is not None:
        raise ValueError("cispo_loss bounds its importance weight by clip_low/clip_high; dual_clip must be None")
    m = _bool_mask(mask, logp, "logp")
    adv = _masked_zero(advantages.detach(), m)
    log_ratio = _masked_zero(logp.detach() - old_logp.detach(), m).clamp(-20.0, 20.0)
    r = torch.exp(log_ratio)
    w = r.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = -w * adv * _masked_zero(logp, m)
    high = m & (r > 1.0 + clip_high)
    low = m & (r < 1.0 - clip_low)
    loss = agg_loss(_weighted(loss_mat, weights, m), m, agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs,
                    norm_const=norm_const)
    return loss, _ratio_stats(r, log_ratio, m, low, high, torch.zeros_like(m))


# ``algo.policy_loss`` name -> loss function; all share :func:`policy_loss`'s signature. ``settings``: the paper's
# clip range and aggregation, what ``algo.clip_low``/``clip_high``/``loss_agg: auto`` resolve to
# (:attr:`mathrl.config.Config.clip_low`), and equal to the function's own defaults (tested).
POLICY_LOSSES.register("ppo", policy_loss, doc="token-level clipped ratio (PPO, Schulman et al. 2017)",
                       settings={"clip_low": 0.2, "clip_high": 0.2, "loss_agg": "token-mean"})
POLICY_LOSSES.register(
    "gspo", gspo_loss, doc="one ratio per response, the geometric mean of its token ratios, clipped per response "
    "(Zheng et al. 2025; auto settings: clip 3e-4/4e-4, seq-mean-token-mean)",
    settings={"clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"})
POLICY_LOSSES.register(
    "cispo", cispo_loss, doc="the clipped ratio as a constant weight on every token's logprob gradient, so clipped "
    "tokens still learn (MiniMax-M1 2025; auto settings: no lower bound, clip_high 0.28, token-mean)",
    settings={"clip_low": 1.0, "clip_high": 0.28, "loss_agg": "token-mean"})


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    norm_tokens: float | Tensor | None = None,
    norm_const: float | None = None,
    norm_seqs: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss of PPO (Schulman et al. 2017; the "value clipping" of the
    OpenAI baselines implementation, discussed by Engstrom et al. 2020).

    Per valid token, with ``v_clip = old_v + clip(v - old_v, -clip, clip)``::

        l = 0.5 * max((v - R)^2, (v_clip - R)^2)

    The factor ½ makes ``dl/dv = v - R`` on the unclipped branch (as in the baselines
    and verl); scale with the value-loss coefficient outside. ``clip=None`` gives the
    plain ``0.5 * (v - R)^2``. Reduced with :func:`agg_loss` like :func:`policy_loss`.

    ``stats`` (detached, over valid tokens): ``vf_clipfrac`` (fraction where the clipped
    error is the larger one), ``value_mean``, ``value_error`` (mean of ``(v - R)^2``).
    """
    if not (values.shape == old_values.shape == returns.shape):
        raise ValueError(
            "values, old_values and returns must have the same [N, T] shape, got "
            f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}"
        )
    if clip is not None and not clip > 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip}")
    m = _bool_mask(mask, values, "values")
    v = _masked_zero(values, m)
    old = _masked_zero(old_values.detach(), m)
    ret = _masked_zero(returns.detach(), m)
    err = (v - ret) ** 2
    if clip is None:
        loss_mat = 0.5 * err
        clipped_active = torch.zeros_like(m)
    else:
        v_clip = old + (v - old).clamp(-clip, clip)
        err_clip = (v_clip - ret) ** 2
        loss_mat = 0.5 * torch.maximum(err, err_clip)
        clipped_active = m & (err_clip.detach() > err.detach())
    loss = agg_loss(
        loss_mat, m, agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs, norm_const=norm_const
    )
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        stats = {
            "vf_clipfrac": clipped_active.sum() / n,
            "value_mean": v.detach().sum() / n,
            "value_error": _masked_zero(err.detach(), m).sum() / n,
        }
    return loss, stats
