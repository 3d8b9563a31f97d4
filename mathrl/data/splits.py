"""Which problems a run trains on and which it is evaluated on (the data side of a training config).

* :func:`load_training_problems` -- the training problems of ``data.*``;
* :func:`heldout_problems` -- the held-out set the trainer evaluates before and after training (and
  ``mathrl eval --config``), disjoint from the training stream;
* :func:`step_indices` -- which training problems step ``s`` uses (a pure function of the seed and the
  step, so a resumed run sees the same data as an uninterrupted one).
"""

from __future__ import annotations

import functools

from pathlib import Path
from typing import Any

import torch

from mathrl.config import Config, ConfigError
from mathrl.data import load_problems
from mathrl.data.loader import get_source, local_copy
from mathrl.data.overlap import exclude_overlap, load_exclusion_sets


def generator_options(cfg: Config, source: str, n: int | None, *, seed: int | None = None) -> dict[str, Any]:
    """The options a generated source (``SourceSpec.generate``) is given from a training config:
    ``n`` problems, the config's difficulty level and ``seed`` (None: ``train.seed``) -- those of them the
    source declares in ``SourceSpec.options``. A file or hub source gets none."""

    spec = get_source(source)
    if not spec.is_generated:
        return {}
    offered = {"n": n, "level": cfg.data.synthetic_level, "seed": cfg.train.seed if seed is None else seed}
    return {k: v for k, v in offered.items() if k in spec.options and v is not None}


def _generated(source: str) -> bool:

    return get_source(source).is_generated


def load_training_problems(cfg: Config):

    d = cfg.data
    if _generated(d.source):  # a generator's training stream is its ``train`` split
        problems = load_problems(d.source, d.path, "train", limit=d.limit,
                                 **generator_options(cfg, d.source, d.synthetic_size))
    else:
        problems = load_problems(d.source, d.path, d.split, limit=d.limit, skip_bad_rows=d.skip_bad_rows,
                                 fields=d.fields)
    if not problems:
        raise ConfigError(f"data.source = {d.source!r}: no problems loaded")
    if d.exclude_overlap_with:
        problems = _without_overlap(problems, d.exclude_overlap_with, d.overlap_threshold)
    return problems


def _without_overlap(problems: list, specs: list[str], threshold: float) -> list:
    """The training problems that are not near-copies of a problem of the sets in ``specs``."""
    import logging


    for name, reference in load_exclusion_sets(specs):
        before = len(problems)
        problems, dropped = exclude_overlap(problems, reference, threshold)
        logging.getLogger("mathrl.data").warning(
            "data.exclude_overlap_with: dropped %d of %d training problems similar to %s (Jaccard >= %g)%s",
            len(dropped), before, name, threshold,
            f", e.g. {dropped[0][0].id} ~ {dropped[0][1].id}" if dropped else "")
    if not problems:
        raise ConfigError(f"data.exclude_overlap_with = {specs}: every training problem overlaps; nothing is left "
                          f"to train on (raise data.overlap_threshold, now {threshold})")
    return problems


def generated_heldout_source(cfg) -> str | None:
    """The generated source whose ``test`` draw is the held-out set of ``cfg`` (``data.eval_source``, else
    ``data.source``, when it is a generator, e.g. ``synthetic``), else None (a file or hub set)."""
    d = cfg.data
    source = d.eval_source if d.eval_source is not None else d.source
    return source if _generated(source) else None


def heldout_problems(cfg) -> tuple[str, list]:
    """The held-out evaluation set of a training config: ``(name, problems)``.

    * ``data.eval_source`` set: that source (``data.eval_path``, else ``$MATHRL_DATA/<source>/test.jsonl``
      when it exists, else its hub test split), first ``data.eval_limit`` problems;
    * else, for a generated source (``data.source = synthetic``): its ``test`` stream at
      ``data.synthetic_level`` and seed ``data.eval_seed`` (None: ``train.seed``) -- a stream independent
      of the training problems (the generator keys its RNG on the split) whose
      facts are disjoint from theirs: no held-out problem shares an (operands,
      operator) step with any problem of the training stream, of any length,
      seed or level (see :mod:`mathrl.data.synthetic`);
    * else the training source's test split (``data.eval_path``, or the
      ``test`` file beside ``data.path``).

    The trainer's before/after evaluation and ``mathrl eval --config`` both use
    this, so their numbers are on the same problems.
    """

    d = cfg.data
    limit = d.eval_limit
    generated = generated_heldout_source(cfg)
    if generated is not None:  # a generator's held-out draw is its ``test`` split
        return generated, load_problems(generated, split="test",
                                        **generator_options(cfg, generated, limit, seed=d.eval_seed))
    if d.eval_source is not None:

        path = d.eval_path if d.eval_path is not None else local_copy(d.eval_source)
        return d.eval_source, load_problems(d.eval_source, path, "test" if path is None or
                                            Path(path).is_dir() else None, limit=limit)
    if d.eval_path is not None:
        return d.source, load_problems(d.source, d.eval_path, None, limit=limit, fields=d.fields)
    if d.path is not None:
        p = Path(d.path)
        if p.is_dir():
            return d.source, load_problems(d.source, p, "test", limit=limit, fields=d.fields)
        for cand in sorted(p.parent.glob("test.*")):
            return d.source, load_problems(d.source, cand, "test", limit=limit, fields=d.fields)
        raise ConfigError(f"data.eval_path is not set and there is no test file beside data.path = {d.path}; "
                          "set data.eval_path (or data.eval_source)")
    return d.source, load_problems(d.source, None, "test", limit=limit, fields=d.fields)


def step_indices(num_problems: int, step: int, batch: int, seed: int, shuffle: bool = True) -> list[int]:
    """Problem indices of ``step``: consecutive slices of per-epoch seeded permutations
    (``shuffle=False``: of the file order, pass after pass)."""
    return [stream_index(num_problems, pos, seed, shuffle) for pos in range(step * batch, (step + 1) * batch)]


def stream_index(num_problems: int, pos: int, seed: int, shuffle: bool = True) -> int:
    """The problem index at position ``pos`` of the training stream: pass ``pos // num_problems`` over the
    data, in a seeded permutation per pass (``shuffle=False``: file order)."""
    epoch, i = divmod(pos, num_problems)
    if not shuffle:
        return i
    return int(_epoch_order(num_problems, seed, epoch)[i])


@functools.lru_cache(maxsize=4)
def _epoch_order(num_problems: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_problems, generator=g)
