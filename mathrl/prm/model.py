"""The process reward model: a causal LM's decoder with a scalar head (:class:`mathrl.models.value_head.ValueModel`,
the critic's architecture), whose logit at the last token of a step scores that step; trained with
:func:`mathrl.algo.process.prm_loss` against the automatic labels of :mod:`mathrl.prm.labels`.

The score of step j is read at the position of its last token, ``P + end_j`` in the ``[prompt | response]``
row: the state that has read the whole step (the critic reads the state *before* each token instead). Training
runs on the trainer's DeepSpeed engine and micro-batch loop (:func:`mathrl.train.update.accumulate_and_step`),
so a PRM trains under ZeRO 1/2/3 and any world size like the policy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mathrl.algo.process import prm_loss
from mathrl.dist.collectives import global_sum
from mathrl.train.forward import MicroBatch
from mathrl.train.layouts import Padded
from mathrl.train.rows import ForwardBatch
from mathrl.train.update import MicroLoss, accumulate_and_step

__all__ = ["step_logits", "prm_scores", "prm_train_step"]


def step_logits(prm, mb: MicroBatch, ends: Tensor) -> Tensor:
    """``[n, S]``: the PRM's logit at the last token of each step of ``mb``'s rows (``ends``: ``[n, S]`` token
    indices into the responses; padding steps may hold any index within the response, their logits are
    ignored by the caller)."""
    v = prm(mb.input_ids, mb.attention_mask, mb.position_ids)  # [n, P + T], one per position
    idx = (mb.P + ends.clamp(0, max(mb.T - 1, 0))).to(v.device)
    return v.gather(1, idx)


@torch.no_grad()
def prm_scores(prm, tokens: ForwardBatch, ends: Tensor, step_mask: Tensor, *, token_budget: int, device) -> Tensor:
    """``[N, S]`` probabilities that each step leads to a correct answer (sigmoid of :func:`step_logits`), 0 at
    padding steps; in eval mode, micro-batched like the trainer's forwards."""
    layout = Padded()
    module = getattr(prm, "module", prm)
    was = module.training
    module.eval()
    out = torch.zeros(step_mask.shape, dtype=torch.float32)
    try:
        for rows in layout.plan(tokens, token_budget):
            mb = layout.micro_batch(tokens, rows, device)
            z = step_logits(prm, mb, ends[rows])
            out[rows] = torch.sigmoid(z.float()).cpu()
    finally:
        module.train(was)
    return torch.where(step_mask.bool(), out, torch.zeros_like(out))


def prm_train_step(engine, tokens: ForwardBatch, ends: Tensor, labels: Tensor, step_mask: Tensor, *,
                   token_budget: int, device, world_size: int = 1) -> dict[str, float | str]:
    """One optimizer step of the PRM on this rank's responses (``ends``, ``labels``, ``step_mask``: ``[N, S]``),
    the loss normalised by the step count of all ranks. Metrics: ``prm/loss``, ``prm/accuracy``, ``prm/steps``,
    ``prm/grad_norm``, ``stepped``, ``bad_step`` (NaN/inf skips the step)."""
    layout = Padded()
    n_steps = float(global_sum(torch.tensor([float(step_mask.sum())], dtype=torch.float64))[0])
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
    total = global_sum(torch.tensor(sums, dtype=torch.float64)).tolist()
    gn = engine.get_global_grad_norm() if problem is None else None
    out: dict[str, float | str] = {"prm/loss": total[0], "prm/accuracy": total[1] / n_steps, "prm/steps": n_steps,
                                   "prm/grad_norm": float(gn) if gn is not None else float("nan"),
                                   "stepped": 1.0 if problem is None else 0.0,
                                   "bad_step": 0.0 if problem is None else 1.0}
    if problem is not None:
        out["bad_reason"] = problem
    return out
