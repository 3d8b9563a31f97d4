"""Equivalence of a response answer with a gold answer.

Order of checks for two scalars (first decisive one wins):

1. identical normalised strings;
2. multiple-choice letters (``C``, ``(C)``, ``\\text{(C)}``) compared as letters;
3. exact rationals (:func:`mathrl.reward.numbers.exact_number`): integers, decimals,
   fractions, mixed numbers, scientific notation -- *exact*, so 0.33 != 1/3;
4. text answers (no digits, words): case-, space- and punctuation-insensitive equality;
5. sympy (parsed with latex2sympy2_extended, the parser math-verify uses; decimals are turned
   into exact fractions first, ``i`` is the imaginary unit):
   constants are compared by evaluating both at 60 significant digits and requiring a relative
   difference below 1e-40 (so 1/2^99 != 1/2^98 and 1-1/e != 1+1/e); expressions with symbols
   are equal when ``simplify(a - b) == 0`` or they agree at 5 random points (rational,
   positive and negative) to the same relative precision, with identical free symbols.

The answer policy (the same text is in README, "Verifier"):

* **Numbers are exact rationals** by default (0.33 != 1/3, 1/2^99 != 1/2^98). ``reward.rel_tol`` (or
  ``GradeOptions(rel_tol=...)``, ``mathrl verify --rel-tol``) accepts numbers within a relative
  distance instead, for users who grade rounded answers; it reaches the comparisons here as the
  ``rel_tol`` argument of each function.
* **Number formats**: thousands separators (``1,000``, ``1 000``, ``1\\,000``, ``11,\\! 111``),
  leading-dot decimals, repeating decimals (``0.\\overline{3}``, ``0.(3)``), mixed numbers
  (``1\\frac12``), scientific notation, scale words (``2 million``) and number words (``seven``).
* **Units**: a unit after a number is dropped whether glued or spaced (``10cm``, ``10 m``,
  ``10weeks``, ``5只``); one- and two-letter units only from a fixed list; no conversion (``1 km``
  is 1). A parenthetical remark or conversion after the answer is dropped (``5 (which is 500 cents)``,
  ``5 ft (60 inches)`` is 5).
* **Percent**: ``25\\%`` equals ``25`` and ``0.25`` (a percent sign on one side may be read either
  way). **Degrees**: ``30^\\circ`` equals ``30``; inside a trigonometric function a degree is
  pi/180 (``\\sin(90^\\circ - x)`` = ``\\cos x``).
* **Times and ratios**: ``H:MM[:SS] [am|pm]`` is a time of day (``20:34`` = ``20:34:00``,
  ``12:00`` != ``1:00``; am/pm on one side only compares modulo 12 hours); other ``a:b`` are
  ratios (``2:4`` = ``1:2``).
* **Relations**: ``x = 5``, ``(p,q) = (3,2)``, ``x \\approx 11`` count by their value; one-variable
  inequalities are intervals (``x < 1`` = ``-x > -1`` = ``(-\\infty, 1)``); named sets
  (``\\mathbb{R}``, "all real numbers", ``\\emptyset``) equal their interval/set notation.
* **Lists, sets and matrices**: see :func:`nodes_equal` (tuples in brackets are ordered, bare lists
  and sets unordered, ``\\pm`` is a two-element list, a column/row vector equals a tuple); matrix
  arithmetic written out is evaluated (:mod:`mathrl.reward.matrices`).
* **A gold that names its value** (``(p,q) = (3,2)``, ``V_1:V_2 = 11:21``, ``|AB| = 1``) is compared by
  the value; an equation (``2x + z = 1``) is not a name for its right side.
* **Hedging**: an answer listing several different candidates is credited only when every item
  equals the gold (see :mod:`mathrl.reward.extract`).

When these rules say *unequal*, math-verify gives a second opinion under the rule written in
:mod:`mathrl.reward.second_opinion` (never for exact numbers, numeric constants or hedged answers).
"""

from __future__ import annotations

import random
import re

