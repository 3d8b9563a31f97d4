"""Answer-string normalisation and structure parsing (pure Python, no sympy).

An answer string (a gold, or what :mod:`mathrl.reward.extract` found) is cleaned
(:func:`clean`) and parsed into a small tree (:func:`parse_answer`):

* ``Scalar``   one value: a number, an expression, a letter choice or a text answer;
               carries ``percent`` / ``degree`` flags that were stripped from it.
* ``Seq``      a bracketed, ordered sequence: tuple, point, interval -- the bracket
               characters are kept because for intervals they matter.
* ``Group``    an unordered collection: ``\\{a, b\\}`` (set), a bare ``a, b`` list,
               ``a or b``, ``\\pm``.
* ``Union``    intervals joined by ``\\cup`` (unordered).
* ``Matrix``   ``\\begin{pmatrix}..\\end{pmatrix}`` (and b/v/plain matrix).
* ``Relation`` ``lhs op rhs`` (an equation, or an inequality that is not a simple interval).

Single-variable inequalities (``x > 2``, ``-1 \\le x < 3``) become ``Seq`` intervals, so
``x>2`` equals ``(2, \\infty)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mathrl.latex import find_boxes, last_box, matching_brace
from mathrl.reward.matrices import matrix_expression
from mathrl.reward.numbers import NAMED_SETS, scale_words, strip_units

__all__ = [
    "Scalar",
    "Seq",
    "Group",
    "Union",
    "Matrix",
    "Relation",
    "Node",
    "GuardError",
    "clean",
    "parse_answer",
    "split_top",
    "guard",
]


class GuardError(ValueError):
    """The answer is too large/deep to evaluate safely (reported as reason ``error``)."""


@dataclass(frozen=True)
class Scalar:
    text: str
    percent: bool = False
    degree: bool = False


@dataclass(frozen=True)
class Seq:
    open: str
    close: str
    items: tuple


@dataclass(frozen=True)
class Group:
    items: tuple
    kind: str = "list"  # list | set | hedge


@dataclass(frozen=True)
class Union:
    parts: tuple


@dataclass(frozen=True)
class Matrix:
    rows: tuple  # tuple of tuples of Node


@dataclass(frozen=True)
class Relation:
    lhs: str
    op: str
    rhs: str
    extra: tuple = field(default_factory=tuple)


# A parsed answer is one of: Scalar | Seq | Group | Union | Matrix | Relation
Node = object

# ----------------------------------------------------------------------------- helpers

_OPENERS = "([{"
_CLOSERS = ")]}"


def split_top(s: str, seps: tuple[str, ...]) -> list[str]:
    """Split ``s`` at separators that are outside (), [], {} (LaTeX ``\\{`` counts as a bracket)."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            if s.startswith("\\{", i) or s.startswith("\\lbrace", i):
                depth += 1
            elif s.startswith("\\}", i) or s.startswith("\\rbrace", i):
                depth -= 1
            elif depth == 0:
                for sep in seps:
                    if sep.startswith("\\") and s.startswith(sep, i) and not (
                        i + len(sep) < n and s[i + len(sep)].isalpha()
                    ):
                        parts.append(s[start:i])
                        i += len(sep)
                        start = i
                        break
                else:
                    i += 2
                    continue
                continue
            i += 2
            continue
        if c in _OPENERS:
            depth += 1
        elif c in _CLOSERS:
            depth -= 1
        elif depth == 0:
            hit = False
            for sep in seps:
                if not sep.startswith("\\") and s.startswith(sep, i):
                    parts.append(s[start:i])
                    i += len(sep)
                    start = i
                    hit = True
                    break
            if hit:
                continue
        i += 1
    parts.append(s[start:])
    return parts


def match_close(s: str, i: int) -> int:
    """Index of the bracket closing the one at i (any of )]} closes any of ([{ ), or -1."""
    depth = 0
    j = i
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c in _OPENERS:
            depth += 1
        elif c in _CLOSERS:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return -1


def _brace_arg(s: str, i: int) -> tuple[str, int] | None:
    """If s[i] == '{', return (content, index after closing brace)."""
    if i >= len(s) or s[i] != "{":
        return None
    j = matching_brace(s, i)
    return None if j < 0 else (s[i + 1 : j], j + 1)


def _unwrap_commands(s: str, names: tuple[str, ...], sep: str = "") -> str:
    """Replace ``\\name{X}`` by ``sep X sep`` for each name (nested handled by repetition)."""
    pat = re.compile(r"\\(?:" + "|".join(names) + r")\s*(?=\{)")
    for _ in range(20):
        m = pat.search(s)
        if m is None:
            return s
        arg = _brace_arg(s, m.end())
        if arg is None:
            s = s[: m.start()] + s[m.end() :]
            continue
        content, end = arg
        s = s[: m.start()] + sep + content + sep + s[end:]
    return s


# ----------------------------------------------------------------------------- guard

MAX_ANSWER_CHARS = 2000
MAX_DEPTH = 40
MAX_EXPONENT = 20000
MAX_FACTORIAL = 2000
MAX_EXP_NESTING = 2  # a^{b^{c}} is allowed, a^{b^{c^{d}}} (and \exp(\exp(\exp(x)))) is refused


def _exp_nesting(s: str) -> int:
    """Deepest nesting of exponents: each ``^`` (braced or not) and each ``\\exp(``/``\\exp{``
    opens one level inside the current one. Linear time."""
    stack: list[bool] = []  # one entry per open bracket: does it hold an exponent?
    level = 0
    best = 0
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "^" or (c == "\\" and s.startswith("\\exp", i) and not s[i + 4 : i + 5].isalpha()):
            j = i + 1 if c == "^" else i + 4
            while j < n and s[j].isspace():
                j += 1
            if j < n and s[j] in "({[":
                stack.append(True)
                level += 1
                best = max(best, level)
                i = j + 1
                continue
            best = max(best, level + 1)  # unbraced exponent: one level for the next token
            i = j
            continue
        if c == "\\":
            i += 2
            continue
        if c in _OPENERS:
            stack.append(False)
        elif c in _CLOSERS and stack:
            if stack.pop():
                level -= 1
        i += 1
    return best


def _bracket_before(s: str, close: int) -> str | None:
    """Content of the bracket that closes at ``s[close]`` (scanning back), or None."""
    depth = 0
    for j in range(close, -1, -1):
        if s[j] in _CLOSERS:
            depth += 1
        elif s[j] in _OPENERS:
            depth -= 1
            if depth == 0:
                return s[j + 1 : close]
    return None


def guard(s: str) -> None:
    """Refuse answers that could make sympy hang or exhaust memory.

    Checks: length <= MAX_ANSWER_CHARS; bracket nesting <= MAX_DEPTH; ``\\frac`` nesting;
    integer exponents <= MAX_EXPONENT and no exponent that itself holds a power or factorial
    of a literal (power towers like ``9^{9^{9^9}}``); unbraced power chains (``2^2^2``,
    ``10**10**10``); exponents nested deeper than MAX_EXP_NESTING (``e^{e^{e^{e^{9}}}}``);
    factorial arguments <= MAX_FACTORIAL, also for ``\\Gamma(n)`` and ``\\binom{n}{k}``
    (min(k, n-k) <= MAX_FACTORIAL, no powers or factorials inside), and no power or factorial
    inside a factorial's bracket (``(7^{7})!``).
    Raises GuardError. (The worker pool's hard timeout and memory limit remain the last line.)
    """
    s = s.replace("**", "^")  # the sympy parser reads ``**`` as ``^`` (see symbolic.to_sympy)
    if len(s) > MAX_ANSWER_CHARS:
        raise GuardError(f"answer longer than {MAX_ANSWER_CHARS} characters")
    depth = 0
    for c in s:
        if c in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                raise GuardError(f"nesting deeper than {MAX_DEPTH}")
        elif c in _CLOSERS:
            depth -= 1
    if s.count("\\frac") > 60:
        raise GuardError("too many fractions")
    for m in re.finditer(r"\^\s*", s):
        j = m.end()
        if j < len(s) and s[j] == "{":
            arg = _brace_arg(s, j)
            exp = arg[0] if arg else s[j:]
        elif j < len(s) and s[j] == "(":  # a parenthesised exponent: (10**9)**(10**9)
            k = match_close(s, j)
            exp = s[j:k + 1] if k >= 0 else s[j:]
        else:
            mm = re.match(r"[-+]?\d+|\\?[A-Za-z]+|.", s[j:])
            exp = mm.group(0) if mm else ""
        if re.search(r"\d\s*(\^|!|\\uparrow)", exp):
            raise GuardError("power tower or factorial in an exponent")
        for num in re.findall(r"\d+", exp):
            if len(num) > 6 or int(num) > MAX_EXPONENT:
                raise GuardError(f"exponent {num} larger than {MAX_EXPONENT}")
        if not (j < len(s) and s[j] == "{") and re.match(r"\s*\^", s[j + len(exp) :]):
            raise GuardError("power tower (unbraced power chain)")
    if _exp_nesting(s) > MAX_EXP_NESTING:
        raise GuardError(f"exponents nested deeper than {MAX_EXP_NESTING}")
    for m in re.finditer(r"[)}\]]\s*!", s):
        inner = _bracket_before(s, m.start())
        if inner is not None and (re.search(r"[\^!]|\\uparrow", inner) or re.search(r"\d{5,}", inner)):
            raise GuardError("power or large number inside a factorial")
    for m in re.finditer(r"\\Gamma\s*[({]\s*(\d+)", s):
        if len(m.group(1)) > 5 or int(m.group(1)) > MAX_FACTORIAL + 1:
            raise GuardError(f"Gamma of {m.group(1)} too large")
    for m in re.finditer(r"\\[dt]?binom\s*(?=\{)", s):
        a = _brace_arg(s, m.end())
        b = _brace_arg(s, a[1]) if a else None
        if a is None or b is None:
            continue
        if re.search(r"[\^!]|\\uparrow", a[0] + b[0]):
            raise GuardError("power or factorial inside a binomial coefficient")
        na, nb = a[0].strip(), b[0].strip()
        if re.fullmatch(r"\d{1,12}", na) and re.fullmatch(r"\d{1,12}", nb):
            n_, k_ = int(na), int(nb)
            if min(k_, n_ - k_) > MAX_FACTORIAL:
                raise GuardError(f"binomial coefficient {n_} choose {k_} too large")
        elif re.search(r"\d{7,}", na + nb):
            raise GuardError("binomial coefficient with a huge argument")
    for m in re.finditer(r"(\d+)\s*!", s):
        if len(m.group(1)) > 5 or int(m.group(1)) > MAX_FACTORIAL:
            raise GuardError(f"factorial of {m.group(1)} too large")
    for m in re.finditer(r"(?:\\factorial|factorial)\s*[({]\s*(\d+)", s):
        if int(m.group(1)) > MAX_FACTORIAL:
            raise GuardError(f"factorial of {m.group(1)} too large")
    if re.search(r"\d{400,}", s):
        raise GuardError("number with more than 400 digits")


# ----------------------------------------------------------------------------- cleaning

_UNICODE = {
    "−": "-", "–": "-", "—": "-", "≤": "\\leq ", "≥": "\\geq ", "≠": "\\neq ", "π": "\\pi ",
    "∞": "\\infty ", "×": "\\times ", "·": "\\cdot ", "÷": "\\div ", "√": "\\sqrt", "∪": "\\cup ",
    "\u00a0": " ", "\u2009": " ", "\u202f": " ",
}
_SPACING = re.compile(
    r"\\(?:displaystyle|textstyle|scriptstyle|!|,|;|:|medspace|thinspace|thickspace|enspace)(?![a-zA-Z])"
    r"|\\q?quad"  # also glued to a following name: '\\quadx_2'
)
_LEFTRIGHT = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)(?![a-zA-Z])\s*\.?")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree(?![a-zA-Z])|\bdegrees?\b")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])")
_PERCENT = re.compile(r"\\%|%|\bpercent\b")
_CURRENCY = re.compile(r"\\\$|\$|€|£|¥|\bUSD\b|\bdollars?\b|\bcents?\b|\beuros?\b")
_TEXT_CMDS = ("text", "textbf", "textit", "textrm", "textsf", "texttt", "mbox", "mathrm", "mathbf",
              "mathit", "mathsf", "mathtt", "boldsymbol", "bm", "hbox", "emph", "textnormal")
