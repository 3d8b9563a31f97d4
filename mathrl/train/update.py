"""Step 6 of an RL step: the PPO/GRPO update of one mini-batch (policy, then critic) over token-budgeted
micro-batches, with the global normalisers, NaN/inf skipping and the step's metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from mathrl.algo import kl as kl_mod
from mathrl.algo.correction import mismatch_stats, tis_weights
from mathrl.algo.losses import value_loss
from mathrl.algo.objectives import policy_objective
from mathrl.config import Config
from mathrl.rollout import RolloutBatch
from mathrl.dist.collectives import all_ranks_ok, device
from mathrl.dist.engines import discard_gradients
from mathrl.train.rows import ForwardBatch
from mathrl.train.models import GradGuard
from mathrl.train.packing import to_device


@dataclass
class TrainBatch:
    """What the update of one RL step reads, per response row of this rank (N = prompts x G rows,
    T = the longest response): the rollout's tokens and the tensors steps 4-5 computed from them."""

    batch: RolloutBatch                     # the step's prompts, responses and the sampler's logprobs
    mask: torch.Tensor                      # [N, T] bool, the response tokens
    advantages: torch.Tensor                # [N, T]
    old_logp: torch.Tensor | None = None    # [N, T] logprobs under the sampling policy (None: the current ones)
    ref_logp: torch.Tensor | None = None    # [N, T] reference logprobs (KL on)
    old_values: torch.Tensor | None = None  # [N, T] critic values before the update (GAE)
    returns: torch.Tensor | None = None     # [N, T] value targets (GAE)
    norm_const: float = 1.0                 # the constant of the seq-mean-token-sum-norm aggregation
    loss_mask: torch.Tensor | None = None   # [N, T] bool, the tokens the policy loss counts (None: mask;
                                            # algo.mask_truncated leaves truncated responses out)

    @property
    def tokens(self) -> ForwardBatch:
        """The rows the forwards read: the rollout's prompts and responses with ``mask``."""
        return ForwardBatch.of(self.batch, self.mask)


def sampling_temperature(r) -> float:
    """The temperature the trainer's logprobs use: the sampler's (greedy sampling scores at 1)."""
    return r.temperature if r.temperature > 0 else 1.0


def behaviour_logprobs(cfg: Config, batch: RolloutBatch, old_logp: torch.Tensor | None) -> torch.Tensor:
    """The logprobs of the policy that sampled ``batch``, for the KL to the reference in the reward and in
    ``kl/mean``: the trainer's no-grad forward (``old_logp``) when the batch was sampled with the current weights,
    the rollout engine's own logprobs under asynchronous rollout (``rollout.staleness = 1``: the batch came
    from the weights one optimizer step old, which the trainer no longer holds) or when the forward was skipped."""
    if cfg.rollout.staleness or old_logp is None:
        return batch.logprobs
    return old_logp


def finite(x: torch.Tensor) -> bool:
    """No NaN/inf anywhere in ``x`` (one host sync)."""
    return bool(torch.isfinite(x).all())


def _acc(stats_acc: dict[str, list], key: str, value) -> None:
    """Append a statistic; a tensor stays on its device (no host sync per micro-batch) until
    :func:`host_stats` reads them all back at once."""
    stats_acc.setdefault(key, []).append(value.detach() if isinstance(value, torch.Tensor) else float(value))


def host_stats(stats_acc: dict[str, list]) -> dict[str, list[float]]:
    """``stats_acc`` with every value a float: the tensors read back in one transfer per device
    (float64, so each equals ``float(tensor)``)."""
    by_dev: dict[torch.device, list[torch.Tensor]] = {}
    for vals in stats_acc.values():
        for v in vals:
            if isinstance(v, torch.Tensor):
                by_dev.setdefault(v.device, []).append(v.reshape(()).to(torch.float64))
    host = {dev: iter(torch.stack(ts).tolist()) for dev, ts in by_dev.items()}
    return {k: [next(host[v.device]) if isinstance(v, torch.Tensor) else v for v in vals]
            for k, vals in stats_acc.items()}