from mathrl.reward.normalize import (
    Group,
    GuardError,
    Matrix,
    Relation,
    Scalar,
    Seq,
    Union,
    is_var,
    parse_answer,
)
from mathrl.reward.numbers import clock_time, exact_number, ratio
from mathrl.reward.symbolic import num_close, sympy_equal, to_sympy
from mathrl.reward.normalize import parse_node

__all__ = ["equivalent", "fast_equivalent", "nodes_equal", "scalar_equal"]



def _within(x, y, tol: float) -> bool:
    """|x - y| <= tol * max(|x|, |y|) (exact when tol = 0)."""
    return x == y or (tol > 0 and abs(x - y) <= tol * max(abs(x), abs(y)))


class _NeedSympy(Exception):
    """Raised in fast mode when a decision needs sympy."""


# ----------------------------------------------------------------------------- text helpers

def _norm_str(s: str) -> str:
    return re.sub(r"\s+", "", s).replace("{}", "")


def _is_text(s: str) -> bool:
    if re.search(r"\d", s):
        return False
    words = re.findall(r"(?<!\\)\b[A-Za-z]{2,}\b", s)
    return bool(words) and not re.search(r"\\(?:frac|sqrt|pi|infty|cdot|times)", s)


def _norm_text(s: str) -> str:
    s = s.lower()
    s = re.sub(r"[\\{}()\[\].,;:!?\"'`]", " ", s)
    s = re.sub(r"\b(the|a|an)\b", " ", s)
    return re.sub(r"\s+", " ", s).strip()


# (?=...\d) + one run instead of [0-9A-F]*\d[0-9A-F]*: same language, but linear time (the
# two-star form backtracks quadratically on a long run of digits, e.g. a 1 MB number)
_BASE_RE = re.compile(r"^(?=[0-9A-F]*\d)([0-9A-F]+)_\{?(\d+)\}?$")


def _choice(s: str) -> str | None:
    m = re.fullmatch(r"\s*\(?([A-E])\)?\s*", s)
    return m.group(1) if m else None


def _resp_choice(s: str) -> str | None:
    """A multiple-choice letter leading the answer: '(C)', 'C', 'C. 12', 'C: twelve'; not 'E * 2'."""
    m = re.match(r"\s*\(([A-Ea-e])\)|\s*([A-E])(?:$|[.:)]|\s(?!\s*[-+*/^=\\]))", s)
    if not m:
        return None
    return (m.group(1) or m.group(2)).upper()


# ----------------------------------------------------------------------------- scalars

def _percent_pairs(a, b, g: Scalar, r: Scalar, hundred) -> list[tuple]:
    """Value pairs to compare: with a percent sign on exactly one side, that side may be read as
    a number or as a fraction (25% = 25 = 0.25); with it on both or neither, as written."""
    if g.percent and not r.percent:
        return [(a, b), (a / hundred, b)]
    if r.percent and not g.percent:
        return [(a, b), (a, b / hundred)]
    return [(a, b)]