def _sympy_eq(s: str) -> str:
    """sympy's printed equation ``Eq(lhs, rhs)`` as ``lhs = rhs`` (the comma at depth 0 of the call)."""
    m = re.fullmatch(r"\s*Eq\s*\((.*)\)\s*", s, re.DOTALL)
    parts = split_top(m.group(1), (",",)) if m else []
    return f"{parts[0].strip()} = {','.join(parts[1:]).strip()}" if len(parts) > 1 else s


def clean(s: str) -> tuple[str, bool, bool]:
    """Clean an answer string; returns (text, had_percent, had_degree).

    Removes math delimiters, ``\\boxed``, ``\\left/\\right``, spacing commands, ``\\dfrac`` ->
    ``\\frac``, text/font wrappers (content kept), currency, thousands separators, trailing units
    and final periods. Percent and degree signs are removed and reported as flags.
    """
    s = s.strip()
    # a doubled backslash before a command ('\\\\left(\\\\frac{4}{5}...', escaped twice) is the command;
    # three in a row are a row break followed by the command ('1\\\sqrt2' in a matrix)
    s = re.sub(r"(?<!\\)\\\\(?=(?:left|right|frac|dfrac|tfrac|sqrt|pi|cdot|times|infty|boxed|text|begin|end)(?![a-zA-Z]))",
               r"\\", s)
    boxes = [b[2] for b in find_boxes(s)]
    if len(boxes) > 1:  # a gold written as several boxes ('\\boxed{1} and \\boxed{-2}'): one list
        s = ", ".join(dict.fromkeys(boxes))
    elif boxes or last_box(s) is not None:
        s = last_box(s)
    for a, b in _UNICODE.items():
        s = s.replace(a, b)
    s = s.strip()
    s = _sympy_eq(s)
    for _ in range(3):
        for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(a) and s.endswith(b) and len(s) >= len(a) + len(b):
                s = s[len(a) : len(s) - len(b)].strip()
    s = re.sub(r"(?<=\d),\s*\\[!,]\s*(?=\d{3}(?!\d))", ",", s)  # 11,\! 111,\! 100 -> 11,111,100
    s = re.sub(r"(?<=\d)\\[!,](?=\d{3}(?!\d))", "", s)  # 1\,000 -> 1000
    s = _SPACING.sub(" ", s)
    s = re.sub(r"(?<!\\)\\ ", " ", s).replace("~", " ")
    s = _LEFTRIGHT.sub("", s)
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\sqrt\s*(\[[^\]]*\])?\s*([0-9A-Za-z])", r"\\sqrt\1{\2}", s)  # \sqrt[3]2, \sqrt2
    s = re.sub(r"\\(mathcal|mathbb|mathfrak|mathscr)\s+([A-Za-z])", r"\\\1{\2}", s)  # \mathcal B
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    s = re.sub(r"\\(?:leqslant|le)(?![a-zA-Z])", r"\\leq ", s)
    s = re.sub(r"\\(?:geqslant|ge)(?![a-zA-Z])", r"\\geq ", s)
    s = re.sub(r"\\(?:ne)(?![a-zA-Z])", r"\\neq ", s)
    s = s.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    s = s.replace("<=", "\\leq ").replace(">=", "\\geq ").replace("!=", "\\neq ")
    s = re.sub(r"\\operatorname\s*\{([^{}]*)\}", r"\\\1", s)
    s = _unwrap_commands(s, _TEXT_CMDS, " ")
    s = re.sub(r"\\pmod\s*\{[^{}]*\}|\\pmod\s*\w+|\(\s*\\?mod\s*\w+\s*\)|\\bmod\s*\w+|\\mod\s*\w+", " ", s)
    s = re.sub(r"\s+\^", "^", s)
    if _TRIG.search(s):  # sin(90^\circ - x): the degree sign is a unit of the argument
        s = re.sub(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°)", r"(\1\\pi/180)", s)
    degree = bool(_DEGREE.search(s))
    s = _DEGREE.sub(" ", s)
    percent = bool(_PERCENT.search(s))
    s = _PERCENT.sub(" ", s)
    s = _CURRENCY.sub(" ", s)
    s = s.replace("{,}", "")
    # thousands separators: 1,234,567(.89) as a whole token; 1 234 567 with single spaces
    # (not directly inside brackets: "(12,102)" is a pair, not twelve thousand one hundred two)
    s = re.sub(r"(?<![\d.,(\[])\d{1,3}(?:,\d{3})+(?![\d,)\]])", lambda m: m.group(0).replace(",", ""), s)
    s = re.sub(r"(?<![\d.])\d{1,3}(?: \d{3})+(?![\d])", lambda m: m.group(0).replace(" ", ""), s)
    s = re.sub(r"\s+", " ", s).strip()
    approx = split_top(s, ("\\approx",))
    if len(approx) > 1 and approx[0].strip():
        # '\sqrt{65} \approx 8.06': keep the exact value; 'x \approx 11': the value of x
        s = approx[-1].strip() if is_var(approx[0]) else approx[0].strip()
    s = scale_words(s)
    s = NAMED_SETS.get(re.sub(r"[\s{}]", "", s).lower(), s)
    # '5 (which is 500 cents)' -> '5'; '5 ft (60 inches)' -> '5 ft' (a conversion after the unit)
    paren = re.fullmatch(r"(.*?[\d}](\s*[A-Za-z]+){0,2})\s*\(([^()]*)\)", s)
    if paren and (re.search(r"[A-Za-z]{3,}", re.sub(r"\\[A-Za-z]+", "", paren.group(3)))
                  or (paren.group(2) and re.fullmatch(r"\s*=?\s*[\d.,]+\s*[A-Za-z]{1,2}\s*", paren.group(3)))):
        s = paren.group(1).strip()
    s = re.sub(r"^(?:[A-Za-z](?:_\{?\w+\}?)?\s*\\in\s*)", "", s)  # 'x \in (1,2)'
    s = re.sub(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*", "", s, flags=re.IGNORECASE)
    s = s.rstrip(" .;:\\")
    s = s.lstrip(":").strip()
    if s.startswith("{") and match_close(s, 0) == len(s) - 1:  # {1,2,3}: LaTeX grouping, not a set
        s = s[1:-1].strip()
    s = strip_units(s)
    return s, percent, degree


# ----------------------------------------------------------------------------- structure

_REL_OPS = ("\\leq", "\\geq", "\\neq", "=", "<", ">")
_MATRIX_RE = re.compile(r"^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL)
_VAR_RE = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?(?:\([A-Za-z]\))?$|^\\(?:theta|alpha|beta|gamma|phi|lambda|mu|omega|rho|sigma|tau|psi)$")
_CHOICE_RE = re.compile(r"^\(?([A-Ea-e])\)?$")


def is_var(s: str) -> bool:
    """A simple variable name such as x, y_1, f(x), \\theta (left side of an assignment)."""
    return bool(_VAR_RE.match(s.strip()))


def _relation_parts(s: str) -> tuple[list[str], list[str]]:
    """Split at top-level relation operators; returns (operands, operators)."""
    operands: list[str] = []
    ops: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            hit = None
            if depth == 0:
                for op in ("\\leq", "\\geq", "\\neq", "\\lt", "\\gt"):
                    if s.startswith(op, i) and not (i + len(op) < n and s[i + len(op)].isalpha()):
                        hit = op
                        break
            if hit:
                operands.append(s[start:i])
                ops.append({"\\lt": "<", "\\gt": ">"}.get(hit, hit))
                i += len(hit)
                start = i
                continue
            if s.startswith("\\{", i):
                depth += 1
            elif s.startswith("\\}", i):
                depth -= 1
            i += 2
            continue
        if c in _OPENERS:
            depth += 1
        elif c in _CLOSERS:
            depth -= 1
        elif depth == 0 and c in "=<>":
            operands.append(s[start:i])
            ops.append(c)
            i += 1
            start = i
            continue
        i += 1
    operands.append(s[start:])
    return [o.strip() for o in operands], ops


def _interval_from_inequality(operands: list[str], ops: list[str]) -> Seq | None:
    """x > a -> (a, oo); a <= x < b -> [a, b); None if not a one-variable inequality."""
    lt = {"<": True, "\\leq": True, ">": False, "\\geq": False}
    if any(o not in lt for o in ops):
        return None
    strict = {"<": True, ">": True, "\\leq": False, "\\geq": False}
    if len(ops) == 1:
        a, b = operands
        flip = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq"}
        if a.startswith("-") and is_var(a[1:]) and not is_var(b):  # -x > -1  ->  x < 1
            return _interval_from_inequality([a[1:].strip(), f"-({b})"], [flip[ops[0]]])
        if b.startswith("-") and is_var(b[1:]) and not is_var(a):  # -1 < -x  ->  1 > x
            return _interval_from_inequality([f"-({a})", b[1:].strip()], [flip[ops[0]]])
        if is_var(a) and not is_var(b):
            var_left, bound, op = True, b, ops[0]
        elif is_var(b) and not is_var(a):
            var_left, bound, op = False, a, ops[0]
        else:
            return None
        upper = lt[op] if var_left else not lt[op]  # x < b  -> bound is upper
        if upper:
            return Seq("(", ")" if strict[op] else "]", (Scalar("-\\infty"), Scalar(bound)))
        return Seq("(" if strict[op] else "[", ")", (Scalar(bound), Scalar("\\infty")))
    if len(ops) == 2 and is_var(operands[1]) and lt[ops[0]] == lt[ops[1]]:
        lo, hi = (operands[0], operands[2]) if lt[ops[0]] else (operands[2], operands[0])
        o_lo, o_hi = (ops[0], ops[1]) if lt[ops[0]] else (ops[1], ops[0])
        return Seq("(" if strict[o_lo] else "[", ")" if strict[o_hi] else "]", (Scalar(lo), Scalar(hi)))
    return None


def _scalar(s: str, percent: bool, degree: bool):
    s = s.strip()
    pm = split_top(s, ("\\pm", "\\mp"))
    if len(pm) == 2:
        a, b = pm[0].strip(), pm[1].strip()
        items = (Scalar(f"{a}+({b})" if a else f"{b}", percent, degree),
                 Scalar(f"{a}-({b})" if a else f"-({b})", percent, degree))
        return Group(items, "list")
    return Scalar(s, percent, degree)


def parse_answer(s: str, _depth: int = 0):
    """Clean ``s`` and parse it into a Node (see module docstring)."""
    if _depth > 8:
        raise GuardError("answer structure nested too deeply")
    text, percent, degree = clean(s) if _depth == 0 else (s.strip(), False, False)
    return parse_node(text, percent, degree, _depth)


def parse_node(s: str, percent: bool, degree: bool, depth: int):
    s = s.strip()
    if depth > 8:
        raise GuardError("answer structure nested too deeply")
    rec = lambda t: _parse_item(t, percent, degree, depth + 1)  # noqa: E731
    if _CHOICE_RE.match(s) and (s.startswith("(") or s.isupper()):
        return Scalar(s.strip("()").upper(), percent, degree)
    # unions of intervals
    parts = split_top(s, ("\\cup",))
    if len(parts) > 1:
        return Union(tuple(rec(p) for p in parts))
    wrapped = re.fullmatch(r"[\[(]\s*(\\begin\{array\}.*\\end\{array\})\s*[\])]", s, re.DOTALL)
    if wrapped:  # \left[\begin{array}{cc}..\end{array}\right]: a matrix in explicit brackets
        s = wrapped.group(1)
    if "\\begin{" in s:  # matrix arithmetic written out: A + B, 2A, A B
        entries = matrix_expression(s, split_top)
        if entries is not None:
            return Matrix(tuple(tuple(rec(c) for c in row) for row in entries))
    m = _MATRIX_RE.match(s)
    if m:
        body = m.group(2).strip()
        rows = [r for r in re.split(r"\\\\(?:\[[^\]]*\])?", body) if r.strip()]
        return Matrix(tuple(tuple(rec(c) for c in split_top(r, ("&",))) for r in rows))
    # top-level lists
    items = [p for p in split_top(s, (",", ";", " and ", " or ", "\\text{ or }")) if p.strip()]
    if len(items) > 1:
        return Group(tuple(rec(p) for p in items), "list")
    # sets
    if s.startswith("\\{") and s.endswith("\\}"):
        inner = s[2:-2]
        inner_items = [p for p in split_top(inner, (",", ";")) if p.strip()]
        return Group(tuple(rec(p) for p in inner_items), "set")
    # bracketed sequences
    if s and s[0] in "([" and match_close(s, 0) == len(s) - 1 and s[-1] in ")]":
        inner = s[1:-1]
        inner_items = split_top(inner, (",",))
        if len(inner_items) > 1:
            return Seq(s[0], s[-1], tuple(rec(p) for p in inner_items))
        if s[0] == "(" and s[-1] == ")":
            return parse_node(inner, percent, degree, depth + 1)
    # relations
    operands, ops = _relation_parts(s)
    if ops:
        iv = _interval_from_inequality(operands, ops)
        if iv is not None:
            return iv
        if ops == ["\\neq"] and is_var(operands[0]) and not is_var(operands[1]):
            # x != a  ->  (-oo, a) U (a, oo)
            a = Scalar(operands[1])
            return Union((Seq("(", ")", (Scalar("-\\infty"), a)), Seq("(", ")", (a, Scalar("\\infty")))))
        if all(o == "=" for o in ops):
            return Relation(operands[0], "=", operands[-1], tuple(operands[1:-1]))
        if len(ops) == 1:
            return Relation(operands[0], ops[0], operands[1])
    return _scalar(s, percent, degree)


def _parse_item(s: str, percent: bool, degree: bool, depth: int):
    """Items inside a structure are cleaned again (each may carry its own units/%)."""
    t, p2, d2 = clean(s)
    return parse_node(t, percent or p2, degree or d2, depth)
