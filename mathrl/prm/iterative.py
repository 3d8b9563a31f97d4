"""Iterative RL with a process reward model, DeepSeekMath's Algorithm 1 (sec. 4.2) on GRPO+PS: every
``algo.prm_update_every`` steps, the current policy samples the problems of the step just trained, their steps
are labelled automatically (:func:`mathrl.prm.labels.label_steps`, ``algo.prm_label_k`` completions per step,
graded by the verifier), and the PRM continues training on them together with a replay of ``algo.prm_replay``
(10%) of the earlier labelled responses: the PRM's own training data (``algo.prm_history``; by default the
``labels.jsonl`` that ``mathrl prm train`` keeps beside it) and the earlier rounds' responses, as the paper's
"10% of historical data"; the reference model is reset to the current policy by ``algo.ref_update_every`` (the
ablation row sets both to N).

The PRM is the run's ``model.prm`` (loaded frozen by the trainer); a round makes it trainable, runs
``algo.prm_epochs`` passes of :func:`mathrl.prm.model.prm_train_step` (plain data parallel over the ranks, ZeRO
stage 0: a stage 1/2 optimizer leaves gradient hooks on the parameters that would outlive the round; a fresh
optimizer each round) and freezes it again. Kept in the run folder for a resume and for the user:
``prm_pool.rank<R>.jsonl`` (every labelled response of this rank, in ``mathrl prm label``'s format, with the round's
step) and ``prm/step_<S>/`` (the PRM after the round of step S). A resumed run reloads the pool up to its step and
the newest PRM of a round at or before it, so it continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

from mathrl.dist.collectives import all_ranks_ok, sum_over_ranks
from mathrl.dist.engines import build_engine, copy_weights
from mathrl.models.value_head import ValueModel
from mathrl.prm.labels import label_rollouts
from mathrl.prm.cli import read_records
from mathrl.prm.model import fit_prm
from mathrl.prm.pipeline import PRM_LABELS, write_labels
from mathrl.reward.options import GradeOptions
from mathrl.rollout import colocate
from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import RLMethod
from mathrl.train.models import generation_weights
from mathrl.train.sampling import rollout_sampling, sample_and_grade, sampling_seed
from mathrl.train.trainer import Trainer

__all__ = ["ProcessRLMethod", "replay_sample", "run"]

PRM_SEED_ROUND = 10_000
"""The sampling round of a PRM round's samples (:func:`~mathrl.train.sampling.sampling_seed`), so they are not
the training step's own samples."""


def replay_sample(old: list[dict], frac: float, rng: random.Random) -> list[dict]:
    """``round(frac * len(old))`` of the earlier labelled responses, drawn without replacement."""
    return rng.sample(old, min(len(old), round(frac * len(old))))


