"""Gold-answer extraction: pure functions on strings and numbers.

These read *reference* answers out of dataset fields. They are strict: when a
gold cannot be found they return ``None`` or raise ``ValueError`` with the reason,
and the loader turns that into a bad-row error naming file, line and field.
(Answer extraction from *model output* belongs to the reward stage.)
"""

from __future__ import annotations

import math
import re

from mathrl.latex import last_box

_INT_RE = re.compile(r"[+-]?\d+")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_DECIMAL_RE = re.compile(r"[+-]?(\d+\.\d*|\.\d+)")
_SCI_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")
_FRACTION_RE = re.compile(r"[+-]?\d+\s*/\s*\d+")
_RATIO_TIME_RE = re.compile(r"\d+(:\d+)+(\s*[ap]\.?m\.?)?", re.IGNORECASE)
_UNIT_SUFFIX_RE = re.compile(r"^(?P<value>.*?)\s*\((?P<unit>[^()]*)\)\s*$", re.DOTALL)
_GSM8K_MARKER = "####"


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``.

    Rules (the convention of the MATH dataset's solutions, Hendrycks et al. 2021; the scanner is
    :func:`mathrl.latex.last_box`, shared with the verifier):

    * the argument is a balanced brace group, so nested braces are kept:
      ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; escaped braces ``\\{``
      ``\\}`` do not count towards the nesting; a box that is exactly one box gives the inner
      content (``\\boxed{\\boxed{3}}`` gives ``3``);
    * the unbraced form ``\\boxed 5`` takes the run of characters after the
      spaces up to the next space or ``$`` (or a ``}``, ``\\)``, ``\\]`` closing an outer
      group), without trailing ``.`` or ``,``: ``\\boxed -3/4$`` gives ``-3/4``;
    * surrounding whitespace of the content is stripped.

    Returns ``None`` when there is no box command, or when the *last* one is not
    closed (a truncated text): an earlier box is then not a safe stand-in.
    """
    return last_box(text)


def gsm8k_gold(answer_field: str) -> str:
    """Gold of a GSM8K row: the text after the last ``####``, commas removed.

    GSM8K (Cobbe et al. 2021) ends every worked answer with ``#### <number>``;
    the number may carry thousands separators (``#### 1,200`` gives ``1200``).

    Raises:
        ValueError: no ``####`` marker, or nothing after it.
    """
    if _GSM8K_MARKER not in answer_field:
        raise ValueError("no '####' marker before the final answer")
    tail = answer_field.rsplit(_GSM8K_MARKER, 1)[1].strip()
    gold = tail.replace(",", "").strip()
    if not gold:
        raise ValueError("nothing after the '####' marker")
    return gold


def format_number(value: float | int | str) -> str:
    """Canonical text of a numeric gold: ``27.0`` -> ``27``, ``'025'`` -> ``25``, ``2.50`` -> ``2.5``.

    Thousands separators are removed (``'1,200'`` -> ``1200``). Integers (and
    integer-valued floats) lose leading zeros and a ``.0``; other
    floats use Python's shortest round-trip ``repr``. Strings that are not plain
    integers are returned stripped and unchanged (LaTeX answers stay as written).

    Raises:
        ValueError: a non-finite float, or a boolean.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a number or text, got the boolean {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"the number {value!r} is not finite")
        if value.is_integer():
            return str(int(value))
        return repr(value)
    text = str(value).strip()
    if _THOUSANDS_RE.fullmatch(text):
        text = text.replace(",", "")
    if _INT_RE.fullmatch(text):
        return str(int(text))
    return text


def strip_unit(answer: str) -> tuple[str, str | None]:
    """Split an ASDiv answer ``'9 (apples)'`` into ``('9', 'apples')``.

    The trailing parenthesised unit (a group with a letter in it, after a
    non-empty value) is removed; an answer without one, such as ``-(1/3)``,
    is returned stripped with unit ``None``.
    """
    m = _UNIT_SUFFIX_RE.match(answer)
    if m is None or not m.group("value").strip() or not re.search(r"[A-Za-z]", m.group("unit")):
        return answer.strip(), None
    return m.group("value").strip(), m.group("unit").strip()


def gold_kind(gold: str) -> str:
    """Classify a gold string: integer, decimal, fraction, ratio_or_time, expression (LaTeX or other maths) or text.

    Used by ``mathrl data stats`` to show what a verifier will have to compare.
    """
    s = gold.strip().replace(",", "")
    if _INT_RE.fullmatch(s):
        return "integer"
    if _DECIMAL_RE.fullmatch(s):
        return "decimal"
    if _FRACTION_RE.fullmatch(s):
        return "fraction"
    if _RATIO_TIME_RE.fullmatch(s):
        return "ratio_or_time"
    if _SCI_RE.fullmatch(s):
        return "decimal"
    if any(c in s for c in "\\^_{}=+-*/()[]<>|"):
        return "expression"
    return "text"
