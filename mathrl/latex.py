"""Small LaTeX text helpers shared by the data stage (gold extraction) and the verifier.

* :func:`matching_brace`: the ``}`` closing a ``{`` (escaped braces do not count).
* The one ``\\boxed`` / ``\\fbox`` scanner: :func:`scan_boxes`, :func:`find_boxes`,
  :func:`last_box`. Gold extraction (:func:`mathrl.data.gold.last_boxed`), answer extraction from
  model output (:func:`mathrl.reward.extract.extract_answer`) and answer normalisation
  (:func:`mathrl.reward.normalize.clean`) all call it, so they read a box the same way.

Box rules
---------
* A box command is ``\\boxed`` or ``\\fbox`` not followed by a letter (``\\boxedx`` is another
  command), then optional whitespace, then its argument.
* Braced form ``\\boxed{...}``: the balanced brace group (nested braces kept, ``\\{`` ``\\}``
  escaped), stripped. A box whose argument is, up to whitespace, exactly one box gives the inner
  content (``\\boxed{\\boxed{3}}`` is ``3``). A ``\\boxed{`` that is never closed is incomplete.
* Brace-less form ``\\boxed x``: the run of characters up to the next whitespace or ``$`` (or a
  ``}``, ``\\)``, ``\\]`` that closes a group opened before the box; braces inside the run nest),
  without a trailing ``.`` or ``,``. An empty run (``\\boxed`` at the end, ``\\boxed $``,
  ``\\boxed, so``) is incomplete.
* Boxes nested in a complete box belong to it; the argument of an unclosed ``\\boxed{`` is scanned
  on (a complete box inside it counts).

Callers differ only in what they do with an incomplete *last* box: :func:`last_box` (gold
extraction, normalisation) returns None, since for a truncated text an earlier box is not a safe
stand-in; the response extractor ignores the incomplete box and keeps the earlier complete ones
(its truncation policy lives in :mod:`mathrl.reward.extract`).

Why ``\\boxed -3/4$`` is ``-3/4``
-----------------------------------
In TeX the brace-less form takes exactly one token, so ``\\boxed -3/4`` strictly boxes only
``-``. Nobody means that, and graders do not read it so: the ``last_boxed_only_string`` /
``remove_boxed`` helpers of MATH-style graders (from Hendrycks et al. 2021's MATH code, as reused
in lm-evaluation-harness) read ``"\\boxed "`` as everything up to the next ``$``, i.e. ``-3/4``,
and MATH-style gold answers are written against that reading. We follow the graders, so a gold
and a response in the same notation are read alike (the three former parsers said ``-3/4``,
``-3`` and None). We also stop at whitespace, where the graders would swallow the rest of a
sentence written without ``$`` (``\\boxed 5 apples, so`` would be ``5 apples, so``).
"""

from __future__ import annotations

import re
from typing import NamedTuple


