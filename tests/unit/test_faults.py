"""Fault injection lives outside the product (issue 39, point 2): mathrl.testing.faults wraps the product's
functions; no module of the product calls or imports it. The faults themselves are exercised by
tests/train/test_reliability.py (NaN, kill, write failures) and scripts/gpu_check.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mathrl.testing import faults

ROOT = Path(__file__).resolve().parents[2]


def test_parse_reads_entries_and_names_what_is_wrong():
    assert faults.parse("kill@optimizer@3, nan@loss@2,fsize=100@step_start@1") == {
        ("optimizer", 3): "kill", ("loss", 2): "nan", ("step_start", 1): "fsize=100"}
    assert faults.parse("") == {}
    for bad, says in [("kill@optimizer", "expected action@point@step"), ("kill@nowhere@1", "unknown point"),
                      ("boom@loss@1", "unknown action"), ("nan@loss@x", "bad entry")]:
        with pytest.raises(ValueError, match=says):
            faults.parse(bad)


def test_install_wraps_only_the_planned_points_and_undoes_with_monkeypatch(monkeypatch):
    from mathrl.train import checkpoint, loop, sampling, update

    before = (loop.train_step, sampling.grade_and_score, update.accumulate_and_step, update.skip_or_step,
              checkpoint.hash_own_files)
    with monkeypatch.context() as mp:
        faults.install("nan@loss@2", setattr=mp.setattr)
        assert update.accumulate_and_step is not before[2]
        assert (loop.train_step, sampling.grade_and_score, update.skip_or_step, checkpoint.hash_own_files) == (
            before[0], before[1], before[3], before[4])
    assert update.accumulate_and_step is before[2]


def test_no_product_module_knows_about_fault_injection():
    for path in sorted((ROOT / "mathrl").rglob("*.py")):
        if path.parts[-2] == "testing":
            continue
        text = path.read_text()
        assert "MATHRL_FAULT" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names])
                assert not any(n.startswith("mathrl.testing.faults") for n in names), path