def skip_or_step(engine, guard: GradGuard | None, problem: str | None, what: str, step: int) -> str | None:
    """The optimizer step of one mini-batch, unless some rank saw NaN/inf in it; returns what was bad."""
    if problem is None and guard is not None and guard.bad is not None:
        problem = f"{what} gradient of {guard.bad} is NaN/inf"
    if guard is not None:
        guard.reset()
    if all_ranks_ok(problem is None):
        engine.step()
        gn = engine.get_global_grad_norm()
        if gn is not None and not math.isfinite(float(gn)):  # DeepSpeed skipped it (its own overflow check)
            return f"{what} gradient norm is {gn}"
        return None
    discard_gradients(engine)
    return problem or f"{what}: NaN/inf on another rank"


def accumulate_and_step(engine, plan, micro_loss: Callable[[torch.Tensor, bool, bool], MicroLoss], *,
                        world_size: int, what: str, step: int = 0, guard: GradGuard | None = None) -> str | None:
    """The one micro-batch loop of every update (policy, critic, SFT): a backward per entry of ``plan``, then
    one optimizer step unless some rank saw NaN/inf. Returns what was bad (None: the step was taken).

    ``plan`` is this rank's agreed plan (:meth:`~mathrl.train.layouts.Layout.agreed`): ``(rows, real)`` pairs, the same count
    on every rank (ZeRO-2/3 communicate inside each backward). ``micro_loss(rows, real, check)`` runs the
    forward of ``rows`` and returns a :class:`MicroLoss` whose loss already carries the mini-batch's *global*
    normaliser (all micro-batches, all ranks); ``check`` (a real micro-batch while no problem was seen yet)
    asks for its ``guarded`` tensors to be checked for NaN/inf here (one host sync), and it records its
    statistics when ``real``. DeepSpeed averages gradients over ranks, so this loop, and only this loop,
    multiplies each loss by ``world_size``; padding entries, and every micro-batch after a NaN, backpropagate
    with weight 0 (exact zeros), so the other ranks are not left waiting in a collective."""
    engine.train()
    problem = None
    n_real = sum(real for _, real in plan)
    for i, (rows, real) in enumerate(plan):
        check = real and problem is None
        ml = micro_loss(rows, real, check)
        loss = ml.loss
        if check:
            problem = _non_finite(ml.guarded, f"micro-batch {i + 1} of {n_real}")
        weight = float(world_size) if real and problem is None else 0.0
        engine.backward(loss * weight, scale_wrt_gas=False)
    return skip_or_step(engine, guard, problem, what, step)


@dataclass
class MicroLoss:
    """One micro-batch's loss (to backpropagate) and the tensors that must be finite, by name, checked in
    order (a scalar is reported with its value, e.g. ``policy loss is nan``; others as ``... are NaN/inf``).
    ``loss_key`` names the entry of ``guarded`` that is the loss as the user knows it (for the value loss:
    before its ``algo.vf_coef`` weight)."""

    loss: torch.Tensor
    guarded: dict[str, torch.Tensor]
    loss_key: str


def _non_finite(guarded: dict[str, torch.Tensor], where: str) -> str | None:
    """Which guarded tensor holds NaN/inf (None: all finite; one host sync when they are)."""
    ok = torch.stack([torch.isfinite(t.detach()).all() for t in guarded.values()]).all()
    if bool(ok):
        return None
    for name, t in guarded.items():
        if not finite(t.detach()):
            return f"{name} is {float(t.detach())} ({where})" if t.numel() == 1 else f"{name} are NaN/inf ({where})"
    return None


