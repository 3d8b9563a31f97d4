"""The four methods of the DeepSeekMath section 5.2 comparison, on the same trainer.

* ``rft`` -- rejection-sampling fine-tuning: sample G responses per problem from the *initial*
  policy once (before any update), keep the correct ones (:func:`mathrl.train.sft.rft_filter`),
  then run ``train.steps`` SFT steps; step ``s`` trains on the kept samples of the problems that
  step ``s`` of the RL methods sees (same data order, same prompts, same G).
* ``online_rft`` -- the same, but step ``s`` samples from the *current* policy.
* ``grpo`` / ``ppo`` -- the RL step, :class:`mathrl.train.loop.RLMethod`.

The four are registered here, in :data:`mathrl.registry.ABLATION_METHODS` (name -> ``make(rft_opts)``, the
trainer's :class:`~mathrl.train.trainer.Method`; metadata ``presets``: the config overrides the method implies,
applied by :mod:`mathrl.ablate.study`; ``sft``: it fine-tunes on filtered samples). All four run on one
:class:`~mathrl.train.trainer.Trainer` (start-up, models, resume, the memory fit, checkpoints by steps and by
minutes, the stop with a save on NaN, ``metrics.jsonl`` and the checkpoint layout) and share steps 1-3 of the
RL step, :func:`~mathrl.train.sampling.sample_and_grade` (the data order, prompts, sampling seeds and the
verifier), so only the update rule differs. RFT's update
(:class:`RFTMethod`) is one SFT step (:func:`mathrl.train.sft.sft_train_step`) with the configured
learning rate and no KL term.
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
from mathrl.registry import ABLATION_METHODS
from mathrl.reward.rewards import check_reward_terms
from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import RLMethod
from mathrl.train.models import generation_weights, sync_weights
from mathrl.train.rows import ForwardBatch
from mathrl.train.sampling import sample_and_grade
from mathrl.train.sft import rft_filter, sft_train_step
from mathrl.train.trainer import Method, Trainer

__all__ = ["RFTMethod", "Task", "run_method", "sample_and_filter"]


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


def _pool_file(out, rank: int) -> Path:
    return Path(out) / f"rft_pool.rank{rank}.safetensors"


def save_pool(path, pool: list[tuple[dict, dict]]) -> None:
    """Offline RFT's kept samples (one rank's share), so that a resumed run trains on the samples of
    the *initial* model rather than resampling from the partly trained one. Written atomically."""
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


def _presample(cfg: Config, dist, models, rollout, problems: list, opts: dict) -> list[tuple[dict, dict]]:
    """Offline RFT's samples of the initial policy for every step, with a progress line per step on rank 0.

    This phase takes as long as all the steps' sampling together (10-20 minutes for the CPU study) and the
    training log has no step record yet, so without the line a user would watch a silent process.
    """

    steps = cfg.train.steps
    pool: list[tuple[dict, dict]] = []
    t0 = time.perf_counter()
    with progress.Progress(steps, "rft: sampling the initial policy", unit="step",
                  enabled=None if dist.is_main else False) as bar:
        for s in range(steps):
            data, stats = sample_and_filter(cfg, dist, models, rollout, problems, s, **opts)
            pool.append((data, stats))
            bar.update(1)
            if dist.is_main and not bar.enabled:  # the bar shows the same on a terminal
                print(f"rft: sampled the initial policy for step {s + 1}/{steps}: kept {stats['rft/kept']:.0f} "
                      f"correct responses, accuracy {stats['reward/accuracy']:.3f} "
                      f"({time.perf_counter() - t0:.0f} s{', rank 0' if dist.world_size > 1 else ''})", flush=True)
    return pool


class RFTMethod(Method):
    """Offline (``online=False``) or online RFT as a step of the :class:`~mathrl.train.trainer.Trainer`, which
    gives it what it gives RL: resume, the memory fit, checkpoints by steps and by minutes, the stop with a
    save after ``train.max_bad_steps`` NaN steps, ``metrics.jsonl`` and the checkpoint layout (so the
    evaluation of every method reads the same files).

    Offline RFT samples the initial policy for every step in :meth:`start` (an ``rft_sampling`` event in
    ``metrics.jsonl`` with the sampling's statistics) and keeps the samples in
    ``rft_pool.rank<R>.safetensors``, which a resumed run reloads."""

    def __init__(self, *, online: bool, dedup: bool = True, max_per_problem: int | None = None) -> None:
        self.online = online
        self.opts: dict[str, Any] = dict(dedup=dedup, max_per_problem=max_per_problem)
        self.pool: list[tuple[dict, dict]] = []

    def start(self, trainer: Trainer) -> None:
        if self.online:
            return
        out, dist, state = trainer.out, trainer.dist, trainer.state
        pool_file = _pool_file(out, dist.rank)
        if pool_file.is_file() and trainer.resume_from is not None:
            self.pool = load_pool(pool_file)
        elif state.step > 0:
            raise TrainingError(f"{out}: resuming offline RFT at step {state.step}, but its samples of the initial "
                                f"model ({pool_file}) are missing; delete {out} to redo the run")
        else:  # sample once, from the initial policy
            t0 = time.perf_counter()
            self.pool = _presample(trainer.cfg, dist, trainer.models, trainer.rollout, trainer.problems, self.opts)
            n_kept = sum(st["rft/kept"] for _, st in self.pool)
            n_all = sum(st["tokens"] for _, st in self.pool)
            assert trainer.logger is not None
            trainer.logger.log(0, {"rft/kept_total": n_kept, "tokens": n_all,
                                   "time/sampling": time.perf_counter() - t0,
                                   "reward/accuracy": sum(st["reward/accuracy"] for _, st in self.pool)
                                   / max(1, len(self.pool))}, event="rft_sampling")
            save_pool(pool_file, self.pool)

    def step(self, trainer: Trainer) -> dict[str, Any]:

        cfg, dist, models, state = trainer.cfg, trainer.dist, trainer.models, trainer.state
        t_step = time.perf_counter()
        if self.online:
            data, stats = sample_and_filter(cfg, dist, models, trainer.rollout, trainer.problems, state.step,
                                            **self.opts)
        else:
            data, stats = self.pool[state.step]
            self.pool[state.step] = ({}, stats)  # free the tensors
        t0 = time.perf_counter()
        tokens = ForwardBatch(data["prompt_ids"], data["prompt_mask"], data["response_ids"],
                              data["response_mask"].bool())
        sft = sft_train_step(models.policy, tokens, torch.arange(tokens.response_ids.shape[0]),
                             token_budget=cfg.train.micro_batch_tokens, device=device(), world_size=dist.world_size)
        stats = dict(stats)
        stats["time/train"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sync_weights(trainer.rollout, models.policy)
        stats["time/sync"] = time.perf_counter() - t0
        stats.update(sft)  # with bad_reason when the update was skipped for NaN/inf
        stats["lr"] = models.policy.get_lr()[0]
        if not self.online:
            for k in ("time/generate", "time/grade", "tokens"):
                stats[f"presampled/{k}"] = stats.pop(k)
            stats["tokens"] = 0.0  # counted once, in the rft_sampling event
        stats["time/step"] = time.perf_counter() - t_step
        return stats


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


def _make_rl(rft_opts: Mapping[str, Any]) -> Method:
    return RLMethod()


ABLATION_METHODS.register("grpo", _make_rl, presets={"algo.name": "grpo"}, sft=False,
                          doc="the RL step with group-relative advantages (algo.name=grpo)")
ABLATION_METHODS.register("ppo", _make_rl, presets={"algo.name": "ppo"}, sft=False,
                          doc="the RL step with a critic and GAE (algo.name=ppo)")


def run_method(method: str, cfg: Config, *, rft_opts: dict | None = None, task=None) -> int:
    """Train ``cfg`` with ``method`` (a name registered in :data:`~mathrl.registry.ABLATION_METHODS`: rft,
    online_rft, grpo, ppo) into ``cfg.train.output_dir``; an unknown name raises
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