def scalar_equal(g: Scalar, r: Scalar, fast: bool, rel_tol: float) -> bool:
    """Equality of two scalars (see module docstring). ``fast`` raises _NeedSympy instead of
    using sympy; ``rel_tol``: the relative tolerance for numbers (0 = exact)."""
    gs, rs = g.text.strip(), r.text.strip()
    if not gs or not rs:
        return False
    if _norm_str(gs) == _norm_str(rs) and g.percent == r.percent:
        return True
    gc = _choice(gs)
    if gc is not None and not _is_text(rs):
        rc = _resp_choice(rs)
        if rc is not None:
            return rc == gc
    gk, rk = clock_time(gs), clock_time(rs)
    if gk is not None and rk is not None:  # times of day: 20:34 = 20:34:00, 12:00 != 1:00
        if gk[1] != rk[1]:  # am/pm on one side only: 7:30 = 7:30 pm
            return gk[0] % 43200 == rk[0] % 43200
        return gk[0] == rk[0]
    gq, rq = ratio(gs), ratio(rs)
    if gq is not None and rq is not None:  # ratios: 2:4 = 1:2
        return gq[0] * rq[1] == gq[1] * rq[0] and (gq[1] != 0 or gq == rq)
    gb, rb = _BASE_RE.match(_norm_str(gs)), _BASE_RE.match(_norm_str(rs))
    if gb or rb:  # numbers in base b: 52_8 (compared as digit strings; the base must agree)
        gd, gbase = (gb.group(1), gb.group(2)) if gb else (_norm_str(gs), None)
        rd, rbase = (rb.group(1), rb.group(2)) if rb else (_norm_str(rs), None)
        if re.fullmatch(r"[0-9A-Za-z]+", gd) and re.fullmatch(r"[0-9A-Za-z]+", rd):
            return gd.upper() == rd.upper() and (gbase is None or rbase is None or gbase == rbase)
    gv, rv = exact_number(gs), exact_number(rs)
    if gv is not None and rv is not None:
        return any(_within(x, y, rel_tol) for x, y in _percent_pairs(gv, rv, g, r, 100))
    gt, rt = _is_text(gs), _is_text(rs)
    if gt or rt:
        if gt and rt:
            return _norm_text(gs) == _norm_text(rs)
        if gc is not None:
            return False
        # one side is words, the other is math: only equal if the words are symbols like 'pi'
        if (gt and gv is None and rv is not None) or (rt and rv is None and gv is not None):
            return False
    if fast:
        raise _NeedSympy
    import sympy

    try:  # an exact number is its rational (the parser would read '1.41421' as a set of one element)
        a = sympy.Rational(gv.numerator, gv.denominator) if gv is not None else to_sympy(gs)
        b = sympy.Rational(rv.numerator, rv.denominator) if rv is not None else to_sympy(rs)
    except GuardError:
        raise
    except Exception:  # unparseable LaTeX: equal strings were handled above
        return False

    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return any(sympy_equal(x, y, rel_tol) for x, y in _percent_pairs(a, b, g, r, sympy.Integer(100)))
    return sympy_equal(a, b, rel_tol)


# ----------------------------------------------------------------------------- structures

def _unordered_match(gs: tuple, rs: tuple, fast: bool, rel_tol: float) -> bool:
    """Is there a one-to-one pairing of gold and response items into equal pairs?
    Equality matrix (n^2 comparisons) + augmenting-path bipartite matching: polynomial, so
    repeated items cannot trigger factorial backtracking."""
    n = len(gs)
    if n != len(rs) or n > 40:
        return False
    eq = [[nodes_equal(a, b, fast, rel_tol) for b in rs] for a in gs]
    match_r = [-1] * n  # response item -> gold item

    def augment(i: int, seen: list[bool]) -> bool:
        for j in range(n):
            if eq[i][j] and not seen[j]:
                seen[j] = True
                if match_r[j] < 0 or augment(match_r[j], seen):
                    match_r[j] = i
                    return True
        return False

    return all(augment(i, [False] * n) for i in range(n))


def _ordered(gs: tuple, rs: tuple, fast: bool, rel_tol: float) -> bool:
    return len(gs) == len(rs) and all(nodes_equal(a, b, fast, rel_tol) for a, b in zip(gs, rs))


def _vector(m: Matrix) -> tuple | None:
    if all(len(row) == 1 for row in m.rows):
        return tuple(row[0] for row in m.rows)
    if len(m.rows) == 1:
        return tuple(m.rows[0])
    return None


_SUBSCRIPT = re.compile(r"_(?:\{[^{}]*\}|[A-Za-z0-9])")


def _names_only(lhs: str) -> bool:
    """Whether the left side of a gold ``lhs = value`` only names what the value is: variables,
    point names and subscripts joined by commas, colons, fractions or bars (``(p,q)``, ``V_1:V_2``,
    ``|AB|``, ``\\frac{NO}{BO}``), no digits or arithmetic (``x + y = 5`` is an equation, not a name)."""
    t = _SUBSCRIPT.sub("", lhs)
    t = re.sub(r"\\(?:frac|dfrac|tfrac|left|right|overline|angle|triangle)(?![A-Za-z])", "", t)
    return bool(re.fullmatch(r"[\s(){}|,:A-Za-z]+", t)) and bool(re.search(r"[A-Za-z]", t))