def update_policy(cfg: Config, dist, models, tb: TrainBatch, plan, norms, stats_acc: dict[str, list[float]],
                  step: int = 0, first_pass: bool = True) -> str | None:
    """The policy's update of one mini-batch (:func:`accumulate_and_step` over ``plan``): the configured policy
    loss with the KL to the reference (``kl_in = loss``), the entropy bonus and the truncated importance
    weights (``algo.tis_cap``), every term with the mini-batch's global normalisers ``norms``.

    NaN/inf in the logprobs, the loss or any gradient skips the step (gradients discarded, no
    optimizer or scheduler step); returns where it was seen.

    On the ``first_pass`` over the batch (the first epoch, whose mini-batches visit every row once) the
    sampler-vs-trainer mismatch statistics are recorded (``mismatch/*``); with ``algo.tis_cap`` each
    token's loss is weighted by the truncated importance ratio pi_old / pi_sampler."""
    a, r = cfg.algo, cfg.rollout
    engine, layout = models.policy, models.layouts["policy"]
    n_real = sum(real for _, real in plan)
    batch, tokens, old_logp, ref_logp = tb.batch, tb.tokens, tb.old_logp, tb.ref_logp

    def micro_loss(rows: torch.Tensor, real: bool, check: bool) -> MicroLoss:
        mb = layout.micro_batch(tokens, rows, device())
        # entropy comes from the same fused pass as the logprobs; it enters the loss only with a bonus
        logp, ent = layout.policy_forward(engine, mb, temperature=sampling_temperature(r), with_entropy=True)
        m = mb.response_mask
        if tb.loss_mask is not None:
            m = m & to_device(tb.loss_mask[rows, : mb.T], m.device)
        adv = to_device(tb.advantages[rows, : mb.T], logp.device)
        old = to_device(old_logp[rows, : mb.T], logp.device) if old_logp is not None else logp.detach()
        sampler = to_device(batch.logprobs[rows, : mb.T], logp.device)
        weights = None
        if a.tis_cap is not None:  # the rollout engine's distribution differs from the trainer's
            weights, tis_st = tis_weights(old, sampler, m, a.tis_cap, a.tis_level)
            if real:
                for k, v in tis_st.items():
                    _acc(stats_acc, k, v)
        if real and first_pass:
            for k, v in mismatch_stats(old, sampler, mb.response_mask).items():
                _acc(stats_acc, k, v)
        ref = to_device(ref_logp[rows, : mb.T], logp.device) if ref_logp is not None and cfg.kl_in == "loss" else None
        obj = policy_objective(logp, old, adv, m, loss=a.policy_loss, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                               dual_clip=a.dual_clip, weights=weights, ref_logp=ref, kl_coef=a.kl_coef,
                               kl_estimator=cfg.kl_estimator, entropy=ent, entropy_coef=a.entropy_coef,
                               agg=cfg.loss_agg, norm_tokens=norms.tokens, norm_seqs=norms.seqs,
                               norm_const=tb.norm_const)
        loss, pg_loss, kl_loss, st = obj
        if real:
            if kl_loss is not None:
                _acc(stats_acc, "loss/kl", kl_loss.detach() * n_real)  # micro losses sum to the mini-batch's
            for k, v in st.items():
                _acc(stats_acc, f"policy/{k}", v)
            _acc(stats_acc, "policy/entropy", (ent.detach() * m).sum() / m.sum().clamp(min=1))
            _acc(stats_acc, "loss/policy", pg_loss.detach() * n_real)
        return MicroLoss(loss, {"policy logprobs": logp, "policy loss": loss}, loss_key="policy loss")

    problem = accumulate_and_step(engine, plan, micro_loss, world_size=dist.world_size, what="policy", step=step,
                                  guard=models.policy_guard)
    gn = step_grad_norm(engine, problem)
    if math.isfinite(gn):
        _acc(stats_acc, "policy/grad_norm", gn)
    return problem


def step_grad_norm(engine, problem: str | None) -> float:
    """The gradient norm of the optimizer step :func:`accumulate_and_step` just took (NaN when it reported a
    ``problem`` and skipped the step, or the engine keeps no norm)."""
    gn = engine.get_global_grad_norm() if problem is None else None
    return float(gn) if gn is not None else float("nan")


