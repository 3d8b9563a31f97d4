"""Final-answer extraction from a model response (pure Python, linear-time, no sympy).

Policy (tested in tests/reward/test_reward_extract.py and test_reward_generalisation.py):

**The last committed answer wins.** Explicit markers are

1. ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces; also the brace-less ``\\boxed 5``, which takes
   the token up to the next space or ``$``: ``\\boxed -3/4$`` is ``-3/4``; see :mod:`mathrl.latex`).
   An unclosed box (the text was cut inside it) is ignored.
2. ``#### N`` (GSM8K style), up to the end of its line; ``<answer>N</answer>`` (the R1 output format,
   after ``<think>...</think>``).
3. A phrase: "final answer: X", "the final answer is X", "the answer is X", "Answer: X", and the same
   in Chinese (答案是), French (réponse), Spanish, German, Portuguese, Italian and Russian. X runs to
   the end of the sentence or line (a decimal point is not a sentence end); when X is a sentence
   ("The largest $n$ is 34") the value it states is taken ("34").

Of these, the one that occurs last in the response is the answer: "... \\boxed{3} ... The final
answer is $10,455$" gives 10,455. A bare "answer:" after a box does not override it ("we may check
our answer: ...").

**Self-correction vs hedging.** All boxes of the paragraph holding the last box are collected; a
correction between two of them ("wait", "actually", "I made a mistake", "let me recheck", "no,", ...)
withdraws the boxes before it, and so does an announcement ("the final answer is", "the answer is": the
boxes before it were intermediate results). If the remaining boxes disagree, the answer is the comma-joined list
of them (``hedged=True``) and equivalence credits it only when every item equals the gold (or the
gold is itself a list that matches). "3 or 4" inside one answer is split the same way. So listing
candidates is never rewarded, while ``\\boxed{3}, \\boxed{\\pi/2}`` for an ordered pair, or a list
of all solutions, still is.

**No marker.**

4. A response that is itself one answer (one short line or one display: ``\\frac{10}{9}``, ``.4``,
   ``3+2``, ``(p,q)=(3,2)``, ``2 million``, ``10weeks``, ``$odd$``) is the answer as a whole (``bare``).
5. ``**bold**`` text in the last paragraph that contains a digit or a LaTeX command.
6. The right-hand side of the last display/inline math span of the last paragraph, if it ends after
   the last number; else the last number (a time of day such as ``7:30 pm`` counts as one number),
   except that a number inside a trailing comparison clause of the last sentence ("12 apples, which
   is 3 more than 9", "12 apples, 3 more than Tom") is the compared quantity: the number before the
   clause is taken; and a last number that is the bound of an inequality or comparison ("$a > 2$",
   "less than or equal to $1$") is no answer at all.

Steps 4-6 apply only to a finished response: not when the sampler cut it at the length limit
(``truncated=True``), not when it visibly stops mid-sentence (it ends on an operator, an open
bracket, a comma or a function word: "... and then we multiply by"), and not when its last sentence
rejects the value ("$x = 4$ is not the answer"). An unfinished response is not a committed answer.
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
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)  # DeepSeek-R1 style output format
_PHRASE_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|:|=)|the\s+answer\s+is|\banswer\s*:"
    r"|答案\s*(?:是|为|為|:|：)|最终答案\s*(?:是|为|:|：)?"
    r"|r[ée]ponse(?:\s+finale)?\s*(?:est|:)|respuesta(?:\s+final)?\s*(?:es|:)|antwort\s*(?:ist|:)"
    r"|resposta(?:\s+final)?\s*(?:é|:)|risposta(?:\s+finale)?\s*(?:è|:)|ответ\s*:)\s*",
    re.IGNORECASE,
)
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,300}?)\*\*")
_NUMBER_RE = re.compile(  # a time of day (7:30 pm) counts as one number; a unit may be glued: 10weeks
    r"(?<![\w.:])\d{1,2}:[0-5]\d(?::[0-5]\d)?(?:\s*[ap]\.?\s?m\b\.?)?(?![\d:])"
    r"|(?<![\w.])-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+(?:\.\d+)?)?(?![\d_]|[.,]\d)"
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


# A correction between two boxes ("\boxed{3} ... wait, I made a mistake ... \boxed{5}"): the boxes
# before it are withdrawn, so the later one is the committed answer, not a hedge.
_CORRECTION_RE = re.compile(
    r"\b(?:wait|actually|correction|corrected|mistake|oops|sorry|re-?check\w*|recalculat\w*|recomput\w*|"
    r"reconsider\w*|re-?evaluat\w*|redo|instead|let\s+me\s+(?:check|fix|correct|re\w+)|that(?:'s|\s+is)\s+"
    r"(?:wrong|incorrect|not\s+right))\b|\bno\s*,",
    re.IGNORECASE,
)
# An announcement between two boxes ("First we get \boxed{10}. Then the final answer is \boxed{42}"): the boxes
# before it were intermediate results, so the announced one is the answer, not one of several candidates.
_ANNOUNCED_RE = re.compile(r"\bfinal\s+answer\b|\b(?:the|my|our)\s+answer\s+(?:is|would\s+be|will\s+be)\b",
                           re.IGNORECASE)
# Words that end a phrase candidate which is not an answer ("the answer is correct because ...").
_NOT_ANSWER_WORDS = {"correct", "right", "wrong", "incorrect", "not", "that", "this", "as", "below", "above",
                     "follows", "given", "shown", "clear", "simple", "obtained", "found", "calculated"}
# a sentence stating its answer: "The largest $n$ is 34", "so the total cost will be 18 dollars"
_STATEMENT_RE = re.compile(r"(?:\bis\b|\bare\b|\bwas\b|\bequals?\b|\bbe\b|\bgives\b|=|：|:)\s*", re.IGNORECASE)
# how a response that stopped mid-sentence ends: a function word, an operator or an open bracket
_DANGLING_WORDS = {"a", "an", "the", "and", "or", "of", "to", "by", "is", "are", "was", "were", "be", "we",
                   "then", "so", "that", "with", "for", "in", "on", "at", "as", "if", "than", "into", "from",
                   "get", "gets", "gives", "equals", "multiply", "add", "subtract", "divide", "which",
                   "our", "their", "has", "have", "will", "can", "would", "let", "since",
                   "because", "there", "each", "per", "plus", "minus", "times"}
_WORD_RE = re.compile(r"[^\W\d_]{3,}")  # a word of three or more letters (any script)
# words in a line of math: function names, and runs of capitals (segment and point names: AB, CD)
_MATH_WORDS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "max", "min", "gcd", "lcm", "mod",
               "det", "deg", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "sqrt", "ln", "pi", "abs", "eq"}
_TALK_RE = re.compile(r"(?<![\\A-Za-z])(?=[A-Za-z]*[a-z])[A-Za-z]{2,}")
_SCALE_OR_UNIT_TAIL = re.compile(r"^(?:[^\W\d_]+\.?)(?:\^\{?\d\}?|[²³])?$")


def _plain_words(s: str) -> list[str]:
    """Words of two or more letters (with a lower-case one) outside LaTeX commands, math-font and
    environment wrappers, and function names: the talk around an answer ('so it is'), not its math."""
    t = re.sub(r"\\begin\s*\{array\}\s*\{[^{}]*\}", " ", s)  # the column spec {cc}
    t = re.sub(r"\\(?:text|mathrm|textbf|mbox|operatorname|mathcal|mathbb|mathbf|begin|end)\s*\{[^{}]*\}", " ", t)
    t = re.sub(r"\\[A-Za-z]+", " ", t)
    words = [w for w in _TALK_RE.findall(t) if w.lower() not in _MATH_WORDS]
    return words + [w for w in re.findall(r"[^\W\d_A-Za-z]+", t)]  # other scripts


def _bare_answer(text: str) -> str | None:
    """The whole response when it is itself one answer (``\\frac{10}{9}``, ``.4``, ``3+2``,
    ``(p,q)=(3,2)``, ``2 million``, ``10weeks``): one line (or one math display), short, and no
    words except at most two trailing unit or scale words after a number."""
    s = text.strip()
    if not s or len(s) > 300:
        return None
    body = _strip_wrappers(s)
    one_env = re.fullmatch(r"\\begin\{(\w+\*?)\}.*\\end\{\1\}", body, re.DOTALL)  # a matrix over lines
    if not body or ("\n" in body and not one_env
                    and not re.fullmatch(r"\s*(?:\$\$|\\\[).*(?:\$\$|\\\])\s*", s, re.DOTALL)):
        return None
    if len(body.split()) <= 3 and re.fullmatch(r"(?:\$[^$]+\$|\\\(.+\\\)|\\\[.+\\\])", s, re.DOTALL):
        return body  # the whole response is one math span: $odd$, $\text{Even}$
    paren = re.fullmatch(r"(.*?[\d}])\s*\(([^()]*)\)\.?", body)  # '5 (which is 500 cents)'
    if paren and _plain_words(paren.group(2)):
        body = paren.group(1).strip()
    words = _plain_words(body)
    if words and re.fullmatch(r"[-+]?[\d.,]*\d[^\W\d_]+", body):  # glued unit: 10weeks
        return body
    if words:
        tail = body.split()
        if len(words) > 2 or len(tail) < 2 and not re.match(r"[-+.\d]", body):
            return None
        # the words must be the last tokens, after a number ("2 million", "18 apples", "10weeks")
        k = len(tail)
        while k > 0 and _SCALE_OR_UNIT_TAIL.match(tail[k - 1]) and _WORD_RE.search(tail[k - 1]):
            k -= 1
        head = " ".join(tail[:k]) if k else re.match(r"[-+.\d,\s]*", body).group(0)
        if not re.search(r"\d", head) or _plain_words(head) or len(tail) - k > 2:
            return None
    return body


_REJECTED_RE = re.compile(r"\b(?:is\s+not|isn't|are\s+not|aren't)\s+(?:the\s+|a\s+)?(?:answer|solution|correct|right)\b",
                         re.IGNORECASE)


def _last_sentence(text: str) -> str:
    t = text.rstrip()
    cut = max(t.rfind(". ", 0, len(t) - 1), t.rfind("\n", 0, len(t) - 1))
    return t[cut + 1:]


# a clause after the answer that compares it with another quantity: "12 apples, which is 3 more than 9",
# "12 apples, 3 more than Tom", "24, twice as many as before"
_COMPARISON_RE = re.compile(
    r",\s*(?:(?:which|that|this)\s+(?:is|was|are|were|makes)\s+)?[^,.;]{0,30}?\b(?:more|less|fewer|greater|larger|"
    r"smaller|bigger|higher|lower)\s+than\b|,\s*(?:which|that|this)\s+(?:is|was|are|were)\s+[^,.;]{0,20}?\b(?:twice|"
    r"times|half)\b|,\s*(?:twice|\w+\s+times)\s+as\s+(?:many|much)\b", re.IGNORECASE)


def _number_before_comparison(sentence: str) -> str | None:
    """The last number before a trailing comparison clause of ``sentence`` ("The total is 12 apples,
    which is 3 more than 9." -> "12"): the numbers inside the clause are the compared quantities, not
    the answer. None when the sentence has no such clause or no number before it."""
    m = _COMPARISON_RE.search(sentence)
    if m is None:
        return None
    before = list(_NUMBER_RE.finditer(sentence, 0, m.start()))
    return before[-1].group(0).replace(" ", "") if before else None


# what makes the number after it a bound, not a value: "x > 2", "\\geq 3", "less than or equal to $1$"
_BOUND_BEFORE_RE = re.compile(r"(?:[<>≤≥]|\\(?:geq?|leq?|gt|lt|ge|le)\b"
                              r"|\b(?:more|less|fewer|greater|larger|smaller)\s+than(?:\s+or\s+equal\s+to)?)[\s${]*$",
                              re.IGNORECASE)


def _is_bound(text: str, start: int) -> bool:
    """Whether the number starting at ``start`` is the bound of an inequality or comparison."""
    return _BOUND_BEFORE_RE.search(text, max(0, start - 40), start) is not None


def _ends_mid_sentence(text: str) -> bool:
    """Whether the response visibly stops mid-reasoning: it ends with an operator, an open bracket,
    a comma or colon, or a function word ("... and then we multiply by")."""
    t = text.rstrip().rstrip("*").rstrip()
    if not t:
        return True
    if t[-1] in ",:;([{+-/=\\" or re.search(r"\\(?:times|cdot|div|frac|sqrt)\s*$", t):
        return True
    m = re.search(r"([A-Za-z]+)\s*$", t)
    return bool(m) and m.group(1).lower() in _DANGLING_WORDS


def _answer_in_statement(cand: str) -> str:
    """The value a one-sentence phrase answer states: "The largest $n$ is 34" -> "34"; a candidate
    without words is returned as it is."""
    if not _plain_words(cand):
        return cand
    parts = list(_STATEMENT_RE.finditer(cand))
    for m in reversed(parts):
        rest = _strip_wrappers(cand[m.end():])
        if rest and re.search(r"[\d\\]", rest) and len(_plain_words(rest)) <= 2:
            return rest
    return cand


def _box_answer(text: str, boxes: list) -> tuple[str | None, bool]:
    """(answer, hedged) from the boxes of the paragraph holding the last box; boxes before a
    correction in that paragraph are withdrawn."""
    last_start = boxes[-1][0]
    para_start = text.rfind("\n\n", 0, last_start)
    finals = [b for b in boxes if b[0] > para_start]
    for k in range(len(finals) - 1, 0, -1):
        between = (finals[k - 1][1], finals[k][0])
        if _CORRECTION_RE.search(text, *between) or _ANNOUNCED_RE.search(text, *between):
            finals = finals[k:]
            break
    contents: list[str] = []
    seen: set[str] = set()  # a set, not list membership: 50,000 boxes must stay linear
    for b in finals:
        c = b[2]
        if c and c not in seen:
            seen.add(c)
            contents.append(c)
    if not contents:
        return None, False
    if len(contents) == 1:
        return contents[0], False
    return ", ".join(contents), True


_WEAK_PHRASE_RE = re.compile(r"answer\s*:\s*$", re.IGNORECASE)


def _phrase_answer(text: str, after: int = -1) -> tuple[int, str] | None:
    """(position, answer) of the last answer phrase with a usable answer after it. Phrases that
    start at or before ``after`` are ignored; so is a bare "answer:" after it ("we may check our
    answer: ..."), which does not override an earlier box."""
    phrases = [m for m in _PHRASE_RE.finditer(text)
               if m.start() > after and not (after >= 0 and _WEAK_PHRASE_RE.match(m.group(0)))]
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
        if inner is None:
            cand = _answer_in_statement(cand)
        first = cand.split()[0].lower().strip(".,;:") if cand.split() else ""
        if cand and first not in _NOT_ANSWER_WORDS:
            return m.start(), cand
    return None


def extract_answer(response: str, truncated: bool = False) -> Extraction:
    """Find the final answer in ``response`` following the module policy."""
    if not isinstance(response, str) or not response.strip():
        return Extraction(None, "none")
    text = response[-MAX_SCAN_CHARS:]

    boxes = find_boxes(text)

    # explicit markers: the last committed one wins (a box, a '#### N' line, an answer phrase)
    marks: list[tuple[int, Extraction]] = []
    if boxes:
        ans, hedged = _box_answer(text, boxes)
        marks.append((boxes[-1][0], Extraction(ans, "boxed", hedged=hedged)))
    hashes = list(_HASH_RE.finditer(text))
    if hashes:
        ans = _strip_wrappers(hashes[-1].group(1))
        if ans:
            marks.append((hashes[-1].start(), Extraction(ans, "hash")))
    tags = [m for m in _TAG_RE.finditer(text) if _strip_wrappers(m.group(1))]
    if tags:
        marks.append((tags[-1].start(), Extraction(_strip_wrappers(tags[-1].group(1)), "tag")))
    phrase = _phrase_answer(text, after=boxes[-1][0] if boxes else -1)  # after a box, only to override it
    if phrase is not None:
        marks.append((phrase[0], Extraction(phrase[1], "phrase")))
    if marks:
        return max(marks, key=lambda m: m[0])[1]
    if truncated:
        return Extraction(None, "none")
    bare = _bare_answer(text)
    if bare is not None:
        return Extraction(bare, "bare")
    if _ends_mid_sentence(text):
        return Extraction(None, "none")

    para_start = text.rstrip().rfind("\n\n")
    last_para = text[para_start + 1 :] if para_start >= 0 else text
    if _REJECTED_RE.search(_last_sentence(last_para)):  # "$x = 4$ is not the answer."
        return Extraction(None, "none")
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
            if ans and _is_bound(text, text.rfind(body, 0, offset + end)):
                return Extraction(None, "none")  # "less than or equal to $1$": a bound, not a value
            if ans:
                return Extraction(ans, "math")
    if nums:
        stated = _number_before_comparison(_last_sentence(last_para))
        if stated is None and _is_bound(text, nums[-1].start()):
            return Extraction(None, "none")  # "a > 2", "less than or equal to $1$": a bound, not a value
        return Extraction(stated or nums[-1].group(0).replace(" ", ""), "last_number")
    return Extraction(None, "none")