def _relation_value(n: Relation):
    """For 'x = 3' (simple variable on the left) return the right side as a Scalar."""
    if n.op == "=" and is_var(n.lhs):
        return Scalar(n.rhs)
    return None


def nodes_equal(g, r, fast: bool, rel_tol: float) -> bool:
    """Structural equality of gold node ``g`` and response node ``r`` (``fast`` and ``rel_tol`` as for
    :func:`scalar_equal`).

    * Seq vs Seq: same brackets (open/closed ends matter), items in order.
    * Group/Union vs Group/Union: unordered, same size, one-to-one matching.
    * Matrix vs Matrix: same shape, elementwise; a column/row vector also equals a tuple.
    * Relation: ``x = 3`` equals ``3`` (either side); two equations are equal when
      lhs - rhs are proportional (``y = 2x + 3`` vs ``2x - y + 3 = 0``); chains such as
      ``a = b = 4`` use their last part.
    * A bare list from the response vs a gold scalar: every item must equal the gold
      (so hedging "3 or 4" gets no credit). Gold ``(a, b)`` vs bare ``a, b``: ordered.
    """
    # unwrap relations with simple-variable left sides
    if isinstance(r, Relation) and not isinstance(g, Relation):
        v = _relation_value(r)
        if v is None and r.op == "=":
            v = Scalar(r.rhs)
        if v is not None:

            return nodes_equal(g, parse_node(r.rhs, False, False, 1), fast, rel_tol)
        return False
    if isinstance(g, Relation) and not isinstance(r, Relation):
        if _relation_value(g) is not None or (g.op == "=" and not g.extra and _names_only(g.lhs)):

            return nodes_equal(parse_node(g.rhs, False, False, 1), r, fast, rel_tol)
        if g.op == "=" and not g.extra and is_var(g.rhs):  # the value first: '2 = x'

            return nodes_equal(parse_node(g.lhs, False, False, 1), r, fast, rel_tol)
        return False
    if isinstance(g, Relation) and isinstance(r, Relation):
        return _relations_equal(g, r, fast, rel_tol)

    if isinstance(g, Scalar) and isinstance(r, Scalar):
        return scalar_equal(g, r, fast, rel_tol)
    if isinstance(g, Seq) and isinstance(r, Seq):
        return g.open == r.open and g.close == r.close and _ordered(g.items, r.items, fast, rel_tol)
    if isinstance(g, Matrix) and isinstance(r, Matrix):
        if len(g.rows) != len(r.rows) or any(len(a) != len(b) for a, b in zip(g.rows, r.rows)):
            return False
        return all(nodes_equal(a, b, fast, rel_tol) for ra, rb in zip(g.rows, r.rows) for a, b in zip(ra, rb))
    if isinstance(g, Matrix) and isinstance(r, (Seq, Group)):
        v = _vector(g)
        if v is None or (isinstance(r, Seq) and (r.open + r.close) not in ("()", "[]")) or (
                isinstance(r, Group) and r.kind == "set"):
            return False
        return _ordered(v, r.items, fast, rel_tol)
    if isinstance(r, Matrix) and isinstance(g, Seq) and (g.open + g.close) in ("()", "[]"):
        v = _vector(r)  # gold tuple, response written as a column/row vector (or computed as one)
        return v is not None and _ordered(g.items, v, fast, rel_tol)
    coll = (Group, Union)
    if isinstance(g, coll) and isinstance(r, coll):
        gi = g.items if isinstance(g, Group) else g.parts
        ri = r.items if isinstance(r, Group) else r.parts
        return _unordered_match(gi, ri, fast, rel_tol)
    if isinstance(g, Union) and isinstance(r, Seq):
        return len(g.parts) == 1 and nodes_equal(g.parts[0], r, fast, rel_tol)
    if isinstance(g, Seq) and isinstance(r, Union):
        return len(r.parts) == 1 and nodes_equal(g, r.parts[0], fast, rel_tol)
    if isinstance(g, Seq) and isinstance(r, Group) and r.kind == "list":
        return g.open == "(" and g.close == ")" and _ordered(g.items, r.items, fast, rel_tol)
    if isinstance(g, Group) and isinstance(r, Seq):
        if g.kind == "list" and r.open == "(" and r.close == ")":
            return _unordered_match(g.items, r.items, fast, rel_tol)
        return False
    if isinstance(g, Group) and not isinstance(r, coll):
        return len(g.items) == 1 and nodes_equal(g.items[0], r, fast, rel_tol)
    if isinstance(r, Group) and not isinstance(g, coll):
        return len(r.items) > 0 and all(nodes_equal(g, x, fast, rel_tol) for x in r.items)
    return False