def update_critic(cfg: Config, dist, models, tb: TrainBatch, plan, norms, stats_acc: dict[str, list[float]],
                  step: int = 0) -> str | None:
    """The critic's counterpart of :func:`update_policy` (:func:`accumulate_and_step` over the same plan): the
    clipped value loss, weighted by ``algo.vf_coef``."""
    a = cfg.algo
    engine, layout = models.critic, models.layouts["critic"]
    n_real = sum(real for _, real in plan)
    tokens = tb.tokens

    def micro_loss(rows: torch.Tensor, real: bool, check: bool) -> MicroLoss:
        mb = layout.micro_batch(tokens, rows, device())
        v = layout.value_forward(engine, mb)
        m = mb.response_mask
        loss, st = value_loss(v, to_device(tb.old_values[rows, : mb.T], v.device),
                              to_device(tb.returns[rows, : mb.T], v.device),
                              m, clip=a.value_clip or None, agg=cfg.loss_agg, norm_tokens=norms.tokens,
                              norm_seqs=norms.seqs, norm_const=tb.norm_const)  # value_clip 0 = no clipping
        if real:
            for k, val in st.items():
                _acc(stats_acc, f"critic/{k}", val)
            _acc(stats_acc, "loss/value", loss.detach() * n_real)
        return MicroLoss(a.vf_coef * loss, {"value loss": loss}, loss_key="value loss")

    return accumulate_and_step(engine, plan, micro_loss, world_size=dist.world_size, what="critic", step=step,
                               guard=models.critic_guard)


def step_metrics(cfg: Config, sampled, tb: TrainBatch, stats_acc: dict[str, list[float]]) -> dict[str, float]:
    """The step's metrics: rewards and accuracy (``sampled``: a :class:`mathrl.train.sampling.Sampled`),
    lengths, KL, sampler-vs-trainer logprob agreement, and the means of the update's statistics."""
    batch, grades, correct, scores, truncated = (sampled.batch, sampled.grades, sampled.correct, sampled.scores,
                                                 sampled.truncated)
    mask, ref_logp, old_logp = tb.mask, tb.ref_logp, tb.old_logp
    G = cfg.rollout.n
    lengths = mask.sum(1).float()
    groups = scores.view(-1, G)
    out = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "reward/accuracy": sum(correct) / len(correct),
        "reward/zero_variance_groups": float((groups.std(1) == 0).float().mean()) if G > 1 else 1.0,
        "reward/boxed": sum("\\boxed" in t for t in batch.response_text) / len(batch.response_text),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated": sum(truncated) / len(truncated),
        "tokens": float(mask.sum()),
    }
    if grades is not None:
        out["reward/answer_found"] = sum(g.extracted is not None for g in grades) / len(grades)
        out["reward/timeouts"] = float(sum(g.reason == "timeout" for g in grades))
        # the share graded while the engine was still generating (reward.stream); the rest after it
        out["reward/graded_during_generation"] = getattr(sampled, "streamed", 0) / len(grades)
    if old_logp is not None and cfg.rollout.top_p >= 1.0 and cfg.rollout.top_k <= 0:
        # sampler vs trainer logprobs of the same tokens under the same weights: a live check that the
        # rollout engine has the current weights (stale weights show up as large differences)
        diff = (batch.logprobs - old_logp).abs()[mask]
        out["rollout/logprob_diff_max"] = float(diff.max()) if diff.numel() else 0.0
        out["rollout/logprob_diff_mean"] = float(diff.mean()) if diff.numel() else 0.0
    if ref_logp is not None:
        kl = kl_mod.estimate(behaviour_logprobs(cfg, batch, old_logp), ref_logp, cfg.kl_estimator)
        out["kl/mean"] = float((kl * mask).sum() / mask.sum().clamp(min=1))
    for k, v in host_stats(stats_acc).items():
        vals = [x for x in v if math.isfinite(x)]
        if not vals:
            continue
        if k.endswith("_min"):
            out[k] = min(vals)
        elif k.endswith("_max"):
            out[k] = max(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out
