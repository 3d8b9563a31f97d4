"""Memory-lean per-token log-probabilities and entropies from logits (a chunked kernel).

Pure tensor functions whose outputs feed the losses of :mod:`mathrl.algo.losses`:

* :func:`logprobs_from_logits`: ``log softmax(logits / temperature)[ids]`` per token;
* :func:`entropy_from_logits`: the entropy of ``softmax(logits / temperature)`` per token;
* :func:`logprobs_and_entropy_from_logits`: both in one pass (one gradient buffer).

Shapes: ``T`` tokens, ``V`` vocabulary; ``logits`` is ``[T, V]`` or ``[N, T, V]`` in any float
dtype, and ``mask`` a 0/1 float or bool tensor of ``logits``' shape without ``V``. Rows are
processed in chunks (default: 64 MiB of float32 each) and the backward pass rebuilds the softmax
chunk by chunk (:class:`_TokenLogitStats`), so no second full ``[..., V]`` tensor is made.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "entropy_from_logits",
    "logprobs_and_entropy_from_logits",
    "logprobs_from_logits",
]


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
        lo, hi = torch.stack([ids.min(), ids.max()]).tolist()  # one host sync, not two
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
    :func:`mathrl.algo.losses.agg_loss`.
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
