"""The methods of the DeepSeekMath section 5.2 comparison, on the same trainer.

* ``rft`` -- rejection-sampling fine-tuning: sample G responses per problem from the *initial*
  policy once (before any update), keep the correct ones (:func:`mathrl.train.sft.rft_filter`),
  then run ``train.steps`` SFT steps; step ``s`` trains on the kept samples of the problems that
  step ``s`` of the RL methods sees (same data order, same prompts, same G).
* ``online_rft`` -- the same, but step ``s`` samples from the *current* policy.
* ``dpo`` / ``online_dpo`` -- DPO (Rafailov et al. 2023) on pairs of a correct and a wrong sample per problem,
  from the initial policy sampled once, or from the current policy every step; the initial model is the
  reference (:class:`DPOMethod`, :mod:`mathrl.train.dpo`).
* ``grpo`` / ``ppo`` -- the RL step, :class:`mathrl.train.loop.RLMethod`.

They are registered here, in :data:`mathrl.registry.ABLATION_METHODS` (name -> ``make(rft_opts)``, the
trainer's :class:`~mathrl.train.trainer.Method`; metadata ``presets``: the config overrides the method implies,
applied by :mod:`mathrl.ablate.study`; ``sft``: it trains on sampled responses without the RL loop). All run on
one :class:`~mathrl.train.trainer.Trainer` (start-up, models, resume, the memory fit, checkpoints by steps and by
minutes, the stop with a save on NaN, ``metrics.jsonl`` and the checkpoint layout) and share steps 1-3 of the
RL step, :func:`~mathrl.train.sampling.sample_and_grade` (the data order, prompts, sampling seeds and the
verifier), so only the update rule differs. RFT's update
(:class:`RFTMethod`) is one SFT step (:func:`mathrl.train.sft.sft_train_step`) with the configured
learning rate and no KL term; the offline variants keep their samples of the initial model as
:class:`PooledMethod` says.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mathrl.config import Config, rules
from mathrl.data.splits import load_training_problems
from mathrl.dist.collectives import device
from mathrl import progress
from mathrl.prm.iterative import ProcessRLMethod
from mathrl.registry import ABLATION_METHODS
from mathrl.reward.rewards import check_reward_terms
from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import RLMethod
from mathrl.train.models import generation_weights, sync_weights
from mathrl.train.rows import ForwardBatch
from mathrl.train.sampling import sample_and_grade
from mathrl.train import dpo
from mathrl.train.sft import rft_filter, sft_train_step
from mathrl.train.trainer import Method, Trainer

__all__ = ["DPOMethod", "PooledMethod", "RFTMethod", "Task", "run_method", "sample_and_filter"]


@dataclass
class Task:
    """A custom task for a study (scripts and tests): problems and, optionally, how to score them.

    ``reward_terms`` replaces the config's ``reward.terms`` in training (a mapping name ->
    ``{"weight": w, **params}`` of registered terms; a custom task registers its own with
    ``register_reward(name, needs_grades=False)``, and a response counts as correct for RFT when its reward
    is > 0); ``grader(responses, golds, truncated) -> list[Grade]`` replaces the verifier in evaluation.
    ``None`` = the config's data, reward and verifier.
    """

    train_problems: list | None = None
    eval_problems: list | None = None
    eval_name: str = "heldout"
    reward_terms: Mapping[str, Mapping | None] | None = None
    grader: Callable | None = None


def sample_and_filter(cfg: Config, dist, models, rollout, problems: list, step: int, *, dedup: bool = True,
                      max_per_problem: int | None = None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Sample G responses for the problems of ``step`` (this rank's share), grade, keep the correct ones.

    The problems, prompts and sampling seed are exactly those of step ``step`` of
    :func:`mathrl.train.loop.train_step`. Returns the kept rows' tensors (``prompt_ids``,
    ``prompt_mask``, ``response_ids``, ``response_mask``) and step statistics.
    """

    with generation_weights(rollout, models.policy):  # ZeRO-3 + hf engine: gathered on every rank for the phase
        s = sample_and_grade(cfg, dist, models.tokenizer, rollout, problems, step)
    batch, correct, truncated, batch_problems = s.batch, s.correct, s.truncated, s.problems
    kept = rft_filter(batch.group_index.tolist(), batch.response_text, correct, dedup=dedup,
                      max_per_problem=max_per_problem)
    rows = torch.tensor(kept, dtype=torch.long)
    data = {"prompt_ids": batch.prompt_ids[rows], "prompt_mask": batch.prompt_mask[rows],
            "response_ids": batch.response_ids[rows], "response_mask": batch.response_mask[rows]}
    mask = batch.response_mask.bool()
    lengths = mask.sum(1).float()
    solved = {int(batch.group_index[i]) for i, c in enumerate(correct) if c}
    stats = {
        "reward/accuracy": sum(correct) / len(correct),
        "reward/mean": sum(correct) / len(correct),
        "reward/solved_problems": len(solved) / max(1, len(batch_problems)),
        "rft/kept": float(len(kept)),
        "rft/kept_frac": len(kept) / len(correct),
        "rft/correct_duplicates": float(sum(correct) - len(kept)),
        "response/length_mean": float(lengths.mean()),
        "response/truncated": sum(truncated) / len(truncated),
        "tokens": float(mask.sum()),
        **{f"time/{k}": v for k, v in s.times.items()},
    }
    return data, stats


