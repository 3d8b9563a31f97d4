"""math-verify as a second opinion on an answer mathrl's own rules call unequal.

mathrl decides first (extraction policy, exact rationals, structures; see :mod:`mathrl.reward.equiv`).
When it says *mismatch*, the same extracted answer and the gold go to math-verify
(``verify(parse(boxed gold), parse(boxed answer))``, its documented use with boxed strings), and the
pair counts as equal if math-verify says so. The rule, in full:

    correct = mathrl_equal(gold, answer)
              or (second_opinion_applies(gold, answer) and math_verify_equal(gold, answer))

``second_opinion_applies`` is false when mathrl's verdict is authoritative:

* both sides are plain exact numbers (integers, decimals, fractions, mixed numbers): mathrl compares
  them as exact rationals, where math-verify rounds (it would accept 0.333333 for 1/3);
* the answer is hedged (several different final answers: credit only when all are right) or
  missing (no committed answer: math-verify's own extraction would pick a number from the text);
* either string is longer than :data:`MAX_CHARS` (no gold is; hostile output is);
* either side is sympy's printed equation ``Eq(a, b)``, which math-verify's LaTeX parser reads as a
  product with a tuple (it credited ``Eq(x**2/16 + y**2/12, 1)`` for ``Eq(x**2/4 + y**2/3, 1)``).

math-verify's own ``signal.alarm`` timeouts are off (``parsing_timeout=None``,
``timeout_seconds=None``): this runs inside a grading worker, whose hard kill is the limit.
"""

from __future__ import annotations

import logging
import os
import re
from functools import lru_cache

from mathrl.reward.normalize import clean
from mathrl.reward.numbers import exact_number

__all__ = ["MAX_CHARS", "second_opinion_applies", "math_verify_equal"]

MAX_CHARS = 1000
_SYMPY_EQ = re.compile(r"(?<![A-Za-z\\])Eq\s*\(")


def enabled() -> bool:
    """``MATHRL_VERIFIER_SECOND_OPINION=0`` turns the second opinion off (mathrl's own rules only)."""
    return os.environ.get("MATHRL_VERIFIER_SECOND_OPINION", "1").strip().lower() not in ("0", "false", "no", "off")


def second_opinion_applies(gold: str, answer: str | None, hedged: bool = False) -> bool:
    if not enabled() or answer is None or hedged or len(gold) > MAX_CHARS or len(answer) > MAX_CHARS:
        return False
    if _SYMPY_EQ.search(gold) or _SYMPY_EQ.search(answer):
        return False  # math-verify reads sympy's Eq(a, b) as E * q * (a, b); mathrl reads it as a = b
    g, r = clean(gold)[0], clean(answer)[0]
    if exact_number(g) is not None and exact_number(r) is not None:
        return False
    if _constant(g) and _constant(r):  # numbers without variables: mathrl compares them to 60 digits
        return False
    # an answer with more numbers than the gold ('4 hours and 30 minutes' for 4) is not the gold
    # read another way
    return len(_NUMBERS.findall(r)) <= len(_NUMBERS.findall(g))


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def _constant(s: str) -> bool:
    """Whether ``s`` is a number written as an expression (``\\frac{1}{2^{99}}``, ``2\\sqrt{2}``,
    ``10^4``): digits and operators only, once LaTeX commands are removed."""
    t = re.sub(r"\\[A-Za-z]+", " ", s)
    return bool(re.search(r"\d", t)) and not re.search(r"[A-Za-z]", t)


def _boxed(s: str) -> str:
    return "\\boxed{" + s + "}"


@lru_cache(maxsize=2048)
def _parsed(s: str) -> tuple:
    """math-verify's parse of a boxed final answer, kept: in training a gold is graded G times per
    step and a group's answers repeat (sympy values are immutable, so sharing them is safe)."""
    from math_verify import parse

    return tuple(parse(_boxed(s), parsing_timeout=None))


def math_verify_equal(gold: str, answer: str) -> bool:
    """math-verify's verdict on (gold, answer), both given as final answers (so both are boxed for
    its parser). False when math-verify is not installed or fails."""
    try:
        from math_verify import verify
    except ImportError:  # pragma: no cover - math-verify is a required dependency
        return False
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" warning
    try:
        g = list(_parsed(gold))
        a = list(_parsed(answer))
        if not g or not a:
            return False
        return bool(verify(g, a, timeout_seconds=None))
    except Exception:
        return False
