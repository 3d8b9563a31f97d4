"""Policy and value losses, their aggregation modes, and memory-lean logit reductions.

Everything here is a pure tensor function (no model, engine or config object, no
distributed call inside a loss). Shapes: ``N`` responses, ``T`` response tokens,
``V`` vocabulary; ``mask`` is a 0/1 float or bool ``[N, T]`` tensor of real tokens.

Aggregation and the global normaliser
-------------------------------------
A loss is first a per-token matrix ``l[i, t]``; :func:`agg_loss` reduces it with one of
``LOSS_AGG_MODES``:

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

__all__ = [
    "LOSS_AGG_MODES",
    "Normalizers",
    "agg_loss",
    "entropy_from_logits",
    "global_normalizers",
    "logprobs_and_entropy_from_logits",
    "logprobs_from_logits",
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


def _agg_token_mean(lm, m, norm_tokens, norm_seqs, norm_const):
    denom = norm_tokens if norm_tokens is not None else m.sum().clamp(min=1)
    return lm.sum() / denom


def _agg_seq_mean_token_mean(lm, m, norm_tokens, norm_seqs, norm_const):
    per_seq = lm.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)
    return per_seq.sum() / _seq_count(m, norm_seqs)


def _agg_seq_mean_token_sum(lm, m, norm_tokens, norm_seqs, norm_const):
    return lm.sum() / _seq_count(m, norm_seqs)


def _agg_seq_mean_token_sum_norm(lm, m, norm_tokens, norm_seqs, norm_const):
    if norm_const is None:
        raise ValueError(
            "agg='seq-mean-token-sum-norm' needs norm_const (Dr. GRPO's constant, e.g. the "
            "maximum response length); it must not depend on the micro-batch"
        )
    return lm.sum() / norm_const / _seq_count(m, norm_seqs)


LOSS_AGG_MODES: dict[str, Callable[..., Tensor]] = {
    "token-mean": _agg_token_mean,
    "seq-mean-token-mean": _agg_seq_mean_token_mean,
    "seq-mean-token-sum": _agg_seq_mean_token_sum,
    "seq-mean-token-sum-norm": _agg_seq_mean_token_sum_norm,
}
"""Aggregation mode name -> reducer; see the module docstring for the formulas."""


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
    try:
        fn = LOSS_AGG_MODES[agg]
    except KeyError:
        raise ValueError(
            f"unknown loss aggregation mode {agg!r}; allowed: {', '.join(LOSS_AGG_MODES)}"
        ) from None
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


def global_normalizers(
    masks: Tensor | Sequence[Tensor], *, group: object | None = None,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Normalizers:
    """Count valid tokens and non-empty responses over all micro-batches of a step.

    ``masks`` are the ``[n_k, T_k]`` masks of this process's micro-batches (or one
    mask). When ``torch.distributed`` is initialised the two counts are all-reduced
    (sum) over ``group`` (default: the world), so every rank gets the same global
    numbers. The reduction runs on the first mask's device (CPU tensors for gloo,
    CUDA tensors for NCCL); ``reduce`` (a sum over ranks returning the summed tensor) replaces that
    reduction: the trainer passes :func:`mathrl.train.engines.all_reduce`, which moves the counts to
    the engine's device. Call it once per optimizer step, before the micro-batch
    loop, and pass the result to every loss of the step::

        n = global_normalizers([mb.mask for mb in micro_batches])
        loss, stats = policy_loss(..., agg="token-mean", norm_tokens=n.tokens, norm_seqs=n.seqs)
    """
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
    else:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    tokens, seqs = counts.tolist()
    return Normalizers(tokens=max(tokens, 1.0), seqs=max(seqs, 1.0))


# --------------------------------------------------------------------------- losses


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
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with asymmetric and dual clip.

    Per valid token, with ``rho = exp(logp - old_logp)`` and advantage ``A``::

        l     = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
        l     = min(l, -A * c)      if dual_clip = c (c > 1) and A < 0

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
    if not (logp.shape == old_logp.shape == advantages.shape):
        raise ValueError(
            "logp, old_logp and advantages must have the same [N, T] shape, got "
            f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")
    m = _bool_mask(mask, logp, "logp")
    old = old_logp.detach()
    adv = _masked_zero(advantages.detach(), m)
    log_ratio = _masked_zero(logp - old, m).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    with torch.no_grad():
        r = ratio.detach()
        n = m.sum().clamp(min=1)
        high = m & (adv > 0) & (r > 1.0 + clip_high)
        low = m & (adv < 0) & (r < 1.0 - clip_low)
        dual = torch.zeros_like(m)
    if dual_clip is not None:
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, -adv * dual_clip), loss_mat)
        with torch.no_grad():
            dual = m & (adv < 0) & (r > dual_clip)
    loss = agg_loss(
        loss_mat, m, agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs, norm_const=norm_const
    )
    with torch.no_grad():
        lr = log_ratio.detach()
        any_valid = m.any()
        inf = torch.tensor(float("inf"), dtype=r.dtype, device=r.device)
        one = torch.ones((), dtype=r.dtype, device=r.device)
        stats = {
            "clipfrac_low": low.sum() / n,
            "clipfrac_high": high.sum() / n,
            "clipfrac": (low | high).sum() / n,
            "dual_clipfrac": dual.sum() / n,
            "approx_kl": _masked_zero(r - 1.0 - lr, m).sum() / n,
            "ratio_min": torch.where(any_valid, torch.where(m, r, inf).min(), one),
            "ratio_max": torch.where(any_valid, torch.where(m, r, -inf).max(), one),
            "ratio_mean": _masked_zero(r, m).sum() / n,
        }
    return loss, stats


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


# --------------------------------------------------------------------------- logits -> per-token


_CHUNK_BYTES = 64 * 2**20  # rows per chunk chosen so one float32 chunk is <= 64 MiB


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as_3d(logits: Tensor) -> Tensor:
    """View logits as [B, T, V] without copying where possible.

    A contiguous tensor becomes one long [1, rows, V] view (few, large chunks); a strided
    slice such as ``out.logits[:, P-1:-1]`` keeps its batch dimension so that no copy is
    made and chunks never straddle two sequences.
    """
    if logits.is_contiguous():
        return logits.view(1, -1, logits.shape[-1])
    if logits.dim() == 2:
        return logits.unsqueeze(0)
    if logits.dim() == 3:
        return logits
    return logits.reshape(-1, logits.shape[-2], logits.shape[-1])


def _row_slices(shape3d: torch.Size, rows: int):
    """Yield index tuples selecting [r, V] row chunks of a [B, T, V] tensor."""
    b, t, _ = shape3d
    for i in range(b):
        for s in range(0, t, rows):
            yield (i, slice(s, min(s + rows, t)))


def _rows_per_chunk(v: int, chunk_size: int | None, elem: int) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return chunk_size
    return max(1, _CHUNK_BYTES // (elem * v))


def _load_chunk(x: Tensor, cdtype: torch.dtype, temperature: float) -> Tensor:
    """Chunk in the compute dtype, divided by the temperature (a view when possible)."""
    x = x.to(cdtype)
    if temperature != 1.0:
        x = x / temperature
    return x


class _TokenLogitStats(torch.autograd.Function):
    """Per-token log-prob of ``ids`` and/or entropy of ``softmax(x)``, ``x = logits / temp``.

    Forward, one row chunk at a time: ``log p = log_softmax(x)`` (a chunk-sized
    temporary), ``logp_id = log p[id]``, ``H = -sum_j p_j log p_j``; it keeps only the
    ``[B, T]`` log-normaliser ``lse`` (and ``H``), plus a reference to ``logits``.
    Backward rebuilds ``log p = x - lse`` chunk by chunk, straight into the gradient
    buffer, using

        d logp_id / dx_j = onehot_j - p_j          dH / dx_j = -p_j (log p_j + H)

    (divided by the temperature for the gradient with respect to ``logits``).
    """

    @staticmethod
    def forward(ctx, logits, ids, valid, temperature, rows, want_logp, want_ent):  # type: ignore[override]
        b, t, _ = logits.shape
        cdtype = _compute_dtype(logits.dtype)
        dev = logits.device
        lse_all = torch.empty(b, t, dtype=cdtype, device=dev)
        out_lp = torch.empty(b, t, dtype=cdtype, device=dev) if want_logp else None
        out_ent = torch.empty(b, t, dtype=cdtype, device=dev) if want_ent else None
        for idx in _row_slices(logits.shape, rows):
            x = _load_chunk(logits[idx], cdtype, temperature)
            logp = torch.log_softmax(x, dim=-1)  # one fused pass; lives only for this chunk
            if want_logp:
                col = ids[idx].unsqueeze(-1)
                lp = logp.gather(-1, col).squeeze(-1)
                out_lp[idx] = lp
                lse_all[idx] = x.gather(-1, col).squeeze(-1) - lp
            else:  # finite even if some logits are -inf
                lse_all[idx] = x.amax(dim=-1) - logp.amax(dim=-1)
            if want_ent:
                # -sum p log p: a sum of non-negative terms, so no cancellation for peaked
                # rows (lse - sum p x would lose digits when H << lse).
                out_ent[idx] = -torch.exp(logp).mul_(logp).sum(dim=-1)
            del logp, x
        zero = torch.zeros((), dtype=cdtype, device=dev)
        if valid is not None:
            out_lp = torch.where(valid, out_lp, zero) if want_logp else None
            out_ent = torch.where(valid, out_ent, zero) if want_ent else None
        ctx.save_for_backward(logits, ids, lse_all, out_ent, valid)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.set_materialize_grads(False)
        empty = torch.empty(0, dtype=cdtype, device=dev)
        return (out_lp if want_logp else empty), (out_ent if want_ent else empty)

    @staticmethod
    def backward(ctx, g_lp, g_ent):  # type: ignore[override]
        logits, ids, lse_all, ent, valid = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        if g_lp is not None and g_lp.numel() == 0:
            g_lp = None
        if g_ent is not None and g_ent.numel() == 0:
            g_ent = None
        none = (None,) * 6
        if g_lp is None and g_ent is None:
            return (None,) + none
        cdtype = lse_all.dtype
        scale = 1.0 / temperature
        if g_lp is not None:
            g_lp = g_lp.to(cdtype) * scale
        if g_ent is not None:
            g_ent = g_ent.to(cdtype) * scale
        grad = torch.empty_like(logits)
        for idx in _row_slices(logits.shape, rows):
            x = logits[idx]
            gbuf = grad[idx]
            work = gbuf if gbuf.dtype == cdtype else torch.empty(x.shape, dtype=cdtype, device=x.device)
            if temperature != 1.0:
                torch.div(x.to(cdtype), temperature, out=work)
                work.sub_(lse_all[idx].unsqueeze(-1))
            else:
                torch.sub(x.to(cdtype), lse_all[idx].unsqueeze(-1), out=work)  # log p
            if g_ent is None:  # logprobs only: -g p, no extra temporary
                work.exp_().mul_(-g_lp[idx].unsqueeze(-1))
            else:  # p * (-g_H (log p + H) - g_lp)
                p = work.exp()
                work.add_(ent[idx].unsqueeze(-1)).mul_(-g_ent[idx].unsqueeze(-1))
                if g_lp is not None:
                    work.sub_(g_lp[idx].unsqueeze(-1))
                work.mul_(p)
                del p
            if g_lp is not None:
                work.scatter_add_(-1, ids[idx].unsqueeze(-1), g_lp[idx].unsqueeze(-1))  # + g onehot
            if valid is not None:
                work.masked_fill_(~valid[idx].unsqueeze(-1), 0)
            if work is not gbuf:
                gbuf.copy_(work)
        return (grad,) + none


def _prepare_ids(ids: Tensor, logits: Tensor, valid: Tensor | None) -> Tensor:
    if logits.dim() < 2 or ids.shape != logits.shape[:-1]:
        raise ValueError(
            f"ids shape {tuple(ids.shape)} must equal logits shape {tuple(logits.shape)} "
            "without the last (vocabulary) dimension"
        )
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    ids = ids.long()
    if valid is not None:
        ids = torch.where(valid, ids, torch.zeros_like(ids))  # padding ids may be anything
    v = logits.shape[-1]
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= v:
            raise ValueError(
                f"token ids must be in [0, {v}) (vocabulary size), found {lo if lo < 0 else hi}"
            )
    return ids


def _prepare_mask(mask: Tensor | None, logits: Tensor) -> Tensor | None:
    if mask is None:
        return None
    if logits.dim() < 2 or mask.shape != logits.shape[:-1]:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal logits shape {tuple(logits.shape)} "
            "without the last (vocabulary) dimension"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def _token_stats(logits, ids, valid, temperature, chunk_size, want_logp, want_ent):
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    cdtype = _compute_dtype(logits.dtype)
    rows = _rows_per_chunk(logits.shape[-1], chunk_size, torch.finfo(cdtype).bits // 8)
    l3 = _as_3d(logits)
    shape = logits.shape[:-1]
    ids3 = ids.reshape(l3.shape[:-1]) if ids is not None else None
    valid3 = valid.reshape(l3.shape[:-1]) if valid is not None else None
    lp, ent = _TokenLogitStats.apply(l3, ids3, valid3, float(temperature), rows, want_logp, want_ent)
    return (lp.reshape(shape) if want_logp else None), (ent.reshape(shape) if want_ent else None)


def logprobs_from_logits(
    logits: Tensor,
    ids: Tensor,
    *,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """Log-probability of ``ids`` under ``softmax(logits / temperature)``, memory-lean.

    ``logp[..., t] = x[..., t, ids[..., t]] - logsumexp_j x[..., t, j]``, ``x = logits / temperature``.

    Same values as ``log_softmax(logits.float() / temperature, -1).gather(-1, ids)``
    but never materialises a full ``[..., V]`` float32 copy: rows are processed in chunks
    of ``chunk_size`` rows (default: as many as fit in 64 MiB of float32). Differentiable
    (the trainer backpropagates through it) via a custom autograd function that keeps
    only the ``[..., T]`` log-normaliser and rebuilds the softmax chunk by chunk in the
    backward pass, writing straight into the gradient buffer. ``logits``: ``[T, V]`` or
    ``[N, T, V]`` in any float dtype (the model's output; slices such as
    ``out.logits[:, P-1:-1]`` are used without copying). Returns float32 (float64 for
    float64 logits) of ``ids``' shape. With ``mask``, padding positions return 0 and
    pass no gradient (not even NaN from garbage logits there), and their ids may be
    anything (e.g. -100).
    """
    valid = _prepare_mask(mask, logits)
    ids = _prepare_ids(ids, logits, valid)
    return _token_stats(logits, ids, valid, temperature, chunk_size, True, False)[0]


def entropy_from_logits(
    logits: Tensor,
    mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """Per-token entropy of ``softmax(logits / temperature)``, memory-lean; 0 at padding.

    ``H[..., t] = -sum_j p_j log p_j`` with ``log p = x - logsumexp_j x_j``,
    ``x = logits[..., t, :] / temperature``. Rows are processed in chunks (default: 64 MiB
    of float32 each), so no second full ``[..., V]`` tensor is created in the forward
    pass; differentiable (for an entropy bonus) through a custom autograd function whose
    backward, ``dH/dx_j = -p_j (log p_j + H)``, is also computed chunk by chunk. Returns
    ``mask``'s shape in float32 (float64 for float64 logits); reduce it with
    :func:`agg_loss`.
    """
    valid = _prepare_mask(mask, logits)
    return _token_stats(logits, None, valid, temperature, chunk_size, False, True)[1]


def logprobs_and_entropy_from_logits(
    logits: Tensor,
    ids: Tensor,
    mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Both :func:`logprobs_from_logits` and :func:`entropy_from_logits` in one pass.

    For a loss with an entropy bonus: one chunked sweep over the logits forward and one
    backward that writes a single ``[..., V]`` gradient (the two separate functions would
    each produce a full gradient for autograd to add). Returns ``(logp, entropy)``, both 0
    at padding.
    """
    valid = _prepare_mask(mask, logits)
    if valid is None:
        raise ValueError("mask is required")
    ids = _prepare_ids(ids, logits, valid)
    lp, ent = _token_stats(logits, ids, valid, temperature, chunk_size, True, True)
    return lp, ent
