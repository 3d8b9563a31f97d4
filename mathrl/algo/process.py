"""Process supervision (DeepSeekMath sec. 4.1.3; Math-Shepherd, Wang et al. 2023): pure functions, no engine.

* :func:`segment_steps` -- the steps of a response, by one documented rule (below);
* :func:`step_end_tokens` -- the response token at which each step ends, from the lengths of the decoded
  prefixes (so a step boundary inside a multi-byte token lands on that token);
* :func:`step_labels` -- Math-Shepherd's automatic labels of a step from the verdicts of K completions sampled
  from its prefix: hard (1 if any completion is correct) and soft (the fraction correct);
* :func:`prm_loss` -- the process reward model's loss: binary cross-entropy of its logit at each step's end
  against the step's (hard or soft) label; :func:`roc_auc` scores it on held-out steps;
* :func:`process_advantages` -- GRPO with process supervision: every step reward of a group normalised by the
  mean and std of all step rewards of the group, and each token's advantage the sum of the normalised rewards
  of the steps that end at or after it.

The step rule: a step ends at a line break. A response is split after every ``\\n``; blank lines and the
whitespace that follows a line break stay with the step before them (so no step is only whitespace), and the
text after the last line break is the last step (a response without a line break is one step). The spans
cover the whole text, in order, without overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["StepRewards", "segment_steps", "step_end_tokens", "step_labels", "process_advantages", "prm_loss",
           "constant_loss", "roc_auc"]


@dataclass(frozen=True)
class StepRewards:
    """The process rewards of a batch of responses, ``[N, S]`` each: ``rewards[i, j]`` of step j of response i,
    ``ends[i, j]`` the response token through which that step's reward is credited, ``mask`` the real steps."""

    rewards: Tensor
    ends: Tensor
    mask: Tensor