def matching_brace(text: str, open_pos: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``text[open_pos]``, or -1 when it is never closed.

    A backslash escapes the next character, so ``\\{``, ``\\}`` (literal braces in LaTeX) and
    ``\\\\`` do not change the depth. Linear in the length scanned.
    """
    depth = 0
    i = open_pos
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


# ----------------------------------------------------------------------------- \boxed / \fbox


class Box(NamedTuple):
    """One ``\\boxed``/``\\fbox`` command with a complete argument: ``text[start:end]`` is the
    command and its argument; ``content`` is the argument, stripped (and unwrapped when it is
    itself exactly one box)."""

    start: int
    end: int
    content: str


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*(\{)?")
_WS_RE = re.compile(r"\s*")


def _brace_map(text: str) -> dict[int, int]:
    """Each ``{`` index -> the index of its matching ``}``, in one linear pass (a backslash escapes
    the next character, as in :func:`matching_brace`; unclosed ``{`` are absent)."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _bare_arg(text: str, i: int, limit: int) -> int:
    """End of the brace-less argument starting at ``text[i]`` (not whitespace): it runs to the
    next whitespace or ``$``, or to a ``}``, ``\\)`` or ``\\]`` that closes a group opened before
    it, whichever comes first (never past ``limit``). Braces inside it nest."""
    depth = 0
    j = i
    while j < limit:
        c = text[j]
        if c == "$" or c.isspace():
            break
        if c == "\\":
            if depth == 0 and j + 1 < limit and text[j + 1] in ")]":
                break
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                break
            depth -= 1
        j += 1
    return min(j, limit)


def _box_at(text: str, m: re.Match, pairs_of, limit: int) -> tuple[int, int, int] | None:
    """(end of the box, content start, content end) of the box command matched by ``m``, or None
    when its argument is missing or not closed."""
    if m.group(1) is not None:  # \boxed{...}
        close = pairs_of().get(m.end() - 1, -1)
        if close < 0 or close >= limit:
            return None
        return close + 1, m.end(), close
    i = m.end()  # \boxed x: one brace-less token
    if i >= limit:
        return None
    j = _bare_arg(text, i, limit)
    if not text[i:j].rstrip(".,"):  # nothing, or only punctuation ("\\boxed, so")
        return None
    return j, i, j


def _unwrap(text: str, lo: int, hi: int, pairs_of) -> tuple[int, int, bool]:
    """Narrow the (braced) content span ``text[lo:hi]`` while it is, up to whitespace, exactly one
    box: ``\\boxed{\\boxed{3}}`` holds ``3``. Returns (lo, hi, whether the innermost is braced)."""
    while True:
        m = _BOX_RE.match(text, _WS_RE.match(text, lo, hi).end(), hi)
        if m is None:
            return lo, hi, True
        box = _box_at(text, m, pairs_of, hi)
        if box is None or _WS_RE.match(text, box[0], hi).end() != hi:
            return lo, hi, True
        _, lo, hi = box
        if m.group(1) is None:  # a brace-less token holds no further box
            return lo, hi, False


def _content(text: str, lo: int, hi: int, braced: bool) -> str:
    """A braced argument, stripped; a brace-less token, without a trailing ``.`` or ``,``."""
    s = text[lo:hi].strip()
    return s if braced else s.rstrip(".,")


def scan_boxes(text: str) -> tuple[list[Box], bool]:
    """All complete top-level boxes of ``text`` in order, and whether the *last* box command
    (among those not inside a complete box) is complete.

    A box nested in another box's argument belongs to that box (it is not listed again); the
    argument of an unclosed ``\\boxed{`` is scanned on, so a complete box inside it is listed.
    Linear in ``len(text)``.
    """
    out: list[Box] = []
    pairs: dict[int, int] | None = None

    def pairs_of() -> dict[int, int]:
        nonlocal pairs
        if pairs is None:
            pairs = _brace_map(text)
        return pairs

    n = len(text)
    last_ok = False
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out, last_ok
        box = _box_at(text, m, pairs_of, n)
        if box is None:
            last_ok = False
            pos = m.end()
            continue
        end, lo, hi = box
        braced = m.group(1) is not None
        if braced:
            lo, hi, braced = _unwrap(text, lo, hi, pairs_of)
        out.append(Box(m.start(), end, _content(text, lo, hi, braced)))
        last_ok = True
        pos = end


def find_boxes(text: str) -> list[Box]:
    """All complete top-level boxes of ``text``, in order (see :func:`scan_boxes`)."""
    return scan_boxes(text)[0]


def last_box(text: str) -> str | None:
    """Content of the last box of ``text``; None when there is none, or when the last box command
    is not complete (``\\boxed{`` never closed, ``\\boxed`` at the end): a truncated text, for
    which an earlier box is not a safe stand-in."""
    boxes, last_ok = scan_boxes(text)
    return boxes[-1].content if boxes and last_ok else None
