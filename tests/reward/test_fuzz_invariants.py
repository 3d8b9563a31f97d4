"""mathrl.testing.fuzz: the per-case invariants shared by scripts/fuzz_verifier.py and
tests/reward/test_hostile_outputs.py catch each kind of bad result (negative controls)."""

from __future__ import annotations

import math

from mathrl.reward import Grade
from mathrl.testing.fuzz import case_violations, valid_grade
from mathrl.testing.hostile import UNRELATED_GOLDS, HostileCase

CASE = HostileCase("tower", "\\boxed{9^{9^{9}}}", UNRELATED_GOLDS[0], True, False)
OK = Grade(False, "9^{9^{9}}", "mismatch")


def _check(grade=OK, reward=0.0, duration=0.1, case=CASE):
    return case_violations(case, grade, reward, duration, max_duration=5.0)


def test_a_good_result_passes():
    assert _check() == []
    assert valid_grade(OK)


def test_each_broken_invariant_is_reported():
    assert "invalid grade" in _check(grade=None)[0]
    bad = object.__new__(Grade)  # Grade() itself refuses an unknown reason
    for k, v in {"correct": False, "extracted": None, "reason": "no such reason"}.items():
        object.__setattr__(bad, k, v)
    assert "invalid grade" in _check(grade=bad)[0]
    assert "invalid grade" in _check(grade=Grade(1, None, "ok"))[0]
    assert "invalid grade" in _check(grade=Grade(False, 3, "ok"))[0]
    assert "unrelated gold" in _check(grade=Grade(True, "9", "ok"))[0]
    related = HostileCase("tower", CASE.response, CASE.gold, False, False)
    assert _check(grade=Grade(True, "9", "ok"), case=related) == []  # correct may be right there
    assert "reason 'timeout'" in _check(grade=Grade(True, None, "timeout"), case=related)[0]
    assert "finite" in _check(reward=math.nan)[0]
    assert "finite" in _check(reward=1)[0]  # an int is not a float reward
    assert "5.00 s" in _check(duration=5.5)[0]
    assert _check(duration=math.nan)  # NaN is not within the bound
    assert len(_check(grade=Grade(True, None, "error"), reward=math.inf, duration=9.0)) == 4
