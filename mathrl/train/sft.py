"""Supervised fine-tuning on sampled responses: the SFT loss, the RFT data filter, one SFT step.

Rejection-sampling fine-tuning (RFT; Yuan et al. 2023, "Scaling Relationship on
Learning Mathematical Reasoning with Large Language Models"; the offline and
online variants compared in DeepSeekMath, Shao et al. 2024, section 5.2.1)
samples responses, keeps the correct ones and maximises their likelihood:

    L_SFT = - (1 / N_tok) * sum_{i in kept} sum_t m_{i,t} * log pi(o_{i,t} | q_i, o_{i,<t})

Only response tokens are scored: the prompt ``q_i`` is context, never a target
(a layout's :meth:`~mathrl.train.layouts.Layout.policy_forward` returns logprobs of response tokens
only, and the response mask removes padding). ``N_tok`` is the number of
response tokens in the *whole* optimizer step (all micro-batches, all ranks;
:func:`mathrl.algo.losses.global_normalizers`), so splitting the step into
micro-batches does not change the gradient.

In the RL gradient view of DeepSeekMath (eq. 5) this is the policy gradient with
gradient coefficient 1 on correct responses and 0 on wrong ones.

:func:`sft_loss` (defined in :mod:`mathrl.algo.objectives`) and :func:`rft_filter` are pure functions;
:func:`sft_train_step` runs them on the trainer's DeepSpeed engine with the
trainer's token-budgeted micro-batches.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import Tensor

from mathrl.algo.losses import global_normalizers
from mathrl.algo.objectives import sft_loss
from mathrl.dist.collectives import global_sum, sum_over_ranks
from mathrl.train.rows import ForwardBatch
from mathrl.train.layouts import Layout, Padded
from mathrl.train.update import MicroLoss, accumulate_and_step, step_grad_norm

__all__ = ["sft_loss", "rft_filter", "sft_train_step"]


def rft_filter(group_index: Sequence[int], responses: Sequence[str], correct: Sequence[bool], *,
               dedup: bool = True, max_per_problem: int | None = None) -> list[int]:
    """Rows of a graded batch that RFT trains on.

    Keeps row ``r`` when ``correct[r]``; with ``dedup`` a response whose text (leading/trailing
    whitespace stripped) equals an already kept response *of the same problem* is dropped (RFT
    rewards distinct reasoning paths; Yuan et al. 2023, section 3.3); with ``max_per_problem = c``
    at most the first ``c`` kept rows of each problem stay. Order is preserved, so the result is
    deterministic. ``group_index[r]`` names the problem of row ``r`` (e.g. ``RolloutBatch.group_index``).

    Example: groups ``[0, 0, 0, 1, 1]``, responses ``["a", "a ", "b", "c", "d"]``, correct
    ``[T, T, T, F, T]`` -> ``[0, 2, 4]`` (row 1 duplicates row 0; row 3 is wrong); with
    ``max_per_problem=1`` -> ``[0, 4]``.
    """
    n = len(responses)
    if len(group_index) != n or len(correct) != n:
        raise ValueError(f"rft_filter: {len(group_index)} group indices, {n} responses and {len(correct)} "
                         "verdicts must have the same length")
    if max_per_problem is not None and (isinstance(max_per_problem, bool) or int(max_per_problem) < 1):
        raise ValueError(f"rft_filter: max_per_problem={max_per_problem!r} must be >= 1 or None")
    kept: list[int] = []
    seen: dict[int, set[str]] = {}
    count: dict[int, int] = {}
    for r in range(n):
        if not correct[r]:
            continue
        g = int(group_index[r])
        if max_per_problem is not None and count.get(g, 0) >= max_per_problem:
            continue
        if dedup:
            key = responses[r].strip()
            if key in seen.setdefault(g, set()):
                continue
            seen[g].add(key)
        count[g] = count.get(g, 0) + 1
        kept.append(r)
    return kept


def sft_train_step(engine, tokens: ForwardBatch, rows: Sequence[int] | Tensor, *, token_budget: int,
                   device: torch.device | str = "cpu", world_size: int = 1, agg: str = "token-mean",
                   layout: Layout | None = None) -> dict[str, float | str]:
    """One optimizer step of SFT on ``rows`` of ``tokens`` (left-padded prompts, right-padded responses).

    ``layout`` (default: :class:`~mathrl.train.layouts.Padded`, one row per prompt) plans the token-budgeted
    micro-batches and scores each (response tokens only); its
    :func:`sft_loss` carries the step's global token normaliser; the micro-batch loop, the world-size
    scaling, the NaN/inf agreement and the optimizer step are the RL update's
    (:func:`mathrl.train.update.accumulate_and_step`).

    A rank with no rows runs the agreed number of backwards with every token masked (zero gradient), so
    that the collective gradient reduction of the other ranks does not wait for it; when no rank has a row,
    no backward and no optimizer step happen (``stepped = 0``). A NaN/inf loss or gradient norm skips
    the step (``bad_step = 1``).
    """
    layout = layout or Padded()
    rows_t = torch.as_tensor(list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long)
    mask = tokens.response_mask
    global_rows = sum_over_ranks([rows_t.numel()])[0]
    if global_rows == 0:
        return {"sft/loss": float("nan"), "sft/tokens": 0.0, "sft/rows": 0.0, "sft/micro_batches": 0.0,
                "stepped": 0.0, "bad_step": 0.0}
    dummy = rows_t.numel() == 0
    if dummy:  # take part in the gradient reduction with a fully masked row
        rows_t = torch.zeros(1, dtype=torch.long)
        mask = torch.zeros_like(mask)
        tokens = dataclasses.replace(tokens, response_mask=mask)
    plan = layout.plan(tokens, token_budget, rows_t)
    norms = global_normalizers([mask[r] for r in plan], reduce=global_sum)
    losses: list[Tensor] = []

    def micro_loss(rows_mb: Tensor, real: bool, check: bool) -> MicroLoss:
        mb = layout.micro_batch(tokens, rows_mb, device)
        logp, _ = layout.policy_forward(engine, mb, temperature=1.0)
        loss = sft_loss(logp, mb.response_mask, norm_tokens=norms.tokens, agg=agg, norm_seqs=norms.seqs)
        if real:
            losses.append(loss.detach())
        return MicroLoss(loss, {"SFT loss": loss}, loss_key="SFT loss")

    problem = accumulate_and_step(engine, layout.agreed(plan), micro_loss, world_size=world_size, what="SFT")
    grad_norm = step_grad_norm(engine, problem)
    # the micro losses of all ranks sum to the step's mean NLL
    loss_global = sum_over_ranks([float(torch.stack(losses).sum()) if losses else 0.0])[0]
    out = {"sft/loss": loss_global, "sft/tokens": float(norms.tokens), "sft/rows": global_rows,
           "sft/micro_batches": float(len(plan)), "sft/grad_norm": grad_norm,
           "stepped": 1.0 if problem is None else 0.0, "bad_step": 0.0 if problem is None else 1.0}
    if problem is not None:
        out["bad_reason"] = problem
    return out
