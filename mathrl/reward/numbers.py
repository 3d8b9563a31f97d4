"""Numbers and units in answer strings (pure Python): exact rational values (:func:`exact_number`),
number and scale words, trailing units (:func:`strip_units`), named sets, times of day and ratios.
Used by :mod:`mathrl.reward.normalize` (cleaning) and :mod:`mathrl.reward.equiv` (comparison)."""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["NAMED_SETS", "exact_number", "strip_units", "scale_words", "clock_time", "ratio"]


def _in_parens(s: str) -> bool:
    """Whether one pair of parentheses encloses the whole of ``s``: ``(3)`` yes, ``(1)(2)`` no."""
    if not (s.startswith("(") and s.endswith(")")):
        return False
    depth = 0
    for i, c in enumerate(s):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


# ----------------------------------------------------------------------------- exact numbers

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_RE_PLAIN = re.compile(rf"^{_NUM}$")
_RE_SLASH = re.compile(rf"^({_NUM})\s*/\s*({_NUM})$")
_RE_FRAC = re.compile(rf"^([+-]?)\s*\\frac\s*\{{\s*({_NUM})\s*\}}\s*\{{\s*({_NUM})\s*\}}$")
_RE_FRAC_SHORT = re.compile(r"^([+-]?)\s*\\frac\s*(\d)\s*(\d)$")
_RE_MIXED_TEX = re.compile(r"^([+-]?)(\d+)\s*\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}$")
_RE_MIXED_SLASH = re.compile(r"^([+-]?)(\d+)\s+(\d+)\s*/\s*(\d+)$")
_RE_SCI = re.compile(rf"^({_NUM})\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?$")
_RE_E = re.compile(rf"^({_NUM})[eE]([+-]?\d+)$")
_RE_REPEAT = re.compile(r"^([+-]?)(\d*)\.(\d*)(?:\\overline\s*\{(\d{1,12})\}|\((\d{1,12})\))$")
_RE_POW10 = re.compile(r"^10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?$")


def _frac(t: str) -> Fraction:
    return Fraction(t.replace("+", "") if t.startswith("+") else t)


def exact_number(s: str) -> Fraction | None:
    """Exact rational value of a plain numeric answer, or None if it is not one.

    Accepts integers, decimals, ``a/b``, ``\\frac{a}{b}``, mixed numbers (``7\\frac{3}{4}``,
    ``7 3/4``), scientific notation (``1.5\\times10^{3}``, ``1.5e3``) with |exponent| <= 1000.
    """
    s = s.strip()
    if _in_parens(s):
        s = s[1:-1].strip()
    if len(s) > 400:
        return None
    try:
        m = _RE_REPEAT.match(s)
        if m:  # 0.\overline{3} = 1/3, 1.2\overline{34}, 0.(6)
            sign, whole, fixed, rep = m.group(1), m.group(2) or "0", m.group(3) or "", m.group(4) or m.group(5)
            v = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed)) + Fraction(
                int(rep), (10 ** len(rep) - 1) * 10 ** len(fixed))
            return -v if sign == "-" else v
        if _RE_PLAIN.match(s):
            return _frac(s)
        m = _RE_SLASH.match(s)
        if m:
            d = _frac(m.group(2))
            return None if d == 0 else _frac(m.group(1)) / d
        m = _RE_FRAC.match(s)
        if m:
            d = _frac(m.group(3))
            if d == 0:
                return None
            v = _frac(m.group(2)) / d
            return -v if m.group(1) == "-" else v
        m = _RE_FRAC_SHORT.match(s)
        if m:
            d = int(m.group(3))
            if d == 0:
                return None
            v = Fraction(int(m.group(2)), d)
            return -v if m.group(1) == "-" else v
        for rx in (_RE_MIXED_TEX, _RE_MIXED_SLASH):
            m = rx.match(s)
            if m:
                d = int(m.group(4))
                if d == 0:
                    return None
                v = int(m.group(2)) + Fraction(int(m.group(3)), d)
                return -v if m.group(1) == "-" else v
        for rx in (_RE_SCI, _RE_E):
            m = rx.match(s)
            if m:
                e = int(m.group(2))
                if abs(e) > 1000:
                    return None
                return _frac(m.group(1)) * Fraction(10) ** e
        m = _RE_POW10.match(s)
        if m:
            e = int(m.group(1))
            return None if abs(e) > 1000 else Fraction(10) ** e
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


# ----------------------------------------------------------------------------- units, words, named sets

# two-letter unit words that may be stripped after a number (longer words are generic units)
_SHORT_UNITS = {"cm", "mm", "km", "kg", "mg", "ft", "in", "oz", "lb", "mi", "ml", "hr", "yd", "sq",
                "m", "g", "s", "h", "l"}
_GLUED_UNITS = {"cm", "mm", "km", "kg", "mg", "ft", "oz", "lb", "lbs", "mi", "ml", "hr", "hrs", "yd",
                "min", "mins", "sec", "secs", "mph", "kmh", "am", "pm", "st", "nd", "rd", "th"}
_NOT_UNITS = {"and", "or", "pi", "infty", "sqrt", "frac", "sin", "cos", "tan", "log", "ln", "exp",
              "cup", "cap", "in", "to", "no", "yes", "none"}


