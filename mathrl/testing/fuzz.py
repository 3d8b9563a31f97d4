"""The invariants a verifier result must satisfy for a hostile case.

Shared by ``scripts/fuzz_verifier.py`` (the 100,000-case soak) and
``tests/reward/test_hostile_outputs.py`` (the CI-sized sample), so both check the same things:

* the grade is a :class:`mathrl.reward.Grade` with a known reason, a bool ``correct`` and a
  ``str``-or-None ``extracted`` (:func:`valid_grade`);
* a case whose gold is unrelated to the response (``HostileCase.unrelated``) is never correct;
* only reason ``"ok"`` may be correct (a timeout, error or missing answer never is);
* the reward is a finite float;
* the case took no longer than ``max_duration`` seconds.
"""

from __future__ import annotations

import math

from mathrl.reward import REASONS, Grade
from mathrl.testing.hostile import HostileCase

__all__ = ["valid_grade", "case_violations"]


def valid_grade(grade: object) -> bool:
    """True when ``grade`` is a well-formed :class:`~mathrl.reward.Grade`."""
    return (isinstance(grade, Grade) and grade.reason in REASONS and isinstance(grade.correct, bool)
            and (grade.extracted is None or isinstance(grade.extracted, str)))


def case_violations(case: HostileCase, grade: object, reward: object, duration: float, *,
                    max_duration: float) -> list[str]:
    """The invariants that ``grade`` (from ``grade_batch``), ``reward`` (from ``compute_rewards``)
    and ``duration`` (seconds, from ``grade_batch(durations=...)``) break for ``case``, as
    messages naming the case; empty when the result is fine. An invalid grade is reported alone
    (the other checks need its fields)."""
    where = f"{case.category}: {ascii(case.response[:120])} vs {ascii(case.gold[:60])}"
    if not valid_grade(grade):
        return [f"invalid grade {grade!r}: {where}"]
    out = []
    if grade.correct and case.unrelated:
        out.append(f"graded correct against an unrelated gold: {where}")
    if grade.correct and grade.reason != "ok":
        out.append(f"graded correct with reason {grade.reason!r}: {where}")
    if not (isinstance(reward, float) and math.isfinite(reward)):
        out.append(f"reward {reward!r} is not a finite float: {where}")
    if not duration <= max_duration:  # NaN too
        out.append(f"{duration:.2f} s > {max_duration:.2f} s (timeout + slack): {where}")
    return out
