"""In-process grading: extraction + equivalence, no hard timeout.

:func:`grade_local` is what the worker processes run; :func:`fast_grade` is the bounded,
sympy-free subset that the calling process tries first (plain numbers, letters, text),
so most GSM8K-style answers never travel to a worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from mathrl.reward.equiv import equivalent, fast_equivalent
from mathrl.reward.extract import extract_answer
from mathrl.reward.normalize import GuardError
from mathrl.reward.second_opinion import math_verify_equal, second_opinion_applies

__all__ = ["Grade", "REASONS", "grade_local", "fast_grade"]

REASONS = ("ok", "mismatch", "no_answer", "timeout", "error")


@dataclass(frozen=True)
class Grade:
    """Verdict for one response.

    correct:   the extracted answer is equivalent to the gold.
    extracted: the final answer found in the response (None when there is none).
    reason:    ok | mismatch | no_answer | timeout | error.
    """

    correct: bool
    extracted: str | None
    reason: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"Grade.reason must be one of {REASONS}, got {self.reason!r}")


def _verdict(ok: bool, extracted: str) -> Grade:
    return Grade(True, extracted, "ok") if ok else Grade(False, extracted, "mismatch")


def _same_text(response: str, gold: str, truncated: bool) -> bool:
    """A finished response that is the gold itself, up to whitespace ("odd $n$" for "odd $n$"): right
    whatever the gold's form (a sentence with conditions, a named formula) and whether or not it parses."""
    return not truncated and " ".join(response.split()) == " ".join(gold.split()) != ""


def fast_grade(response: str, gold: str, truncated: bool = False, rel_tol: float = 0.0) -> Grade | None:
    """Grade without sympy when that is decisive; None when the full path is needed."""
    try:
        if not isinstance(response, str) or not isinstance(gold, str):
            return None
        if _same_text(response, gold, truncated):
            return Grade(True, response.strip(), "ok")
        ex = extract_answer(response, truncated)
        if ex.answer is None:
            return Grade(False, None, "no_answer")
        v = fast_equivalent(gold, ex.answer, rel_tol)
        if v is None or (not v and second_opinion_applies(gold, ex.answer, ex.hedged)):
            return None  # sympy needed, or math-verify's second opinion (in a worker)
        return _verdict(v, ex.answer)
    except Exception:
        return None


def grade_local(response: str, gold: str, truncated: bool = False, rel_tol: float = 0.0) -> Grade:
    """Full grading in this process. Never raises; has no timeout of its own (the worker pool
    supplies it). ``rel_tol``: relative tolerance for numbers (0 = exact)."""
    extracted = None
    try:
        if not isinstance(response, str):
            return Grade(False, None, "error")
        if not isinstance(gold, str) or not gold.strip():
            return Grade(False, None, "error")
        if _same_text(response, gold, truncated):
            return Grade(True, response.strip(), "ok")
        ex = extract_answer(response, truncated)
        extracted = ex.answer
        if extracted is None:
            return Grade(False, None, "no_answer")
        ok = equivalent(gold, extracted, rel_tol)
        if not ok and second_opinion_applies(gold, extracted, ex.hedged):
            ok = math_verify_equal(gold, extracted)
        return _verdict(ok, extracted)
    except GuardError:
        return Grade(False, extracted, "error")
    except (MemoryError, RecursionError):
        return Grade(False, extracted, "error")
    except Exception:
        return Grade(False, extracted, "error")
