"""The process reward model: a causal LM's decoder with a scalar head (:class:`mathrl.models.value_head.ValueModel`,
the critic's architecture), whose logit at the last token of a step scores that step; trained with
:func:`mathrl.algo.process.prm_loss` against the automatic labels of :mod:`mathrl.prm.labels`.

The score of step j is read (:func:`mathrl.train.process.step_logits`, :func:`~mathrl.train.process.prm_scores`,
shared with the RL step that uses the PRM) at the position of its last token, ``P + end_j`` in the ``[prompt | response]``
row: the state that has read the whole step (the critic reads the state *before* each token instead). Training
runs on the trainer's DeepSpeed engine and micro-batch loop (:func:`mathrl.train.update.accumulate_and_step`),
so a PRM trains under ZeRO 1/2/3 and any world size like the policy.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from mathrl.algo.process import prm_loss
from mathrl.dist.collectives import all_reduce, sum_over_ranks
from mathrl.train.layouts import Padded
from mathrl.train.process import step_logits
from mathrl.train.rows import ForwardBatch
from mathrl.train.update import MicroLoss, accumulate_and_step, step_grad_norm

__all__ = ["filler_record", "fit_prm", "prm_train_step", "records_to_tensors"]


def prm_train_step(engine, tokens: ForwardBatch, ends: Tensor, labels: Tensor, step_mask: Tensor, *,
                   token_budget: int, device, world_size: int = 1) -> dict[str, float | str]:
    """One optimizer step of the PRM on this rank's responses (``ends``, ``labels``, ``step_mask``: ``[N, S]``),
    the loss normalised by the step count of all ranks. Metrics: ``prm/loss``, ``prm/accuracy``, ``prm/steps``,
    ``prm/grad_norm``, ``stepped``, ``bad_step`` (NaN/inf skips the step)."""
    layout = Padded()
    n_steps = sum_over_ranks([float(step_mask.sum())])[0]
    if n_steps == 0:
        return {"prm/loss": float("nan"), "prm/steps": 0.0, "stepped": 0.0, "bad_step": 0.0}
    plan = layout.plan(tokens, token_budget)
    sums = [0.0, 0.0]  # loss, agreeing steps

    def micro_loss(rows: Tensor, real: bool, check: bool) -> MicroLoss:
        mb = layout.micro_batch(tokens, rows, device)
        z = step_logits(engine, mb, ends[rows])
        sm = step_mask[rows].to(z.device)
        loss, st = prm_loss(z.float(), labels[rows].to(z.device), sm, norm_steps=n_steps)
        if real:
            sums[0] += float(loss.detach())
            sums[1] += float(st["accuracy"]) * float(sm.sum())
        return MicroLoss(loss, {"PRM loss": loss}, loss_key="PRM loss")

    problem = accumulate_and_step(engine, layout.agreed(plan), micro_loss, world_size=world_size, what="PRM")
    total = sum_over_ranks(sums)
    out: dict[str, float | str] = {"prm/loss": total[0], "prm/accuracy": total[1] / n_steps, "prm/steps": n_steps,
                                   "prm/grad_norm": step_grad_norm(engine, problem),
                                   "stepped": 1.0 if problem is None else 0.0,
                                   "bad_step": 0.0 if problem is None else 1.0}
    if problem is not None:
        out["bad_reason"] = problem
    return out


def records_to_tensors(records: list[dict], pad: int, target: str, *, masked: bool = False
                       ) -> tuple[ForwardBatch, Tensor, Tensor, Tensor]:
    """Labelled responses (``mathrl prm label`` records) as a :class:`ForwardBatch` (left-padded prompts,
    right-padded responses) and ``[N, S]`` step ends, ``target`` labels (``soft`` or ``hard``) and step mask;
    ``masked``: every step masked out (a filler that adds no loss and no step to the count)."""
    n = len(records)
    P = max(len(r["prompt_ids"]) for r in records)
    T = max(len(r["response_ids"]) for r in records)
    S = max(len(r["ends"]) for r in records)
    pids = torch.full((n, P), pad, dtype=torch.long)
    pmask = torch.zeros(n, P, dtype=torch.long)
    rids = torch.full((n, T), pad, dtype=torch.long)
    rmask = torch.zeros(n, T, dtype=torch.bool)
    ends = torch.zeros(n, S, dtype=torch.long)
    labels = torch.zeros(n, S)
    smask = torch.zeros(n, S, dtype=torch.bool)
    for i, r in enumerate(records):
        p, q, k = len(r["prompt_ids"]), len(r["response_ids"]), len(r["ends"])
        pids[i, P - p:], pmask[i, P - p:] = torch.tensor(r["prompt_ids"]), 1
        rids[i, :q], rmask[i, :q] = torch.tensor(r["response_ids"]), True
        ends[i, :k], labels[i, :k], smask[i, :k] = torch.tensor(r["ends"]), torch.tensor(r[target]), not masked
    return ForwardBatch(pids, pmask, rids, rmask), ends, labels, smask


def filler_record(tokenizer) -> dict:
    """A one-token record (EOS as prompt and response, one step) for a rank with no records of its own."""
    eos = tokenizer.eos_token_id
    return {"prompt_ids": [eos], "response_ids": [eos], "ends": [0], "hard": [0.0], "soft": [0.0]}


def fit_prm(engine, records: list[dict], *, epochs: int, batch: int, target: str, tokenizer, token_budget: int,
            device, world_size: int, rng: random.Random) -> dict[str, float]:
    """``epochs`` passes of :func:`prm_train_step` over this rank's ``records`` in ``rng``'s order, ``batch``
    records per optimizer step (``mathrl prm train`` and the iterative rounds). Every rank runs the same number of
    steps (the most any rank needs; a rank out of records steps with a fully masked filler). Returns
    ``prm/loss`` (the mean of the steps' global losses), ``prm/optimizer_steps`` and ``prm/records_trained`` (all
    ranks)."""
    per_epoch = int(all_reduce(torch.tensor([float(-(-len(records) // batch))]), "max")[0])
    losses, stepped = [], 0.0
    for _ in range(epochs):
        order = list(range(len(records)))
        rng.shuffle(order)
        for j in range(per_epoch):
            part = [records[i] for i in order[j * batch:(j + 1) * batch]]
            tensors = records_to_tensors(part or [filler_record(tokenizer)], tokenizer.pad_token_id, target,
                                         masked=not part)
            st = prm_train_step(engine, *tensors, token_budget=token_budget, device=device, world_size=world_size)
            if st["prm/steps"]:
                losses.append(float(st["prm/loss"]))
                stepped += float(st["stepped"])
    return {"prm/loss": sum(losses) / len(losses) if losses else float("nan"), "prm/optimizer_steps": stepped,
            "prm/records_trained": sum_over_ranks([len(records)])[0]}