class ProcessRLMethod(RLMethod):
    """GRPO+PS (:class:`~mathrl.train.loop.RLMethod` with ``algo.advantage=grpo_ps``) whose PRM is retrained every
    ``algo.prm_update_every`` steps on the current policy's labelled samples (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: list[dict] = []  # this run's labelled responses (this rank's), round by round
        self.history: list[dict] = []  # this rank's share of the PRM's training data before the run

    def _history(self, trainer: Trainer) -> list[dict]:
        """This rank's share (every world_size-th record) of ``algo.prm_history``, read and checked once."""
        cfg, dist = trainer.cfg, trainer.dist
        setting = cfg.algo.prm_history
        if setting == "none":
            return []
        path = Path(cfg.model.prm) / PRM_LABELS if setting == "auto" else Path(setting)
        if not path.is_file():
            if setting != "auto":
                raise TrainingError(f"algo.prm_history = {setting!r}: no such file; allowed: the `mathrl prm label` "
                                    "JSONL file the PRM was trained on, auto (<model.prm>/labels.jsonl) or none")
            if dist.is_main:
                print(f"mathrl: warning: algo.prm_history = auto and {path} does not exist: the PRM's training data "
                      f"is unknown, so the first PRM round replays nothing (DeepSeekMath's Algorithm 1 replays "
                      f"{100 * cfg.algo.prm_replay:g}% of the historical data); set algo.prm_history=<the labels "
                      "the PRM was trained on> (`mathrl prm train` keeps them as labels.jsonl), or "
                      "algo.prm_history=none to replay only this run's rounds", file=sys.stderr, flush=True)
            return []
        return read_records(path)[dist.rank::dist.world_size]

    def _pool_file(self, trainer: Trainer) -> Path:
        return trainer.out / f"prm_pool.rank{trainer.dist.rank}.jsonl"

    def start(self, trainer: Trainer) -> None:
        super().start(trainer)
        cfg, step = trainer.cfg, trainer.state.step
        if not cfg.algo.prm_update_every:
            return
        self.history = self._history(trainer)
        pool_file = self._pool_file(trainer)
        if pool_file.is_file() and step > 0:
            # a later round may have run after the checkpoint
            self.pool = [r for r in read_records(pool_file) if r["round_step"] <= step]
        rounds = sorted(int(p.name.split("_")[1]) for p in (trainer.out / "prm").glob("step_*")
                        if (p / "backbone.safetensors").is_file() and int(p.name.split("_")[1]) <= step)
        if rounds:
            saved = ValueModel.from_pretrained(trainer.out / "prm" / f"step_{rounds[-1]:06d}")
            copy_weights(trainer.models.prm, saved.named_parameters())
        elif step >= cfg.algo.prm_update_every:
            raise TrainingError(f"{trainer.out}: resuming at step {step}, after a PRM round, but the retrained PRM "
                                f"({trainer.out / 'prm'}/step_*) is missing; delete {trainer.out} to redo the run")

    def after_step(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        super().after_step(trainer, metrics)
        n = trainer.cfg.algo.prm_update_every
        if n and trainer.state.step % n == 0:
            metrics.update(self.update_prm(trainer))

    def update_prm(self, trainer: Trainer) -> dict[str, float]:
        """One round: sample, label, train the PRM on the new records and the replay, save it."""
        cfg, dist, models, step = trainer.cfg, trainer.dist, trainer.models, trainer.state.step
        a, t0 = cfg.algo, time.perf_counter()
        tok = models.tokenizer
        with generation_weights(trainer.rollout, models.policy):
            s = sample_and_grade(cfg, dist, tok, trainer.rollout, trainer.problems, step - 1,
                                 seed=sampling_seed(cfg, step, dist.rank, PRM_SEED_ROUND))
            colocate.before_generate(trainer.rollout)  # rollout.sleep_between_steps: awake for the completions
            ids = [p.id for p in s.problems for _ in range(cfg.rollout.n)]
            answers = [g.extracted for g in s.grades] if s.grades is not None else [None] * len(ids)
            new = label_rollouts(trainer.rollout, tok, s.batch, ids, s.golds, s.correct, answers, k=a.prm_label_k,
                                 sampling=rollout_sampling(cfg, sampling_seed(cfg, step, dist.rank,
                                                                              PRM_SEED_ROUND + 1)),
                                 options=GradeOptions.from_config(cfg), model=str(cfg.model.prm), round_step=step)
            colocate.after_generate(trainer.rollout)
        rng = random.Random(sampling_seed(cfg, step, dist.rank, PRM_SEED_ROUND + 2))
        replay = replay_sample(self.history + self.pool, a.prm_replay, rng)
        stats = self._train(trainer, new + replay, rng)
        self.pool += new
        write_labels(self._pool_file(trainer), self.pool)  # the whole file: a resume may have cut it
        if dist.is_main:
            folder = trainer.out / "prm" / f"step_{step:06d}"
            getattr(models.prm, "module", models.prm).save_pretrained(folder)
            tok.save_pretrained(str(folder))
        all_ranks_ok(True)  # every rank waits for the saved PRM
        counts = sum_over_ranks([len(new), len(replay), sum(len(r["ends"]) for r in new)])
        return {**stats, "prm/records_new": counts[0], "prm/records_replay": counts[1], "prm/steps_labelled": counts[2],
                "time/prm_update": time.perf_counter() - t0}

    def _train(self, trainer: Trainer, records: list[dict], rng: random.Random) -> dict[str, float]:
        cfg, dist, models = trainer.cfg, trainer.dist, trainer.models
        a = cfg.algo
        module = getattr(models.prm, "module", models.prm)
        module.requires_grad_(True)
        module.train()
        batches = -(-len(records) // a.prm_batch)
        engine = build_engine(module, lr=a.prm_lr, weight_decay=0.0, schedule="constant", warmup=0,
                              total_steps=max(1, a.prm_epochs * batches), stage=0,
                              offload="none", grad_clip=cfg.train.max_grad_norm, dtype=next(module.parameters()).dtype,
                              world_size=dist.world_size)
        try:
            return fit_prm(engine, records, epochs=a.prm_epochs, batch=a.prm_batch, target="soft",
                           tokenizer=models.tokenizer, token_budget=cfg.train.micro_batch_tokens,
                           device=next(module.parameters()).device, world_size=dist.world_size, rng=rng)
        finally:
            module.requires_grad_(False)
            module.eval()
            del engine


def run(cfg, *, problems=None) -> int:
    """``mathrl train`` with ``algo.prm_update_every > 0``: :class:`ProcessRLMethod` on the trainer."""
    return Trainer(cfg, ProcessRLMethod(), problems=problems).fit()
