"""Final-answer extraction from a model response (pure Python, linear-time, no sympy).

Policy (documented here, tested in tests/reward/test_extract.py):

Explicit markers, in priority order (the first kind present wins; within a kind the *last*
occurrence wins, so a self-correction later in the text overrides an earlier attempt):

1. ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces; also the brace-less ``\\boxed 5``, which takes
   the token up to the next space or ``$``: ``\\boxed -3/4$`` is ``-3/4``; see :mod:`mathrl.latex`).
   An unclosed box (the text was cut inside it) is ignored.
2. ``#### N`` (GSM8K style), up to the end of its line.
3. A phrase: "final answer: X", "the final answer is X", "the answer is X", "Answer: X"; X runs to
   the end of the sentence or line (a decimal point is not a sentence end).
4. ``**bold**`` text in the last paragraph that contains a digit or a LaTeX command
   (e.g. ``**18**`` or ``**Answer: $18**``). Only when the response was *not* truncated.

No marker: when the response ended by stopping (``truncated=False``), the last number in the
response counts -- or the right-hand side of the last display/inline math span of the last
paragraph, if that span ends after the last number. When the sampler cut the response at the
length limit (``truncated=True``) there is no answer: an unfinished response must not be
credited for whatever number it happened to stop on.

Hedging: all boxes of the *paragraph* holding the last box are collected. If they disagree as
strings, the answer becomes the comma-joined list of them (``hedged=True``); the equivalence
step then only gives credit when every listed item equals the gold (or when the gold itself is a
list and the lists match). "3 or 4" inside one answer is split the same way. So listing several
candidates is never rewarded, while ``\\boxed{3}, \\boxed{\\pi/2}`` for an ordered pair, or a list
of all solutions, still is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mathrl.latex import find_boxes, matching_brace  # noqa: F401  (matching_brace: re-exported API)

__all__ = ["Extraction", "extract_answer", "matching_brace"]

MAX_SCAN_CHARS = 400_000  # responses longer than this are only scanned in their last part


@dataclass(frozen=True)
class Extraction:
    """What :func:`extract_answer` found.

    answer: the answer text (LaTeX or plain), or None.
    source: boxed | hash | phrase | bold | math | last_number | none.
    hedged: True when several different boxed answers were given in the final paragraph.
    """

    answer: str | None
    source: str
    hedged: bool = False


_HASH_RE = re.compile(r"####\s*([^\n]*)")
_PHRASE_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|:|=)|the\s+answer\s+is|\banswer\s*:)\s*",
    re.IGNORECASE,
)
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,300}?)\*\*")
_NUMBER_RE = re.compile(
    r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?(?![\w])"
)


_CLAUSE_RE = re.compile(r",\s+(?=[A-Za-z]{3,}\b)|\s+(?=(?:because|since|which|as|so|when|where|given|after|and\s+(?:so|then|thus))\s)")


def _cut_sentence(s: str) -> str:
    """Text up to the end of the first sentence/line or clause ("18, since ...", "18 because ...");
    not cut inside braces or inline math, and a decimal point is not a sentence end."""
    depth = 0
    in_dollar = False
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "$":
            in_dollar = not in_dollar
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "\n":
            return s[:i]
        elif c == "." and depth <= 0 and (i + 1 == n or s[i + 1].isspace()):
            return s[:i]
        elif depth <= 0 and not in_dollar and c in ", " and _CLAUSE_RE.match(s, i):
            return s[:i]
        i += 1
    return s


def _last_math_span(text: str) -> tuple[int, str] | None:
    """(end index, body) of the last complete \\[..\\], $$..$$, \\(..\\) or $..$ span; linear time."""
    best: tuple[int, str] | None = None
    for a, b in (("\\[", "\\]"), ("$$", "$$"), ("\\(", "\\)")):
        end = text.rfind(b)
        if end < 0:
            continue
        start = text.rfind(a, 0, end - (len(a) - 1) if a == b else end)
        if start < 0:
            continue
        body = text[start + len(a) : end]
        if body.strip() and (best is None or end + len(b) > best[0]):
            best = (end + len(b), body)
    # inline $...$: pair single dollars left to right; skip currency ("$18 a day at $2")
    dollars = [m.start() for m in re.finditer(r"(?<![\\$])\$(?!\$)", text)]
    for k in range(len(dollars) - 1 - (len(dollars) % 2), 0, -2):
        start, end = dollars[k - 1], dollars[k]
        body = text[start + 1 : end]
        plain = re.sub(r"\\(?:begin|end|text|mbox|mathrm|textbf|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+", " ", body)
        if body.strip() and len(body) <= 500 and not re.search(r"\b[A-Za-z]{3,}\b", plain):
            if best is None or end + 1 > best[0]:
                best = (end + 1, body)
            break
    return best


_ANSWER_PREFIX_RE = re.compile(r"(?:answer|final answer)\s*[:=]\s*", re.IGNORECASE)
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _strip_wrappers(s: str) -> str:
    """Repeatedly strip whitespace, ``*``, math delimiters around the whole text, trailing
    periods and an "Answer:" prefix, until nothing changes.

    Works on indices into ``s`` (one slice at the end), so it is linear in len(s) even for
    ``$$$$...`` of 400,000 characters (copying the text on every layer was quadratic)."""
    lo, hi = 0, len(s)

    def strip_set(lo: int, hi: int, chars: str | None) -> tuple[int, int]:
        while lo < hi and (s[lo].isspace() if chars is None else s[lo] in chars):
            lo += 1
        while hi > lo and (s[hi - 1].isspace() if chars is None else s[hi - 1] in chars):
            hi -= 1
        return lo, hi

    lo, hi = strip_set(lo, hi, None)
    prev = None
    while (lo, hi) != prev:
        prev = (lo, hi)
        lo, hi = strip_set(lo, hi, None)
        lo, hi = strip_set(lo, hi, "*")
        lo, hi = strip_set(lo, hi, None)
        for a, b in _WRAPPERS:
            if hi - lo >= len(a) + len(b) and s.startswith(a, lo, hi) and s.endswith(b, lo, hi):
                lo, hi = strip_set(lo + len(a), hi - len(b), None)
        while hi > lo and s[hi - 1] == ".":
            hi -= 1
        while hi > lo and s[hi - 1].isspace():
            hi -= 1
        m = _ANSWER_PREFIX_RE.match(s, lo, hi)
        if m:
            lo = m.end()
    return s[lo:hi]


def _inner_box(s: str) -> str | None:
    boxes = find_boxes(s)
    return boxes[-1][2] if boxes else None


def extract_answer(response: str, truncated: bool = False) -> Extraction:
    """Find the final answer in ``response`` following the module policy."""
    if not isinstance(response, str) or not response.strip():
        return Extraction(None, "none")
    text = response[-MAX_SCAN_CHARS:]

    boxes = find_boxes(text)
    if boxes:
        last_start = boxes[-1][0]
        para_start = text.rfind("\n\n", 0, last_start)
        finals = [b for b in boxes if b[0] > para_start]
        contents: list[str] = []
        seen: set[str] = set()  # a set, not list membership: 50,000 boxes must stay linear
        for b in finals:
            c = b[2]
            if c and c not in seen:
                seen.add(c)
                contents.append(c)
        if not contents:
            return Extraction(None, "boxed")
        if len(contents) == 1:
            return Extraction(contents[0], "boxed")
        return Extraction(", ".join(contents), "boxed", hedged=True)

    hashes = list(_HASH_RE.finditer(text))
    if hashes:
        ans = _strip_wrappers(hashes[-1].group(1))
        if ans:
            return Extraction(ans, "hash")

    phrases = list(_PHRASE_RE.finditer(text))
    for m in reversed(phrases[-20:]):
        rest = text[m.end() : m.end() + 4000]
        # "The final answer is:\n\n$$18$$": skip blank lines
        rest = rest.lstrip(" \t:")
        if rest.startswith("\n"):
            rest = rest.lstrip()
        if rest.startswith("$$") or rest.startswith("\\["):
            close = "$$" if rest.startswith("$$") else "\\]"
            end = rest.find(close, 2)
            cand = rest[: end + 2] if end >= 0 else rest
        else:
            cand = _cut_sentence(rest)
        inner = _inner_box(cand)
        cand = _strip_wrappers(inner if inner is not None else cand)
        if cand:
            return Extraction(cand, "phrase")

    if truncated:
        return Extraction(None, "none")

    para_start = text.rstrip().rfind("\n\n")
    last_para = text[para_start + 1 :] if para_start >= 0 else text
    bolds = [b for b in _BOLD_RE.finditer(last_para) if re.search(r"[0-9\\]", b.group(1))]
    if bolds:
        ans = _strip_wrappers(bolds[-1].group(1))
        if ans:
            return Extraction(ans, "bold")

    nums = list(_NUMBER_RE.finditer(text))
    span = _last_math_span(last_para)
    offset = len(text) - len(last_para)
    if span is not None:
        end, body = span
        if not nums or offset + end >= nums[-1].end():
            ans = _strip_wrappers(body)  # '4 \\cdot 3 = 12' stays whole: equivalence reads the right side
            if ans:
                return Extraction(ans, "math")
    if nums:
        return Extraction(nums[-1].group(0).replace(" ", ""), "last_number")
    return Extraction(None, "none")
