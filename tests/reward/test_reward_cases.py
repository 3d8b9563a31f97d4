"""The hand-labelled set: every case right (README: 100% on the labelled set), no timeouts, and the
set's own requirements."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mathrl.reward import grade_batch
from mathrl.reward.cli import load_cases

CASES = Path(__file__).with_name("cases.jsonl")
REQUIRED_CATEGORIES = {
    "extraction", "gold_format", "numbers", "decimal_fraction", "mixed_numbers", "percent", "currency",
    "degrees", "units", "scientific", "radicals", "pi_e", "complex", "expressions", "equations", "tuples",
    "lists", "intervals", "sets", "matrices", "choices", "text", "gsm8k_style", "math_style", "mv_faults",
}


@pytest.fixture(scope="module")
def graded():
    cases = load_cases(CASES)
    grades = grade_batch([c["response"] for c in cases], [c["gold"] for c in cases], timeout=5.0,
                         truncated=[c.get("truncated", False) for c in cases])
    return cases, grades


def test_set_shape():
    cases = load_cases(CASES)
    assert len(cases) >= 300
    neg = sum(not c["equivalent"] for c in cases)
    assert neg / len(cases) >= 0.35
    cats = Counter(c["category"] for c in cases)
    assert REQUIRED_CATEGORIES <= set(cats), REQUIRED_CATEGORIES - set(cats)
    assert all(isinstance(c["equivalent"], bool) for c in cases)


@pytest.mark.slow
def test_accuracy_and_no_timeouts(graded):
    cases, grades = graded
    assert not [c["_line"] for c, g in zip(cases, grades) if g.reason == "timeout"]
    wrong = [(c["_line"], c["gold"], g.extracted) for c, g in zip(cases, grades) if g.correct != c["equivalent"]]
    acc = 1 - len(wrong) / len(cases)
    assert not wrong, f"accuracy {acc:.2%} (README claims 100%); disagreements: {wrong}"


def test_no_false_positive_on_known_math_verify_faults(graded):
    cases, grades = graded
    for c, g in zip(cases, grades):
        if c["category"] == "mv_faults":
            assert g.correct == c["equivalent"], (c["_line"], c["gold"], c["response"])