def _relations_equal(g: Relation, r: Relation, fast: bool, rel_tol: float) -> bool:
    if g.op != r.op:
        flip = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq"}
        if flip.get(g.op) == r.op:
            r = Relation(r.rhs, g.op, r.lhs)
        else:
            return False
    if _norm_str(g.lhs) == _norm_str(r.lhs) and nodes_equal(Scalar(g.rhs), Scalar(r.rhs), fast, rel_tol):
        return True
    if fast:
        raise _NeedSympy
    import sympy

    try:
        gd = to_sympy(g.lhs) - to_sympy(g.rhs)
        rd = to_sympy(r.lhs) - to_sympy(r.rhs)
    except GuardError:
        raise
    except Exception:
        return False
    if gd == 0 or rd == 0:
        return False
    q = _constant_ratio(gd, rd, rel_tol)
    if q is None:
        q = sympy.simplify(gd / rd)
    if not q.is_number:
        return False
    if g.op == "=":
        return bool(q != 0)
    return bool(q.is_positive)  # inequalities: only a positive factor keeps the direction


def _constant_ratio(a, b, rel_tol: float):
    """``a / b`` when it is the same number at 5 random rational points (two equations are the same
    when lhs - rhs are proportional; the values compared as :func:`mathrl.reward.symbolic.num_close`
    with ``rel_tol``); False when it visibly varies; None when the points do not decide (a pole, a
    non-number), so the caller simplifies symbolically."""
    import sympy

    syms = sorted(a.free_symbols | b.free_symbols, key=lambda s: s.name)
    rng = random.Random(4321)
    first = None
    for _ in range(5):
        vals = {s: sympy.Rational(rng.randint(37, 290), 100) * rng.choice((1, -1)) for s in syms}
        try:
            qa, qb = a.xreplace(vals), b.xreplace(vals)
            if qb == 0 or not (qa.is_number and qb.is_number):
                return None
            q = qa / qb
        except Exception:
            return None
        if first is None:
            first = q
            continue
        same = num_close(q, first, rel_tol)
        if same is None:
            return None
        if not same:
            return sympy.Symbol("varies")  # not a number, so the caller says unequal
    return first


# ----------------------------------------------------------------------------- entry points

MAX_EQUIV_CHARS = 20_000


def equivalent(gold: str, answer: str, rel_tol: float = 0.0) -> bool:
    """True when ``answer`` is equivalent to ``gold`` (both raw strings). ``rel_tol`` > 0 accepts
    numbers within that relative distance (``reward.rel_tol``; 0 = exact). May raise GuardError
    (among others when either string is longer than MAX_EQUIV_CHARS: parsing a structure of
    tens of thousands of items is not worth the worker's time, and no gold is that long)."""
    if len(gold) > MAX_EQUIV_CHARS or len(answer) > MAX_EQUIV_CHARS:
        raise GuardError(f"answer or gold longer than {MAX_EQUIV_CHARS} characters")
    return nodes_equal(parse_answer(gold), parse_answer(answer), False, float(rel_tol))


def fast_equivalent(gold: str, answer: str, rel_tol: float = 0.0) -> bool | None:
    """The same verdict as :func:`equivalent` when it can be reached without sympy, else None.

    Pure Python and bounded (used in the calling process, before the worker pool)."""
    tol = float(rel_tol)
    try:
        if len(gold) > 500 or len(answer) > 500:
            return None
        return nodes_equal(parse_answer(gold), parse_answer(answer), True, tol)
    except _NeedSympy:
        return None
    except Exception:
        return None
