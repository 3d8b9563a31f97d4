"""Unevaluated matrix arithmetic in an answer (pure Python, no sympy).

An answer may be written as matrix arithmetic rather than its result:
``\\begin{pmatrix}1\\\\2\\end{pmatrix} + \\begin{pmatrix}3\\\\4\\end{pmatrix}``, ``2\\begin{pmatrix}..\\end{pmatrix}``,
``A B`` with two written-out matrices. :func:`matrix_expression` turns such a string into the
entries of its result, each entry a LaTeX expression (``(1)+(3)``) that the scalar comparison
evaluates later (exactly, with sympy). Only sums, differences, scalar multiples and products of
written-out matrices with compatible shapes are read; anything else (a matrix inverse, a
determinant, a matrix next to a variable) is not an expression of this kind and returns None.
"""

from __future__ import annotations

import re

__all__ = ["MATRIX_ENV", "matrix_expression"]

# One written-out matrix: \begin{pmatrix}..\end{pmatrix} (b/v/B/V/plain matrix, array), optionally in
# explicit brackets (\left[ \begin{array}..\end{array} \right] after cleaning is [ \begin{array}.. ]).
MATRIX_ENV = re.compile(
    r"[\[(]?\s*\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*?)\\end\{\1\}\s*[\])]?", re.DOTALL)
_TIMES = r"(?:\\cdot|\\times|\*)?"
_PLACEHOLDER = "\x00{}\x00"
_TERM = re.compile(r"^(?P<coef>[^\x00]*?)\s*" + _TIMES + r"\s*(?P<mats>(?:\x00\d+\x00\s*" + _TIMES + r"\s*)+)$")

Entries = list[list[str]]


def _rows(body: str, split_cells) -> Entries:
    rows = [r for r in re.split(r"\\\\(?:\[[^\]]*\])?", body) if r.strip()]
    return [[c.strip() for c in split_cells(r, ("&",))] for r in rows]


def _split_terms(s: str) -> list[tuple[str, str]]:
    """Split at top-level + and - (outside brackets and braces) into (sign, term)."""
    out: list[tuple[str, str]] = []
    depth, start, sign = 0, 0, "+"
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in "+-" and depth == 0:
            if s[start:i].strip():
                out.append((sign, s[start:i].strip()))
            elif c == "-":  # a leading minus, or "+ -": flip the sign of the next term
                sign = "-" if sign == "+" else "+"
                start = i + 1
                continue
            sign, start = c, i + 1
    out.append((sign, s[start:].strip()))
    return out


def _product(a: Entries, b: Entries) -> Entries | None:
    if len(a[0]) != len(b):
        return None
    return [["+".join(f"({a[i][k]})\\cdot({b[k][j]})" for k in range(len(b))) for j in range(len(b[0]))]
            for i in range(len(a))]


def matrix_expression(s: str, split_cells) -> Entries | None:
    """The entries of the matrix that ``s`` computes, or None when ``s`` is not matrix arithmetic
    (a single matrix is not: the caller parses it directly). ``split_cells(row, ("&",))`` splits a
    row at top-level separators (:func:`mathrl.reward.normalize.split_top`)."""
    mats: list[Entries] = []

    def keep(m: re.Match) -> str:
        mats.append(_rows(m.group(2), split_cells))
        return _PLACEHOLDER.format(len(mats) - 1)

    skeleton = MATRIX_ENV.sub(keep, s)
    if len(mats) == 0 or (len(mats) == 1 and skeleton.strip() == _PLACEHOLDER.format(0)):
        return None
    if any(not m or any(len(r) != len(m[0]) for r in m) for m in mats):
        return None
    result: Entries | None = None
    for sign, term in _split_terms(skeleton):
        t = _TERM.match(term)
        if t is None:
            return None
        coef = t.group("coef").strip()
        if coef and not re.fullmatch(r"[\w\\{}()^./ ]+", coef):
            return None
        value: Entries | None = None
        for idx in re.findall(r"\x00(\d+)\x00", t.group("mats")):
            m = mats[int(idx)]
            value = m if value is None else _product(value, m)
            if value is None:
                return None
        factor = ("-" if sign == "-" else "") + (f"({coef})" if coef else "1")
        value = [[f"{factor}\\cdot({e})" for e in row] for row in value]
        if result is None:
            result = value
        elif len(result) != len(value) or len(result[0]) != len(value[0]):
            return None
        else:
            result = [[f"({a})+({b})" for a, b in zip(ra, rb)] for ra, rb in zip(result, value)]
    return result
