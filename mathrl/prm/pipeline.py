"""The two halves of making a process reward model, as library functions: :func:`label_problems` (a policy's
samples of some problems, every step labelled automatically) and :func:`train_prm` (a PRM folder fitted to
labelled records). ``mathrl prm label`` / ``mathrl prm train`` and the study's GRPO+PS rows call them."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from mathrl.algo.process import constant_loss
from mathrl.config import Config
from mathrl.data import render_prompt
from mathrl.dist.collectives import DistInfo
from mathrl.dist.engines import build_engine
from mathrl.eval.records import write_records
from mathrl.models import load_tokenizer, resolve_model_path
from mathrl.models.value_head import ValueModel
from mathrl.prm.labels import label_rollouts
from mathrl.prm.model import fit_prm
from mathrl.reward import grade_batch
from mathrl.reward.options import GradeOptions
from mathrl.rollout.factory import make_engine
from mathrl.train.sampling import rollout_sampling

__all__ = ["PRM_LABELS", "label_problem_sets", "label_problems", "train_prm", "write_labels"]


def label_problems(cfg: Config, problems: list, *, k: int) -> list[dict]:
    """``rollout.n`` samples of each problem by ``model.name`` with the run's sampling (``rollout.*`` and the
    template's stops, seed ``train.seed``), graded by the verifier with ``reward.*``; every step of each non-empty
    response labelled from ``k`` completions of its prefix (seed ``train.seed + 1``). One record per response, in
    ``mathrl prm label``'s format."""
    return label_problem_sets(cfg, [problems], k=k)[0]


def label_problem_sets(cfg: Config, sets: list[list], *, k: int) -> list[list[dict]]:
    """:func:`label_problems` of each list of problems in ``sets``, on one engine (started once): each set is
    sampled and labelled as :func:`label_problems` alone would (the same requests and seeds)."""
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok = load_tokenizer(path)
    n, options = cfg.rollout.n, GradeOptions.from_config(cfg)
    engine = make_engine(cfg.rollout.backend, path, dtype="float32", seed=cfg.train.seed)
    out = []
    try:
        for problems in sets:
            batch = engine.generate([render_prompt(p, tok, cfg.data.template) for p in problems], n,
                                    rollout_sampling(cfg, cfg.train.seed))
            golds = [p.gold for p in problems for _ in range(n)]
            grades = grade_batch(batch.response_text, golds, options, truncated=batch.truncated)
            out.append(label_rollouts(engine, tok, batch, [p.id for p in problems for _ in range(n)], golds,
                                      [g.correct for g in grades], [g.extracted for g in grades], k=k,
                                      sampling=rollout_sampling(cfg, cfg.train.seed + 1), options=options,
                                      model=str(path)))
    finally:
        engine.close()
    return out


def train_prm(records: list[dict], model: str, out: str | Path, *, dist: DistInfo, epochs: int = 2, lr: float = 1e-5,
              batch: int = 16, target: str = "soft", token_budget: int = 8192, seed: int = 0) -> dict[str, float]:
    """A PRM (:class:`~mathrl.models.value_head.ValueModel` of ``model``: a path, hub id or ``embedded``) fitted to
    ``records`` (:func:`mathrl.prm.model.fit_prm`, ZeRO-1, constant ``lr``) and saved with its tokenizer into
    ``out`` (by rank 0). Returns the last epoch's statistics and ``prm/constant_loss``, the loss of predicting the
    labels' mean at every step (:func:`mathrl.algo.process.constant_loss`); when the last epoch's loss is not below
    it, a warning says the PRM has learned nothing about the steps and which settings to raise (the head starts
    at zero, so a small ``lr`` or few optimizer steps leave every score near one value; README's process
    supervision section gives the case that was measured, recomputed from its kept record)."""
    path = resolve_model_path(model, None)
    tok = load_tokenizer(path)
    torch.manual_seed(seed)
    prm = ValueModel.from_pretrained(path)
    per_epoch = -(-len(records) // batch)
    engine = build_engine(prm, lr=lr, weight_decay=0.0, schedule="constant", warmup=0,
                          total_steps=epochs * per_epoch, stage=1, offload="none", grad_clip=1.0,
                          dtype=torch.float32, world_size=dist.world_size)
    rng = random.Random(seed)
    stats: dict[str, float] = {}
    base = constant_loss([y for r in records for y in r[target]])
    for epoch in range(epochs):
        stats = fit_prm(engine, records, epochs=1, batch=batch, target=target, tokenizer=tok,
                        token_budget=token_budget, device="cpu", world_size=dist.world_size, rng=rng)
        if dist.is_main:
            print(f"mathrl prm train: epoch {epoch + 1}/{epochs}: loss {stats['prm/loss']:.4f} "
                  f"(predicting the label mean at every step: {base:.4f})", flush=True)
    stats["prm/constant_loss"] = base
    if dist.is_main and not stats["prm/loss"] < base:
        print(f"mathrl prm train: warning: the last epoch's loss {stats['prm/loss']:.4f} is not below "
              f"{base:.4f}, the loss of predicting the {target} labels' mean at every step: the PRM has not learned "
              f"to tell steps apart ({epochs} epoch(s) of "
              f"{stats.get('prm/optimizer_steps', 0):.0f} optimizer steps at lr {lr:g}); raise --lr or "
              "--epochs (a study: study.prm.lr, study.prm.epochs), or label more responses", file=sys.stderr,
              flush=True)
    if dist.is_main:
        engine.module.save_pretrained(out)
        tok.save_pretrained(str(out))
        write_labels(Path(out) / PRM_LABELS, records)
    return stats


PRM_LABELS = "labels.jsonl"
"""The labelled responses a PRM was trained on, kept beside it by :func:`train_prm`: the history an iterative run
replays (``algo.prm_history``, DeepSeekMath's Algorithm 1)."""


def write_labels(path: Path, records: list[dict]) -> None:
    """``records`` as a ``mathrl prm label`` JSONL file, written atomically (an iterative run rewrites its pool file
    every round: a kill mid-write must not cut it)."""
    write_records(path, records)
