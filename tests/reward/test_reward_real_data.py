"""Real benchmark golds (skipped when the data folder, $MATHRL_DATA or ../shared/data, is absent; a failure under MATHRL_REQUIRE_ALL=1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mathrl.reward import grade_batch
from mathrl_testenv import SHARED_DATA as DATA
from mathrl_testenv import require

pytestmark = pytest.mark.slow  # every test here takes seconds (make test-fast skips them)

MATH500 = DATA / "math500" / "test.jsonl"
GSM8K = DATA / "gsm8k" / "test.jsonl"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


def test_math500_golds_in_several_answer_formats():
    require(MATH500.is_file(), f"{MATH500} not found (shared data folder absent)")
    from bench_verifier import math500_format_sets, math500_sets

    pos, neg = math500_sets(MATH500, None)
    fpos, fneg = math500_format_sets(MATH500, None)
    cases = pos + neg + fpos[:500] + fneg[:500]
    grades = grade_batch([c[0] for c in cases], [c[1] for c in cases], timeout=5.0)
    wrong = [(c[1], g.extracted, g.reason) for c, g in zip(cases, grades) if g.correct != c[2]]
    assert not [g for g in grades if g.reason == "timeout"]
    assert not wrong, wrong[:20]  # README's verifier table: 100.00% on every MATH-500 set


def test_gsm8k_reference_solutions():
    require(GSM8K.is_file(), f"{GSM8K} not found (shared data folder absent)")
    from bench_verifier import gsm8k_sets

    pos, neg = gsm8k_sets(GSM8K, None)
    cases = pos + neg
    grades = grade_batch([c[0] for c in cases], [c[1] for c in cases], timeout=5.0)
    assert not [g for g in grades if g.reason == "timeout"]  # README: zero timeouts
    assert all(g.correct == c[2] for c, g in zip(cases, grades))  # README: 100.00%
