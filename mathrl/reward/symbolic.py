"""sympy comparison of two scalar answers (the last stage of :mod:`mathrl.reward.equiv`).

:func:`to_sympy` parses a cleaned scalar, the common subset with :mod:`mathrl.reward.fastlatex`, the
rest with latex2sympy2_extended (the parser math-verify uses; decimals become exact fractions first,
``i`` is the imaginary unit, ``e`` Euler's number);
:func:`sympy_equal` compares two parsed values: constants by evaluating both at 60 significant digits
with a relative difference below 1e-40 (or the user's ``reward.rel_tol``, passed in as ``rel_tol``),
expressions with symbols at 5 random rational points, then by ``simplify(a - b) == 0``.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from functools import lru_cache

from mathrl.reward.fastlatex import fast_parse
from mathrl.reward.normalize import guard, match_close

__all__ = ["DIGITS", "REL_TOL_EXP", "num_close", "sympy_equal", "to_sympy"]

REL_TOL_EXP = 40
DIGITS = 60


# functions written the way programs and CAS print them: sqrt(3), sin(pi*x/5), ln(a), exp(-x), abs(x)
_PLAIN_FN = re.compile(r"(?<![\\A-Za-z])(sqrt|arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|ln|log|"
                       r"exp|abs)\s*\(")


def plain_to_latex(t: str) -> str:
    """Plain-text function calls as LaTeX: ``sqrt(x)`` -> ``\\sqrt{x}``, ``sin(x)`` ->
    ``\\sin\\left(x\\right)``, ``exp(x)`` -> ``e^{x}``, ``abs(x)`` -> ``\\left|x\\right|``, and a
    parenthesised exponent ``e^(-8*x)`` -> ``e^{(-8*x)}``; text without them is returned unchanged."""
    for _ in range(64):  # bounded: each pass rewrites one call
        m = _PLAIN_FN.search(t)
        if m is None:
            break
        i = m.end() - 1
        j = match_close(t, i)
        if j < 0:
            break
        name, arg = m.group(1), t[i + 1:j]
        pre, post = {"sqrt": ("\\sqrt{", "}"), "abs": ("\\left|", "\\right|"), "exp": ("e^{", "}")}.get(
            name, ("\\" + name + "\\left(", "\\right)"))
        t = t[:m.start()] + pre + arg + post + t[j + 1:]
    for _ in range(64):
        k = t.find("^(")
        if k < 0:
            break
        j = match_close(t, k + 1)
        if j < 0:
            break
        t = t[:k] + "^{" + t[k + 1:j + 1] + "}" + t[j + 1:]
    return t


def prepare(text: str) -> str:
    """The text :func:`to_sympy` parses: CAS notation as LaTeX, ``pi``/``inf`` as commands, ``**``
    as ``^``, decimals as exact fractions (``0.25`` -> ``{\\frac{25}{100}}``)."""
    t = plain_to_latex(text)
    t = re.sub(r"(?<![\\A-Za-z])pi\b", r"\\pi ", t)
    t = re.sub(r"(?<![\\A-Za-z])(?:infinity|inf)\b", r"\\infty ", t)
    t = t.replace("**", "^")

    def dec(m: re.Match) -> str:
        whole, frac = m.group(1), m.group(2)
        return "{\\frac{%s}{%s}}" % (int(whole + frac), 10 ** len(frac))

    return re.sub(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])", dec, t)


def latex2sympy_value(t: str):
    """latex2sympy's value of a prepared text, ``i`` as the imaginary unit, ``e`` as Euler's number."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig, latex2sympy
    import sympy

    cfg = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=False,
                              boxed="none", equations=False)
    expr = latex2sympy(t, normalization_config=cfg)
    if isinstance(expr, sympy.Basic):
        subs = {}
        for sym in expr.free_symbols:
            if sym.name == "i":
                subs[sym] = sympy.I
            elif sym.name == "e":
                subs[sym] = sympy.E
        if subs:
            expr = expr.xreplace(subs)
        try:
            expr = expr.doit()
        except Exception:
            pass
    return expr


@lru_cache(maxsize=4096)
def to_sympy(text: str):
    """Parse a cleaned scalar: the common subset directly (:mod:`mathrl.reward.fastlatex`), the rest
    with latex2sympy; decimals become exact fractions."""
    guard(text)
    t = prepare(text)
    expr = fast_parse(t)
    return expr if expr is not None else latex2sympy_value(t)


def num_close(a, b, rel_tol: float) -> bool | None:
    """Compare two sympy constants numerically at high precision: equal when their relative difference
    is below 1e-40 or ``rel_tol`` (the user's ``reward.rel_tol``; 0 = that precision); None if undecidable."""
    import sympy

    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return bool(a == b)
    va = a.evalf(DIGITS)
    vb = b.evalf(DIGITS)
    if not (va.is_number and vb.is_number):
        return None
    try:
        diff = sympy.Abs(va - vb).evalf(DIGITS)
        scale = sympy.Max(sympy.Abs(va), sympy.Abs(vb)).evalf(DIGITS)
        if scale == 0:
            return diff == 0
        tol = max(sympy.Float(10) ** (-REL_TOL_EXP), sympy.Float(rel_tol))
        return bool(diff <= scale * tol)
    except (TypeError, ValueError):
        return None


def sympy_equal(a, b, rel_tol: float) -> bool:
    """Equality of two parsed values (see the module docstring); ``rel_tol`` as for :func:`num_close`."""
    import sympy

    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        try:
            return bool(a == b)
        except Exception:
            return False
    if a == b:
        return True
    fa, fb = a.free_symbols, b.free_symbols
    if not fa and not fb:
        r = num_close(a, b, rel_tol)
        if r is not None:
            return r
        try:
            return sympy.simplify(a - b) == 0
        except Exception:
            return False
    if fa != fb:
        return False
    rng = random.Random(1234)
    syms = sorted(fa, key=lambda s: s.name)
    for k in range(5):
        vals = {}
        for s in syms:
            v = Fraction(rng.randint(37, 290), 100)
            vals[s] = sympy.Rational(v.numerator, v.denominator) * (-1 if (k == 4 and rng.random() < 0.5) else 1)
        try:
            ea = a.xreplace(vals)
            eb = b.xreplace(vals)
            r = num_close(ea, eb, rel_tol)
        except Exception:
            r = None
        if r is False:
            return False
        if r is None:
            break
    else:
        return True
    try:
        if sympy.count_ops(a) + sympy.count_ops(b) > 300:
            return False
        return sympy.simplify(a - b) == 0
    except Exception:
        return False
