"""Chunk plan of an evaluation split across ranks (pure; the two-rank run is tests/train/test_dist_eval_ckpt.py)."""

from __future__ import annotations

import pytest

from mathrl.eval.runner import EvalSettings, assemble_parts, chunk_bounds


class HF:  # the engine's class name decides the default chunk size
    pass


class VllmEngine:
    pass


def test_chunk_bounds_defaults_and_explicit_rows():
    s = EvalSettings(n=4, ks=(1, 4))
    assert chunk_bounds(130, s, HF()) == [(0, 64), (64, 128), (128, 130)]  # 256 rows / n
    assert chunk_bounds(130, s, VllmEngine()) == [(0, 130)]                # 4096 rows / n
    # several ranks, rows unset: a chunk is at most ceil(130 / 4) so every rank gets work
    assert chunk_bounds(130, s, VllmEngine(), world=4) == [(0, 33), (33, 66), (66, 99), (99, 130)]
    fixed = EvalSettings(n=4, ks=(1, 4), chunk_rows=8)  # explicit rows: the same chunks for any world
    assert chunk_bounds(7, fixed, HF(), world=1) == chunk_bounds(7, fixed, HF(), world=3) == [(0, 2), (2, 4), (4, 6),
                                                                                                (6, 7)]
    assert chunk_bounds(0, s, HF()) == []


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_assemble_parts_restores_problem_order(world):
    s = EvalSettings(n=2, ks=(1, 2), chunk_rows=6)  # 3 problems per chunk
    bounds = chunk_bounds(11, s, HF(), world=world)
    parts = [[{"i": i} for j, (a, b) in enumerate(bounds) if j % world == r for i in range(a, b)] for r in range(world)]
    assert [r["i"] for r in assemble_parts(parts, bounds)] == list(range(11))


def test_assemble_parts_rejects_mismatched_parts():
    bounds = [(0, 2), (2, 4)]
    with pytest.raises(ValueError, match="do not match"):
        assemble_parts([[{"i": 0}, {"i": 1}], [{"i": 2}]], bounds)
    with pytest.raises(ValueError, match="do not match"):  # a rank sent more than its chunks
        assemble_parts([[{"i": 0}, {"i": 1}, {"i": 9}], [{"i": 2}, {"i": 3}]], bounds)