def strip_units(s: str) -> str:
    """Drop trailing unit words after a numeric/math head: '5 cm^2' -> '5', '18 apples' -> '18',
    and glued ones: '10cm', '10m', '1000.99m^2', '10weeks', '5只' -> the number.

    The unit policy: a unit after a number is dropped whether it is glued or spaced; one- and
    two-letter units only from a fixed list (``m``, ``cm``, ``kg``, ...), longer words always (they are
    never variables); the number is compared as written (no conversion: ``1 km`` is 1, not 1000)."""
    glued = re.fullmatch(r"\s*([-+]?[\d.,/]*\d)\s*([A-Za-z]{1,12})(\^\{?[23]\}?|[²³])?\.?\s*", s)
    if glued:
        word = glued.group(2).lower()
        if word in _GLUED_UNITS or word in _SHORT_UNITS or (len(word) >= 3 and word not in _NOT_UNITS):
            return glued.group(1)
    cjk = re.fullmatch(r"\s*([-+]?[\d.,/]*\d)\s*[\u3400-\u9fff]{1,4}\s*", s)  # 5只, 3公斤
    if cjk:
        return cjk.group(1)
    tokens = s.split()
    if len(tokens) < 2:
        return s
    unit_re = re.compile(r"^(?:[A-Za-z]+\.?)(?:\^\{?\d\}?|\d)?(?:/[A-Za-z]+(?:\^\{?\d\}?)?)?$")
    k = len(tokens)
    while k > 1:
        t = tokens[k - 1]
        word = re.sub(r"[^A-Za-z]", "", t).lower()
        if not unit_re.match(t) or word in _NOT_UNITS:
            break
        core = re.match(r"[A-Za-z]+", t).group(0)
        if len(core) < 3 and core.lower() not in _SHORT_UNITS:
            break
        if k - 2 >= 0 and tokens[k - 2].endswith("\\"):
            break
        k -= 1
    if k == len(tokens):
        return s
    head = " ".join(tokens[:k])
    if re.search(r"[\d\\]", head) and not re.fullmatch(r"[A-Za-z ]+", head):
        return head
    return s


# named sets and their interval / set notation (whole answers, compared after removing spaces and braces)
NAMED_SETS = {
    **dict.fromkeys(("\\mathbbr", "\\r", "\\reals", "allrealnumbers", "allreals", "realnumbers"),
                    "(-\\infty,\\infty)"),
    **dict.fromkeys(("\\mathbbr^+", "\\mathbbr_+", "\\mathbbr_>0", "allpositiverealnumbers"), "(0,\\infty)"),
    **dict.fromkeys(("\\varnothing", "\\emptyset", "\\\\", "nosolution", "nosolutions", "none", "emptyset"),
                    "\\emptyset"),
}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SMALL_NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i >= 2}


def _number_words(s: str) -> int | None:
    """'seven' -> 7, 'twenty-five' -> 25, 'three hundred twelve' -> 312 (0..999,999); else None."""
    words = re.sub(r"\band\b", " ", s.lower()).replace("-", " ").split()
    if not words or len(words) > 8:
        return None
    total, cur = 0, 0
    for w in words:
        if w in _SMALL_NUMBERS:
            cur += _SMALL_NUMBERS[w]
        elif w in _TENS:
            cur += _TENS[w]
        elif w == "hundred" and cur:
            cur *= 100
        elif w == "thousand" and cur:
            total, cur = total + cur * 1000, 0
        else:
            return None
    return total + cur


def scale_words(s: str) -> str:
    """'2 million' -> '2000000', '1.5 billion' -> '1500000000', 'seven' -> '7' (whole answer only)."""
    m = re.fullmatch(r"([-+]?\d+(?:\.\d+)?)\s*(thousand|million|billion|trillion)\b(.*)", s, re.IGNORECASE)
    if m:
        from fractions import Fraction as _F

        v = _F(m.group(1)) * _SCALES[m.group(2).lower()]
        if v.denominator == 1:
            return f"{v.numerator}{m.group(3)}"
    words = _number_words(s)
    return str(words) if words is not None else s


# ----------------------------------------------------------------------------- times and ratios

_CLOCK_RE = re.compile(r"^(\d{1,2})\s*:\s*([0-5]\d)(?:\s*:\s*([0-5]\d))?\s*(?:(a|p)\.?\s*m\.?)?$", re.IGNORECASE)
_RATIO_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)$")


def clock_time(s: str) -> tuple[int, bool] | None:
    """(seconds after midnight, whether am/pm was written) of a time of day written H:MM[:SS] [am|pm];
    None if ``s`` is not one."""
    m = _CLOCK_RE.match(s.strip())
    if not m:
        return None
    h, mi, sec, half = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), (m.group(4) or "").lower()
    if half:
        if not 1 <= h <= 12:
            return None
        h = h % 12 + (12 if half == "p" else 0)
    elif h > 24:
        return None
    return h * 3600 + mi * 60 + sec, bool(half)


def ratio(s: str) -> tuple[Fraction, Fraction] | None:
    m = _RATIO_RE.match(s.strip())
    return (Fraction(m.group(1)), Fraction(m.group(2))) if m else None
