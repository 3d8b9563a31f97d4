"""Direct Preference Optimization (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model
is Secretly a Reward Model") on verifier-graded samples: pure functions, no engine inside.

DeepSeekMath (Shao et al. 2024, sec. 5.2.1) builds DPO's pairs from the policy's own samples: for a problem, a
response the verifier grades correct is preferred to one it grades wrong. :func:`dpo_pairs` forms those pairs
from a graded batch, :func:`sequence_logprobs` sums a response's token logprobs, and :func:`dpo_loss` is the
loss over pairs::

    h_i = beta * [(log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x))]
    L   = -(1/P) sum_i [(1 - eps) log sigmoid(h_i) + eps log sigmoid(-h_i)]

with ``P`` the number of pairs of the whole optimizer step (all micro-batches, all ranks: ``norm_pairs``) and
``eps`` the label smoothing of conservative DPO (0 = the paper's loss). ``beta * (log pi - log pi_ref)`` is the
implicit reward of a response; its margin ``h_i / beta * beta`` between the chosen and the rejected response is
what DPO raises.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["dpo_pairs", "sequence_logprobs", "dpo_loss"]


def dpo_pairs(group_index: Sequence[int], correct: Sequence[bool], *, per_group: int = 1) -> list[tuple[int, int]]:
    """Preference pairs ``(chosen row, rejected row)`` of a graded batch: within each group (problem), the
    k-th correct response is paired with the k-th wrong one, for k < min(#correct, #wrong, ``per_group``).
    A group whose responses are all right or all wrong gives no pair. Rows keep their order, so the result is
    deterministic; groups appear in the order of their first row.

    Example: groups ``[0, 0, 0, 1, 1]``, correct ``[F, T, F, T, T]`` -> ``[(1, 0)]`` (group 1 has no wrong
    response); with ``per_group=2`` the same (group 0 has one correct response)."""
    if len(group_index) != len(correct):
        raise ValueError(f"dpo_pairs: {len(group_index)} group indices and {len(correct)} verdicts differ in length")
    if isinstance(per_group, bool) or int(per_group) < 1:
        raise ValueError(f"dpo_pairs: per_group={per_group!r} must be >= 1")
    right: dict[int, list[int]] = {}
    wrong: dict[int, list[int]] = {}
    order: list[int] = []
    for r, (g, c) in enumerate(zip(group_index, correct)):
        g = int(g)
        if g not in right:
            right[g], wrong[g] = [], []
            order.append(g)
        (right if c else wrong)[g].append(r)
    pairs = []
    for g in order:
        pairs += list(zip(right[g], wrong[g]))[: int(per_group)]
    return pairs


def sequence_logprobs(logp: Tensor, mask: Tensor) -> Tensor:
    """``[N]``: the sum of each response's token logprobs over its valid tokens (``mask``, ``[N, T]``); padding
    values, even -inf, never count."""
    if logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} differ in shape")
    m = mask if mask.dtype == torch.bool else mask != 0
    return torch.where(m, logp, torch.zeros((), dtype=logp.dtype, device=logp.device)).sum(-1)


def dpo_loss(chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, *, beta: float = 0.1,
             label_smoothing: float = 0.0, norm_pairs: float | Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """The DPO loss of ``P`` pairs (each argument ``[P]``: sequence logprobs of the chosen and the rejected
    response under the policy and under the reference; the reference's are treated as constants).

    Summed over the pairs and divided by ``norm_pairs`` (default ``P``: correct for one micro-batch; pass the
    optimizer step's global pair count when the step has several). ``stats`` (detached, means over these
    pairs): ``reward_chosen`` and ``reward_rejected`` (the implicit rewards beta * (log pi - log pi_ref)),
    ``margin`` (their difference), ``accuracy`` (the fraction of pairs whose margin is > 0)."""
    if not (chosen.shape == rejected.shape == ref_chosen.shape == ref_rejected.shape) or chosen.dim() != 1:
        raise ValueError("dpo_loss: chosen, rejected, ref_chosen and ref_rejected must be [P] tensors of one shape, "
                         f"got {[tuple(x.shape) for x in (chosen, rejected, ref_chosen, ref_rejected)]}")
    if not beta > 0:
        raise ValueError(f"dpo_loss: beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo_loss: label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if norm_pairs is not None and not float(norm_pairs) > 0:
        raise ValueError(f"dpo_loss: norm_pairs must be > 0, got {float(norm_pairs)}")
    r_w = beta * (chosen - ref_chosen.detach())
    r_l = beta * (rejected - ref_rejected.detach())
    h = r_w - r_l
    per_pair = -(1.0 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    n = chosen.numel() if norm_pairs is None else norm_pairs
    loss = per_pair.sum() / n
    with torch.no_grad():
        count = max(chosen.numel(), 1)
        stats = {"reward_chosen": r_w.detach().sum() / count, "reward_rejected": r_l.detach().sum() / count,
                 "margin": h.detach().sum() / count, "accuracy": (h.detach() > 0).to(h.dtype).sum() / count}
    return loss, stats
