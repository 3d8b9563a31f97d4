"""The RL step, :func:`train_step`, read top to bottom; :class:`RLMethod` plugs it into the
:class:`~mathrl.train.trainer.Trainer`, which :func:`run` drives.

GRPO and PPO are the same loop; the configuration chooses the advantage
estimator, where the KL to the reference goes (the loss, the per-token reward,
or nowhere), and whether a critic exists. Per step:

1. draw B problems (this rank's share), render prompts with the chat template;
2. the rollout engine samples G responses each;
3. the verifier grades them (worker processes, hard timeouts) -> scalar rewards
   (steps 1-3: :func:`mathrl.train.sampling.sample_and_grade`, shared with the
   ablation methods; :func:`~mathrl.train.sampling.sample_step` adds DAPO's
   dynamic sampling -- more rounds until B groups have rewards that differ --
   and the pass-rate prompt filter);
4. no-grad forwards: reference logprobs (KL on), old logprobs (only when they
   differ from the current ones: several epochs or several mini-batches, or KL
   in the reward), critic values (GAE), the process reward model's step scores
   (GRPO+PS, :mod:`mathrl.train.process`);
5. advantages from the estimator registry (:mod:`mathrl.algo.advantages`);
6. for each PPO epoch and mini-batch: token-budgeted micro-batches, loss with the
   *global* normalisers of the mini-batch (``algo.policy_loss``: PPO, GSPO or CISPO;
   ``algo.tis_cap``: truncated importance weights against the sampler-trainer
   mismatch; ``algo.mask_truncated``: cut responses out), backward; one optimizer step
   (:func:`mathrl.train.update.update_policy` / ``update_critic`` on a
   :class:`~mathrl.train.update.TrainBatch`);
7. push the new weights to the rollout engine; log; checkpoint
   (:mod:`mathrl.train.checkpoint`). With ``rollout.staleness = 1`` steps 1-3 of the
   next step run during steps 4-6 on the weights before the update
   (:mod:`mathrl.train.offpolicy`), and the push waits for them;
8. iterative RL (``algo.ref_update_every = N``): every N steps the reference
   model becomes a copy of the current policy (DeepSeekMath sec. 4.2).

Where the rest lives: start-up, resume, the memory fit, checkpoint timing, held-out evaluation and the
stop on NaN in :mod:`mathrl.train.trainer` (one for every method); models, the gradient guard, the rollout
engine and the weight sync in :mod:`mathrl.train.models`; run start-up in
:mod:`mathrl.train.setup`; held-out evaluation and the report in
:mod:`mathrl.train.report`; the training and held-out problems in
:mod:`mathrl.data.splits`.

Exact resume: the data order, sampling seeds and mini-batch shuffles are pure
functions of (seed, step, rank), so a checkpoint needs only weights, optimizer,
LR scheduler and the step counter (and the stream position, the pass-rate history, the global random
generators that dropout draws from and, with asynchronous rollout, the batch already sampled for the
next step).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mathrl.algo import advantages as adv_mod
from mathrl.algo import kl as kl_mod
from mathrl.algo.losses import global_normalizers
from mathrl.algo.process import StepRewards
from mathrl.config import Config, rules
from mathrl.train.checkpoint import State
from mathrl.dist.collectives import DistInfo, device, global_sum
from mathrl.train.offpolicy import OffPolicySampler
from mathrl.train.process import process_metrics, process_rewards
from mathrl.train.models import (Models, generation_weights, iterative_reference, optimizer_steps_per_rl_step,
                                 reset_reference, sync_weights)
from mathrl.train.sampling import sample_records, sample_step, sampling_seed
from mathrl.train.trainer import Method, Trainer
from mathrl.train.rows import ForwardBatch
from mathrl.train.update import (TrainBatch, behaviour_logprobs, sampling_temperature, step_metrics, update_critic,
                                 update_policy)
from mathrl.rollout import colocate


def compute_advantages(cfg: Config, scores: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor,
                       kl_tokens: torch.Tensor | None, values: torch.Tensor | None,
                       steps: StepRewards | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-level advantages [N, T] (and returns for GAE) for the configured estimator.

    ``kl_tokens`` (the per-token KL of the sampled responses, given when ``kl_in = reward``) enters
    the reward: per token for the token-level estimators (PPO-style, :func:`token_level_rewards`),
    summed into each response's score before the group baseline for the group estimators (RLOO-style,
    :func:`sequence_kl_scores`). Whitening (GAE, REINFORCE++) uses the statistics of the global batch
    (all ranks). ``steps``: the PRM's step rewards, for a step-level estimator (grpo_ps)."""
    name = cfg.advantage
    kl_coef = cfg.algo.kl_coef if cfg.kl_in == "reward" else 0.0
    return adv_mod.estimate_advantages(name, scores, group_index, mask,
                                       params=adv_mod.estimator_params(name, cfg.algo),
                                       kl_tokens=kl_tokens, kl_coef=kl_coef, values=values, reduce=global_sum,
                                       steps=steps)