def segment_steps(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` (end exclusive) of the steps of ``text`` by the module's rule.

    Example: ``"a = 1\\n\\nb = 2\\n so 3"`` -> ``[(0, 7), (7, 14), (14, 18)]``: ``"a = 1\\n\\n"``,
    ``"b = 2\\n "``, ``"so 3"``. An empty text has no step."""
    spans: list[tuple[int, int]] = []
    start, i, n = 0, 0, len(text)
    while i < n:
        if text[i] != "\n":
            i += 1
            continue
        j = i + 1
        while j < n and text[j].isspace():  # blank lines and indentation stay with this step
            j += 1
        if text[start:i].strip():
            spans.append((start, j))
            start = j
        elif spans:  # a step of whitespace only joins the step before it
            spans[-1] = (spans[-1][0], j)
            start = j
        # else: leading whitespace, part of the first step
        i = j
    if start < n:
        if text[start:].strip() or not spans:
            spans.append((start, n))
        else:
            spans[-1] = (spans[-1][0], n)
    return spans


def step_end_tokens(prefix_lengths: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[int]:
    """The token index at which each step ends: for span end ``c``, the first token ``t`` whose decoded prefix
    (``prefix_lengths[t]`` = the length of the text of tokens ``0..t``, non-decreasing in ``t``) reaches ``c``.
    Steps that end inside the same token share it; a span past the decoded text ends at the last token.

    Found by bisection, so ``prefix_lengths`` is read at O(steps x log tokens) indices: it may be a lazy
    sequence that decodes a prefix only when indexed (:func:`mathrl.train.process.response_steps`)."""
    n = len(prefix_lengths)
    ends, lo = [], 0
    for _, c in spans if n else ():
        hi = n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix_lengths[mid] >= c:
                hi = mid
            else:
                lo = mid + 1
        ends.append(lo)
    return ends


def step_labels(verdicts: Sequence[Sequence[bool]]) -> tuple[list[float], list[float]]:
    """Math-Shepherd's labels of each step from the verdicts of its K completions (``verdicts[j]``: the
    completions sampled from step j's prefix, graded): hard = 1.0 if any is correct, soft = the fraction
    correct. A step without completions is refused (it has no label)."""
    hard, soft = [], []
    for j, v in enumerate(verdicts):
        if len(v) == 0:
            raise ValueError(f"step_labels: step {j} has no completions to label it")
        hard.append(1.0 if any(v) else 0.0)
        soft.append(sum(map(bool, v)) / len(v))
    return hard, soft


def process_advantages(step_rewards: Tensor, step_ends: Tensor, step_mask: Tensor, group_index: Tensor,
                       mask: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO's advantages under process supervision (DeepSeekMath eq. in sec. 4.1.3)::

        r~_ij   = (r_ij - mean(R_g)) / (std(R_g) + eps)      R_g = every step reward of response i's group
        A_{i,t} = sum_{j : end(i, j) >= t} r~_ij

    ``step_rewards``, ``step_ends`` (token index of each step's end) and ``step_mask`` (real steps) are
    ``[N, S]``; ``group_index`` ``[N]``; ``mask`` ``[N, T]`` the response tokens. The std is unbiased, as in
    :func:`mathrl.algo.advantages.grpo`; a group whose step rewards are all equal (or that has one step)
    gets 0. Returns ``[N, T]``, 0 at padding."""
    if step_rewards.shape != step_ends.shape or step_rewards.shape != step_mask.shape or step_rewards.dim() != 2:
        raise ValueError(f"step_rewards, step_ends and step_mask must be [N, S] of one shape, got "
                         f"{tuple(step_rewards.shape)}, {tuple(step_ends.shape)}, {tuple(step_mask.shape)}")
    if mask.dim() != 2 or mask.shape[0] != step_rewards.shape[0] or group_index.shape != (step_rewards.shape[0],):
        raise ValueError(f"mask must be [N, T] and group_index [N] with N = {step_rewards.shape[0]}")
    sm = step_mask.bool()
    m = mask.bool()
    T = m.shape[1]
    ends = step_ends.long()
    if bool(((ends < 0) | (ends >= T))[sm].any()):
        raise ValueError(f"a step ends outside the response tokens (0..{T - 1})")
    dtype = step_rewards.dtype if step_rewards.dtype.is_floating_point else torch.float32
    r = step_rewards.to(dtype)
    _, g = torch.unique(group_index, return_inverse=True)
    n_groups = int(g.max()) + 1 if g.numel() else 0
    rows = g[:, None].expand_as(r)[sm]
    vals = r[sm]
    zeros = torch.zeros(n_groups, dtype=dtype, device=r.device)
    count = zeros.index_add(0, rows, torch.ones_like(vals))
    mean = zeros.index_add(0, rows, vals) / count.clamp(min=1)
    dev2 = zeros.index_add(0, rows, (vals - mean[rows]) ** 2)
    std = torch.where(count > 1, dev2 / (count - 1).clamp(min=1), zeros).sqrt()
    hi = torch.full((n_groups,), -torch.inf, dtype=dtype, device=r.device).scatter_reduce(0, rows, vals, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=dtype, device=r.device).scatter_reduce(0, rows, vals, "amin")
    informative = (count > 1) & (hi > lo)
    norm = torch.where(sm, (r - mean[g][:, None]) / (std[g][:, None] + eps), torch.zeros((), dtype=dtype))
    norm = torch.where(informative[g][:, None], norm, torch.zeros((), dtype=dtype))
    at_end = torch.zeros(m.shape, dtype=dtype, device=r.device).scatter_add(1, ends.clamp(0, T - 1), norm)
    adv = at_end.flip(1).cumsum(1).flip(1)  # the sum over the steps that end at or after t
    return torch.where(m, adv, torch.zeros((), dtype=dtype))


def prm_loss(logits: Tensor, labels: Tensor, step_mask: Tensor, *, norm_steps: float | Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """Binary cross-entropy of a PRM's logits at the steps' ends (``[N, S]``) against their labels (hard 0/1 or
    soft fractions, ``[N, S]``) over the real steps (``step_mask``)::

        L = -(1 / n) sum_{steps} [y log sigmoid(z) + (1 - y) log sigmoid(-z)]

    ``n`` = ``norm_steps`` (the optimizer step's global step count) or this call's own. ``stats`` (detached,
    over these steps): ``accuracy`` (sigmoid(z) > 0.5 agrees with y > 0.5) and ``prob_mean``."""
    if not (logits.shape == labels.shape == step_mask.shape):
        raise ValueError(f"logits {tuple(logits.shape)}, labels {tuple(labels.shape)} and step_mask "
                         f"{tuple(step_mask.shape)} must have one shape")
    sm = step_mask.bool()
    y = labels.to(logits.dtype)
    if bool(((y < 0) | (y > 1))[sm].any()):
        raise ValueError("prm_loss: labels must lie in [0, 1]")
    per = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.where(sm, y, torch.zeros_like(y)),
                                                               reduction="none")
    n = sm.sum().clamp(min=1) if norm_steps is None else norm_steps
    loss = torch.where(sm, per, torch.zeros_like(per)).sum() / n
    with torch.no_grad():
        count = sm.sum().clamp(min=1)
        agree = ((logits.detach() > 0) == (y > 0.5)) & sm
        stats = {"accuracy": agree.sum() / count,
                 "prob_mean": torch.where(sm, torch.sigmoid(logits.detach()), torch.zeros_like(per)).sum() / count}
    return loss, stats


def constant_loss(labels: Sequence[float]) -> float:
    """The binary cross-entropy of the best constant prediction, the labels' mean ``m``, at every step::

        L_0 = -(1 / n) sum_i [y_i log m + (1 - y_i) log (1 - m)]

    (the entropy of ``m``; 0 when every label is 0 or every label is 1). A PRM whose :func:`prm_loss` on its own
    training steps is not below ``L_0`` has not learned anything about the steps beyond how often they are
    right. NaN without labels."""
    ys = [float(y) for y in labels]
    if not ys:
        return float("nan")
    m = sum(ys) / len(ys)
    if m <= 0.0 or m >= 1.0:
        return 0.0
    return -(sum(y * math.log(m) + (1.0 - y) * math.log(1.0 - m) for y in ys) / len(ys))


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The area under the ROC curve of ``scores`` for the binary ``labels``: the probability that a positive
    scores above a negative, ties counting one half (Mann-Whitney U / (n_pos n_neg)). NaN without both classes."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    order = sorted(scores)
    ranks: dict[float, float] = {}
    i = 0
    while i < len(order):  # average rank (1-based) of each distinct score
        j = i
        while j < len(order) and order[j] == order[i]:
            j += 1
        ranks[order[i]] = (i + 1 + j) / 2
        i = j
    u = sum(ranks[s] for s in pos) - len(pos) * (len(pos) + 1) / 2
    return u / (len(pos) * len(neg))