def _pool_file(out, rank: int, name: str = "rft") -> Path:
    return Path(out) / f"{name}_pool.rank{rank}.safetensors"


def save_pool(path, pool: list[tuple[dict, dict]]) -> None:
    """An offline method's samples of the initial model (one rank's share, one entry per step), so that a
    resumed run trains on the samples of the *initial* model rather than resampling from the partly trained
    one. Written atomically."""
    tensors = {f"{s}.{k}": v.contiguous() for s, (data, _) in enumerate(pool) for k, v in data.items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"stats": json.dumps([st for _, st in pool]), "steps": str(len(pool))})
    os.replace(tmp, path)


def load_pool(path) -> list[tuple[dict, dict]]:
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        stats = json.loads(meta["stats"])
        pool: list[tuple[dict, dict]] = [({}, st) for st in stats]
        for key in fh.keys():
            s, name = key.split(".", 1)
            pool[int(s)][0][name] = fh.get_tensor(key)
    return pool


class PooledMethod(Method):
    """A method that trains step ``s`` on samples of the problems of step ``s`` (the RL methods' data order,
    prompts, G and sampling seeds), from the current policy (``online``) or, offline, from the *initial* policy:
    then :meth:`start` samples every step once, before any update (a ``<name>_sampling`` event in
    ``metrics.jsonl`` with its statistics, and a progress line per step), and keeps the samples in
    ``<name>_pool.rank<R>.safetensors``, which a resumed run reloads. Subclasses give :meth:`sample` (one
    step's tensors and statistics) and :meth:`train` (the update on them)."""

    name = "pool"

    def __init__(self, *, online: bool) -> None:
        self.online = online
        self.pool: list[tuple[dict, dict]] = []

    def sample(self, trainer: Trainer, step: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        raise NotImplementedError

    def train(self, trainer: Trainer, data: dict[str, torch.Tensor]) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self, stats: dict[str, float]) -> str:
        """What a presampled step holds, for the progress line."""
        return f"accuracy {stats['reward/accuracy']:.3f}"

    def start(self, trainer: Trainer) -> None:
        if self.online:
            return
        out, dist, state = trainer.out, trainer.dist, trainer.state
        pool_file = _pool_file(out, dist.rank, self.name)
        if pool_file.is_file() and trainer.resume_from is not None:
            self.pool = load_pool(pool_file)
        elif state.step > 0:
            raise TrainingError(f"{out}: resuming offline {self.name} at step {state.step}, but its samples of the "
                                f"initial model ({pool_file}) are missing; delete {out} to redo the run")
        else:  # sample once, from the initial policy
            t0 = time.perf_counter()
            self.pool = self._presample(trainer)
            assert trainer.logger is not None
            trainer.logger.log(0, {**self.pool_summary(), "time/sampling": time.perf_counter() - t0,
                                   "tokens": sum(st["tokens"] for _, st in self.pool),
                                   "reward/accuracy": sum(st["reward/accuracy"] for _, st in self.pool)
                                   / max(1, len(self.pool))}, event=f"{self.name}_sampling")
            save_pool(pool_file, self.pool)

    def pool_summary(self) -> dict[str, float]:
        """The ``<name>_sampling`` event's method-specific totals."""
        return {}

    def _presample(self, trainer: Trainer) -> list[tuple[dict, dict]]:
        """The initial policy's samples for every step, with a progress line per step on rank 0: this phase
        takes as long as all the steps' sampling together (10-20 minutes for the CPU study) and the training
        log has no step record yet, so without the line a user would watch a silent process."""
        steps, dist = trainer.cfg.train.steps, trainer.dist
        pool: list[tuple[dict, dict]] = []
        t0 = time.perf_counter()
        with progress.Progress(steps, f"{self.name}: sampling the initial policy", unit="step",
                               enabled=None if dist.is_main else False) as bar:
            for s in range(steps):
                data, stats = self.sample(trainer, s)
                pool.append((data, stats))
                bar.update(1)
                if dist.is_main and not bar.enabled:  # the bar shows the same on a terminal
                    print(f"{self.name}: sampled the initial policy for step {s + 1}/{steps}: {self.describe(stats)} "
                          f"({time.perf_counter() - t0:.0f} s{', rank 0' if dist.world_size > 1 else ''})",
                          flush=True)
        return pool

    def step(self, trainer: Trainer) -> dict[str, Any]:
        state = trainer.state
        t_step = time.perf_counter()
        if self.online:
            data, stats = self.sample(trainer, state.step)
        else:
            data, stats = self.pool[state.step]
            self.pool[state.step] = ({}, stats)  # free the tensors
        t0 = time.perf_counter()
        update = self.train(trainer, data)
        stats = dict(stats)
        stats["time/train"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sync_weights(trainer.rollout, trainer.models.policy)
        stats["time/sync"] = time.perf_counter() - t0
        stats.update(update)  # with bad_reason when the update was skipped for NaN/inf
        stats["lr"] = trainer.models.policy.get_lr()[0]
        if not self.online:
            for k in ("time/generate", "time/grade", "tokens"):
                if k in stats:
                    stats[f"presampled/{k}"] = stats.pop(k)
            stats["tokens"] = 0.0  # counted once, in the sampling event
        stats["time/step"] = time.perf_counter() - t_step
        return stats


class RFTMethod(PooledMethod):
    """Offline (``online=False``) or online RFT as a step of the :class:`~mathrl.train.trainer.Trainer`, which
    gives it what it gives RL: resume, the memory fit, checkpoints by steps and by minutes, the stop with a
    save after ``train.max_bad_steps`` NaN steps, ``metrics.jsonl`` and the checkpoint layout (so the
    evaluation of every method reads the same files). The offline samples are kept as
    :class:`PooledMethod` says (``rft_pool.rank<R>.safetensors``, an ``rft_sampling`` event)."""

    name = "rft"

    def __init__(self, *, online: bool, dedup: bool = True, max_per_problem: int | None = None) -> None:
        super().__init__(online=online)
        self.opts: dict[str, Any] = dict(dedup=dedup, max_per_problem=max_per_problem)

    def sample(self, trainer: Trainer, step: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        return sample_and_filter(trainer.cfg, trainer.dist, trainer.models, trainer.rollout, trainer.problems, step,
                                 **self.opts)

    def describe(self, stats: dict[str, float]) -> str:
        return f"kept {stats['rft/kept']:.0f} correct responses, accuracy {stats['reward/accuracy']:.3f}"

    def pool_summary(self) -> dict[str, float]:
        return {"rft/kept_total": sum(st["rft/kept"] for _, st in self.pool)}

    def train(self, trainer: Trainer, data: dict[str, torch.Tensor]) -> dict[str, Any]:
        tokens = ForwardBatch(data["prompt_ids"], data["prompt_mask"], data["response_ids"],
                              data["response_mask"].bool())
        return sft_train_step(trainer.models.policy, tokens, torch.arange(tokens.response_ids.shape[0]),
                              token_budget=trainer.cfg.train.micro_batch_tokens, device=device(),
                              world_size=trainer.dist.world_size)


class DPOMethod(PooledMethod):
    """DPO (Rafailov et al. 2023) on verifier-graded pairs, as DeepSeekMath's section 5.2.1 compares it: for each
    problem of step ``s``, the k-th correct sample is preferred to the k-th wrong one (``algo.dpo_pairs`` per
    problem), the reference is the initial model and ``algo.dpo_beta`` its weight. Offline (``online=False``):
    the pairs and their reference logprobs come from the initial policy, sampled once (``dpo_pool.rank<R>``);
    online: from the current policy every step, the reference model loaded beside it. The update is one
    optimizer step of :func:`mathrl.train.dpo.dpo_train_step`."""

    name = "dpo"

    def needs_reference(self, cfg: Config) -> bool:
        return self.online  # offline, the initial policy computes its reference logprobs when it samples

    def sample(self, trainer: Trainer, step: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        cfg, models = trainer.cfg, trainer.models
        with generation_weights(trainer.rollout, models.policy):
            s = sample_and_grade(cfg, trainer.dist, models.tokenizer, trainer.rollout, trainer.problems, step)
        rows = dpo.pair_rows(s.batch.group_index.tolist(), s.correct, per_group=cfg.algo.dpo_pairs)
        data = dpo.pair_tokens(s.batch, rows)
        data["correct"] = torch.tensor([bool(s.correct[r]) for r in rows], dtype=torch.bool)  # the verifier's verdicts
        filler = dpo.pair_tokens(s.batch, [0])
        data.update({f"filler_{k}": v for k, v in filler.items()})
        reference = models.ref if self.online else models.policy.module  # offline: the policy is the initial model
        # every rank runs the forwards (agreed counts, ZeRO-3); a rank without pairs runs its filler row
        ref = dpo.reference_logprobs(reference, dpo.as_forward_batch(data if rows else filler),
                                     token_budget=cfg.train.micro_batch_tokens, device=device())
        data["ref_logps"] = ref if rows else ref[:0]
        mask = s.batch.response_mask.bool()
        correct = s.correct
        stats = {"reward/accuracy": sum(correct) / len(correct), "reward/mean": float(s.scores.mean()),
                 "dpo/pairs_sampled": len(rows) / 2, "response/length_mean": float(mask.sum(1).float().mean()),
                 "response/truncated": sum(s.truncated) / len(s.truncated), "tokens": float(mask.sum()),
                 **{f"time/{k}": v for k, v in s.times.items()}}
        return data, stats

    def describe(self, stats: dict[str, float]) -> str:
        return f"{stats['dpo/pairs_sampled']:.0f} pairs, accuracy {stats['reward/accuracy']:.3f}"

    def pool_summary(self) -> dict[str, float]:
        return {"dpo/pairs_total": sum(st["dpo/pairs_sampled"] for _, st in self.pool)}

    def train(self, trainer: Trainer, data: dict[str, torch.Tensor]) -> dict[str, Any]:
        a = trainer.cfg.algo
        filler = dpo.as_forward_batch({k: data[f"filler_{k}"] for k in
                                       ("prompt_ids", "prompt_mask", "response_ids", "response_mask")})
        return dpo.dpo_train_step(trainer.models.policy, dpo.as_forward_batch(data), data["ref_logps"],
                                  beta=a.dpo_beta, label_smoothing=a.dpo_label_smoothing,
                                  token_budget=trainer.cfg.train.micro_batch_tokens, device=device(),
                                  world_size=trainer.dist.world_size, filler=filler)


def _with_reward_terms(cfg: Config, terms: Mapping[str, Mapping | None]) -> Config:
    """A copy of ``cfg`` with ``reward.terms = terms`` (checked against the registry like a config's)."""

    check_reward_terms(terms)
    return replace(cfg, reward=replace(cfg.reward, terms={k: dict(v or {}) for k, v in terms.items()}))


@ABLATION_METHODS.register("rft", presets={"algo.kl_coef": 0.0}, sft=True,
                           doc="sample once from the initial policy, keep the correct responses, SFT on them")
def _make_rft(rft_opts: Mapping[str, Any]) -> Method:
    return RFTMethod(online=False, dedup=rft_opts.get("dedup", True), max_per_problem=rft_opts.get("max_per_problem"))


@ABLATION_METHODS.register("online_rft", presets={"algo.kl_coef": 0.0}, sft=True,
                           doc="sample from the current policy every step, keep the correct responses, one SFT step")
def _make_online_rft(rft_opts: Mapping[str, Any]) -> Method:
    return RFTMethod(online=True, dedup=rft_opts.get("dedup", True), max_per_problem=rft_opts.get("max_per_problem"))


@ABLATION_METHODS.register("dpo", presets={"algo.kl_coef": 0.0}, sft=True,
                           doc="DPO on pairs (a correct and a wrong sample per problem) of the initial policy, sampled "
                           "once; the initial model is the reference (algo.dpo_beta, algo.dpo_pairs)")
def _make_dpo(rft_opts: Mapping[str, Any]) -> Method:
    return DPOMethod(online=False)


@ABLATION_METHODS.register("online_dpo", presets={"algo.kl_coef": 0.0}, sft=True,
                           doc="DPO on pairs of the current policy's samples every step; the initial model is the "
                           "reference")
def _make_online_dpo(rft_opts: Mapping[str, Any]) -> Method:
    return DPOMethod(online=True)


def _make_rl(rft_opts: Mapping[str, Any]) -> Method:
    return RLMethod()


ABLATION_METHODS.register("grpo", _make_rl, presets={"algo.name": "grpo"}, sft=False,
                          doc="the RL step with group-relative advantages (algo.name=grpo)")


def _make_process_rl(rft_opts: Mapping[str, Any]) -> Method:
    return ProcessRLMethod()


ABLATION_METHODS.register("grpo_ps", _make_process_rl, presets={"algo.name": "grpo", "algo.advantage": "grpo_ps"},
                          sft=False, doc="GRPO with process supervision: the PRM of model.prm scores every step "
                          "(a `mathrl prm train` folder); with algo.prm_update_every=N and algo.ref_update_every=N it "
                          "is iterative RL, the PRM retrained on the policy's new samples with a 10% replay")
ABLATION_METHODS.register("ppo", _make_rl, presets={"algo.name": "ppo"}, sft=False,
                          doc="the RL step with a critic and GAE (algo.name=ppo)")


def run_method(method: str, cfg: Config, *, rft_opts: dict | None = None, task=None) -> int:
    """Train ``cfg`` with ``method`` (a name registered in :data:`~mathrl.registry.ABLATION_METHODS`: rft,
    online_rft, dpo, online_dpo, grpo, grpo_ps, ppo) into ``cfg.train.output_dir``; an unknown name raises
    :class:`~mathrl.registry.UnknownNameError` (a ``ValueError``) naming the allowed ones.

    The training problems are passed to the :class:`~mathrl.train.trainer.Trainer` explicitly, so it
    skips its own before/after evaluation: the study evaluates every method the same way afterwards.
    """

    make = ABLATION_METHODS.get(method)
    task = task or Task()
    if task.reward_terms is not None:
        cfg = _with_reward_terms(cfg, task.reward_terms)
    problems = task.train_problems if task.train_problems is not None else load_training_problems(cfg)
    rules.refuse_for_method(cfg, method, sft=ABLATION_METHODS.meta(method)["sft"])
    return Trainer(cfg, make(rft_opts or {}), problems=problems).fit()