def train_step(cfg: Config, dist: DistInfo, models: Models, rollout, problems, state: State,
               sample_log=None, sampler: OffPolicySampler | None = None) -> dict[str, float]:
    """One RL step (see the module docstring).

    ``sample_log(step, records)`` receives
    ``logging.log_samples`` of this rank's completions (``rollouts.jsonl``). ``sampler``
    (``rollout.staleness = 1``) gives the batch sampled during the previous step and samples the next
    one during this step's update (:mod:`mathrl.train.offpolicy`)."""

    t_step = time.perf_counter()
    a, t, r = cfg.algo, cfg.train, cfg.rollout
    G = r.n
    per_rank = t.batch_size // dist.world_size

    # 1-3. this rank's problems, G sampled responses each, graded and scored (with algo.dynamic_sampling:
    #      more rounds until the batch has B groups whose rewards differ, pooled over the ranks)
    if sampler is None:
        with generation_weights(rollout, models.policy):  # ZeRO-3 + hf engine: gathered for the whole phase
            s = sample_step(cfg, dist, models.tokenizer, rollout, problems, state)
    else:  # asynchronous: the batch sampled (with the weights one step old) while the last step trained
        s = sampler.take(state)
    times = dict(s.times)
    batch = s.batch
    mask = batch.response_mask.bool()
    tokens = ForwardBatch.of(batch, mask)
    layouts = models.layouts  # each model's forward layout (train.share_prompt, packing, padding_free)
    fwd = dict(token_budget=t.micro_batch_tokens, device=device())
    temperature = sampling_temperature(r)  # logprobs of the distribution that was sampled

    # 4. no-grad forwards. The old logprobs equal the current ones (and are not computed) when the
    #    batch is used for exactly one optimizer step and the KL is not in the reward (PPO's KL-in-reward
    #    needs them before the update: the penalty enters the rewards that GAE turns into advantages).
    t0 = time.perf_counter()
    n_minibatches = t.batch_size // (t.mini_batch_size or t.batch_size)
    old_logp = None
    if not (optimizer_steps_per_rl_step(cfg) == 1 and cfg.kl_in != "reward"):
        was_training = models.policy.module.training
        models.policy.module.eval()  # no dropout in the behaviour policy's logprobs
        old_logp = layouts["policy"].logprobs(models.policy.module, tokens, temperature=temperature, **fwd)
        models.policy.module.train(was_training)
    times["old_forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref_logp = None
    if models.ref is not None:
        ref_logp = layouts["ref"].logprobs(models.ref, tokens, temperature=temperature, **fwd)
    times["ref_forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    values = layouts["critic"].values(models.critic.module, tokens, **fwd) if models.critic is not None else None
    times["values_forward"] = time.perf_counter() - t0
    steps = None
    if models.prm is not None:  # GRPO+PS: the process reward model scores each step of every response
        t0 = time.perf_counter()
        steps = process_rewards(models.prm, models.tokenizer, tokens, **fwd)
        times["prm_forward"] = time.perf_counter() - t0

    # 5. advantages (the KL goes into the reward here when kl_in = reward)
    kl_reward = None
    if ref_logp is not None and cfg.kl_in == "reward":  # the sampling policy's KL (staleness: the engine's logprobs)
        kl_reward = kl_mod.estimate(behaviour_logprobs(cfg, batch, old_logp), ref_logp, cfg.kl_estimator)
    advantages, returns = compute_advantages(cfg, s.scores, batch.group_index, mask, kl_reward, values, steps)
    if sample_log is not None and cfg.logging.log_samples:
        sample_log(state.step + 1, sample_records(s, advantages, mask, cfg.logging.log_samples, steps))
    # responses cut at max_tokens keep their place in the group baseline above; with algo.mask_truncated
    # they leave the policy loss and its token/sequence normalisers
    loss_mask = mask & ~torch.tensor(s.truncated, dtype=torch.bool)[:, None] if a.mask_truncated else None
    tb = TrainBatch(batch=batch, mask=mask, advantages=advantages, old_logp=old_logp, ref_logp=ref_logp,
                    old_values=values, returns=returns, norm_const=a.norm_const or float(r.max_tokens),
                    loss_mask=loss_mask)

    # 6. PPO epochs over mini-batches of prompts (a group's G responses stay together); one optimizer
    #    step per mini-batch, each loss divided by the mini-batch's global token/sequence counts
    t0 = time.perf_counter()
    stats_acc: dict[str, list[float]] = {}
    bad: list[str] = []
    for epoch in range(a.ppo_epochs):
        g = torch.Generator().manual_seed(sampling_seed(cfg, state.step, dist.rank) + 7919 * (epoch + 1))
        prompt_order = torch.randperm(per_rank, generator=g) if n_minibatches > 1 else torch.arange(per_rank)
        per_mb = per_rank // n_minibatches
        for m in range(n_minibatches):
            prompts_mb = prompt_order[m * per_mb:(m + 1) * per_mb]
            rows = (prompts_mb[:, None] * G + torch.arange(G)[None, :]).flatten()
            plan = layouts["policy"].plan(tokens, t.micro_batch_tokens, rows)
            counted = mask if loss_mask is None else loss_mask
            norms = global_normalizers([counted[rows_] for rows_ in plan], reduce=global_sum)
            # every rank runs the same number of backwards (ZeRO-2/3 communicate inside each one)
            plan = layouts["policy"].agreed(plan)
            where = f"epoch {epoch + 1}, mini-batch {m + 1}"
            problem = update_policy(cfg, dist, models, tb, plan, norms, stats_acc, step=state.step + 1,
                                    first_pass=epoch == 0)
            bad += [f"{where}: {problem}"] if problem else []
            if models.critic is not None:  # the value loss counts every response token
                if loss_mask is not None:
                    norms = global_normalizers([mask[rows_] for rows_ in plan], reduce=global_sum)
                problem = update_critic(cfg, dist, models, tb, plan, norms, stats_acc, step=state.step + 1)
                bad += [f"{where}: {problem}"] if problem else []
    times["train"] = time.perf_counter() - t0

    # 7. weights -> rollout engine (colocated schedule: wake the weights first; asynchronous rollout:
    #    the next step's generation, which ran during the update, ends first)
    if sampler is not None:
        times.update(sampler.wait())
    wake = colocate.before_sync(rollout)
    if wake:  # time/wake = both wakes of the step
        times["wake"] = times.get("wake", 0.0) + wake.pop("wake")
        times.update(wake)
    t0 = time.perf_counter()
    sync_weights(rollout, models.policy)
    times["sync"] = time.perf_counter() - t0

    metrics = step_metrics(cfg, s, tb, stats_acc)
    metrics.update(s.stats)
    if steps is not None:
        metrics.update(process_metrics(steps))
    metrics["lr"] = models.policy.get_lr()[0]
    metrics["bad_step"] = 1.0 if bad else 0.0
    if bad:
        metrics["bad_reason"] = "; ".join(bad)
    metrics.update({f"time/{k}": v for k, v in times.items()})
    if times.get("generate_async"):  # the share of the next step's generation hidden behind this update
        metrics["time/generate_overlap_frac"] = 1.0 - min(times["generate_wait"] / times["generate_async"], 1.0)
    if times.get("generate_engine") and times.get("generate"):  # generation at the engine's own speed = 1
        metrics["time/generate_engine_frac"] = times["generate_engine"] / times["generate"]
    metrics["time/step"] = time.perf_counter() - t_step
    metrics["throughput/tokens_per_s"] = batch.num_tokens / max(metrics["time/step"], 1e-9)
    return metrics


class RLMethod(Method):
    """The RL step (:func:`train_step`) plugged into the :class:`~mathrl.train.trainer.Trainer`: GRPO, PPO and
    every estimator of the registry. Adds the asynchronous sampler (``rollout.staleness = 1``), the samples
    log and the iterative reference (``algo.ref_update_every``)."""

    def __init__(self) -> None:
        self.sampler: OffPolicySampler | None = None

    def warnings(self, cfg: Config) -> list[str]:
        return rules.warnings(cfg, rl=True)

    def start(self, trainer: Trainer) -> None:
        cfg = trainer.cfg
        if cfg.rollout.staleness:
            self.sampler = OffPolicySampler(cfg, trainer.dist, trainer.models.tokenizer, trainer.rollout,
                                            trainer.problems)
            self.sampler.load_state_dict(trainer.state.ahead)  # the batch a checkpoint saved for its next step

    def step(self, trainer: Trainer) -> dict[str, Any]:
        show, logger = trainer.cfg.logging.show_samples, trainer.logger

        def sample_log(step: int, records: list) -> None:  # rollouts.jsonl, and a console table every N steps
            assert logger is not None
            logger.log_samples(step, records, show=bool(show) and step % show == 0)

        return train_step(trainer.cfg, trainer.dist, trainer.models, trainer.rollout, trainer.problems, trainer.state,
                          sample_log=sample_log if trainer.dist.is_main else None, sampler=self.sampler)

    def after_step(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        cfg, models, state = trainer.cfg, trainer.models, trainer.state
        state.ahead = self.sampler.state_dict() if self.sampler is not None else None
        if iterative_reference(cfg, models) and state.step % cfg.algo.ref_update_every == 0:
            t0 = time.perf_counter()
            reset_reference(models)
            state.ref_step = state.step
            metrics["time/ref_reset"] = time.perf_counter() - t0
        if iterative_reference(cfg, models):
            metrics["ref/step"] = float(state.ref_step)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None


def run(cfg: Config, *, problems=None) -> int:
    """Run RL training as configured (:class:`RLMethod` on the :class:`~mathrl.train.trainer.Trainer`);
    returns the process exit code.

    ``problems`` (a list of :class:`mathrl.data.Problem`) lets a script train on its own task (by default
    they come from ``data.*``, and the held-out split is evaluated); its own reward is a registered term named
    in ``reward.terms`` (see :func:`mathrl.reward.rewards.register_reward`)."""
    return Trainer(cfg, RLMethod(), problems=problems).fit()
