"""One DPO step on the trainer's engine: preference pairs of verifier-graded samples, the DPO loss
(:mod:`mathrl.algo.preference`) over token-budgeted micro-batches, one optimizer step.

A pair's loss needs both responses' sequence logprobs, but a micro-batch may split a pair. So the step runs in
two passes, as the RL update does with its old logprobs: a no-grad forward gives every response's sequence
logprob at the current weights, hence each pair's DPO loss and its derivative ``c_r = dL / d log pi(y_r|x)``
for every row (``dpo_loss``'s own autograd, with the step's global pair count as normaliser); then each
micro-batch backpropagates ``sum_r c_r * log pi(y_r|x)``, whose gradient at the current weights is exactly
DPO's (``c_r`` are constants). The micro-batch split, the world size and the order of rows do not change it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import Tensor

from mathrl.algo.preference import dpo_loss, dpo_pairs, sequence_logprobs
from mathrl.dist.collectives import sum_over_ranks
from mathrl.train.layouts import Layout, Padded
from mathrl.train.rows import ForwardBatch
from mathrl.train.update import MicroLoss, accumulate_and_step, step_grad_norm

__all__ = ["pair_rows", "pair_tokens", "reference_logprobs", "dpo_train_step"]


def pair_rows(group_index: Sequence[int], correct: Sequence[bool], *, per_group: int = 1) -> list[int]:
    """The rows of a graded batch DPO trains on, as ``[chosen_1, rejected_1, chosen_2, ...]``
    (:func:`mathrl.algo.preference.dpo_pairs`)."""
    return [r for pair in dpo_pairs(group_index, correct, per_group=per_group) for r in pair]


def pair_tokens(batch, rows: Sequence[int]) -> dict[str, Tensor]:
    """The tensors of ``rows`` of a rollout batch (prompts left-padded, responses right-padded)."""
    idx = torch.tensor(list(rows), dtype=torch.long)
    return {"prompt_ids": batch.prompt_ids[idx], "prompt_mask": batch.prompt_mask[idx],
            "response_ids": batch.response_ids[idx], "response_mask": batch.response_mask[idx]}


def as_forward_batch(data: dict[str, Tensor]) -> ForwardBatch:
    return ForwardBatch(data["prompt_ids"], data["prompt_mask"], data["response_ids"], data["response_mask"].bool())


@torch.no_grad()
def reference_logprobs(model, tokens: ForwardBatch, *, token_budget: int, device, layout: Layout | None = None
                       ) -> Tensor:
    """``[N]`` sequence logprobs of ``tokens``' responses under ``model`` (a module or an inference engine), at
    temperature 1, in eval mode. Every rank must call it (the forward count is agreed over the ranks, and ZeRO-3
    gathers parameters inside each forward): a rank without rows passes a filler row and drops the result."""
    if tokens.response_ids.shape[0] == 0:
        raise ValueError("reference_logprobs: no rows; a rank without rows passes a filler row so that it takes "
                         "part in the ranks' forwards")
    module = getattr(model, "module", model)
    was = module.training
    module.eval()
    try:
        logp = (layout or Padded()).logprobs(model, tokens, token_budget=token_budget, temperature=1.0,
                                             device=device)
    finally:
        module.train(was)
    return sequence_logprobs(logp.float(), tokens.response_mask).cpu()


def dpo_train_step(engine, tokens: ForwardBatch, ref_logps: Tensor, *, beta: float, label_smoothing: float = 0.0,
                   token_budget: int, device: torch.device | str = "cpu", world_size: int = 1,
                   layout: Layout | None = None, filler: ForwardBatch | None = None) -> dict[str, float | str]:
    """One optimizer step of DPO on this rank's pairs: ``tokens`` holds rows ``[chosen_1, rejected_1, ...]``
    (:func:`pair_rows`) and ``ref_logps`` their reference sequence logprobs (``[2P]``).

    The loss is normalised by the pair count of all ranks. A rank without pairs takes part in the gradient
    reduction with ``filler`` (any one row of its batch), fully masked; when no rank has a pair, nothing is
    stepped (``stepped`` = 0). A NaN/inf
    loss or gradient skips the step (``bad_step`` = 1). Metrics (over all ranks' pairs): ``dpo/loss``,
    ``dpo/margin``, ``dpo/accuracy``, ``dpo/reward_chosen``, ``dpo/reward_rejected``, ``dpo/pairs``."""
    layout = layout or Padded()
    n = tokens.response_ids.shape[0]
    if n % 2 or ref_logps.shape != (n,):
        raise ValueError(f"dpo_train_step: {n} rows and reference logprobs of shape {tuple(ref_logps.shape)}: "
                         "expected pairs (chosen, rejected) and one reference logprob per row")
    pairs = n // 2
    (global_pairs,) = sum_over_ranks([pairs])
    if global_pairs == 0:
        return {"dpo/loss": float("nan"), "dpo/pairs": 0.0, "stepped": 0.0, "bad_step": 0.0}
    coef = torch.zeros(max(n, 1), dtype=torch.float64)
    sums = [0.0] * 5  # loss, margin, accuracy, reward_chosen, reward_rejected (summed over pairs)
    if pairs:
        seq = reference_logprobs(engine.module, tokens, token_budget=token_budget, device=device,
                                 layout=layout).double()
        chosen, rejected = seq[0::2].clone().requires_grad_(), seq[1::2].clone().requires_grad_()
        ref = ref_logps.double()
        loss, st = dpo_loss(chosen, rejected, ref[0::2], ref[1::2], beta=beta, label_smoothing=label_smoothing,
                            norm_pairs=global_pairs)
        loss.backward()  # c_r = dL / d log pi(y_r | x), with the global normaliser
        coef[0::2], coef[1::2] = chosen.grad, rejected.grad
        sums = [float(loss.detach()) * global_pairs] + [float(st[k]) * pairs for k in
                                               ("margin", "accuracy", "reward_chosen", "reward_rejected")]
    else:  # take part in the ranks' forwards and the gradient reduction with one fully masked row
        if filler is None or filler.response_ids.shape[0] == 0:
            raise ValueError("dpo_train_step: a rank without pairs needs a filler row to take part in the step")
        reference_logprobs(engine.module, filler, token_budget=token_budget, device=device, layout=layout)
        tokens = dataclasses.replace(filler, response_mask=torch.zeros_like(filler.response_mask))
    rows = torch.arange(n) if pairs else torch.zeros(1, dtype=torch.long)
    plan = layout.plan(tokens, token_budget, rows)

    def micro_loss(rows_mb: Tensor, real: bool, check: bool) -> MicroLoss:
        mb = layout.micro_batch(tokens, rows_mb, device)
        logp, _ = layout.policy_forward(engine, mb, temperature=1.0)
        seqs = sequence_logprobs(logp, mb.response_mask)
        c = coef[rows_mb].to(device=seqs.device, dtype=seqs.dtype) if pairs else torch.zeros_like(seqs)
        surrogate = (c * seqs).sum()
        return MicroLoss(surrogate, {"DPO loss": surrogate}, loss_key="DPO loss")

    problem = accumulate_and_step(engine, layout.agreed(plan), micro_loss, world_size=world_size, what="DPO")
    grad_norm = step_grad_norm(engine, problem)
    total = sum_over_ranks(sums)
    out: dict[str, float | str] = {
        "dpo/loss": total[0] / global_pairs, "dpo/margin": total[1] / global_pairs,
        "dpo/accuracy": total[2] / global_pairs, "dpo/reward_chosen": total[3] / global_pairs,
        "dpo/reward_rejected": total[4] / global_pairs, "dpo/pairs": global_pairs, "dpo/grad_norm": grad_norm,
        "stepped": 1.0 if problem is None else 0.0, "bad_step": 0.0 if problem is None else 1.0}
    if problem is not None:
        out["bad_reason"] = problem
    return out
