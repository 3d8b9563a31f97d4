"""Seeded generator of hostile model outputs, for fuzzing the verifier and the reward path.

Issue 10 ("Hostile model output") asks that :func:`mathrl.reward.grade_batch` and
:func:`mathrl.reward.compute_rewards` survive anything a policy can emit: no exception, no hang past
the timeout, bounded memory. This module produces such inputs deterministically from a seed, so a
failure found by ``scripts/fuzz_verifier.py`` (100,000 cases) or by
``tests/reward/test_hostile_outputs.py`` (a CI-sized sample) can be replayed exactly.

It lives in :mod:`mathrl.testing` (tools for tests, not used by training), not under
``scripts/``, because both the fuzz script and the test suite import it, and because a user who
changes the verifier can fuzz their change with the same inputs:
``python scripts/fuzz_verifier.py --cases 5000``. It is pure Python and imports nothing heavy.

Categories (``CATEGORIES``; the weight is the share of generated cases):

* ``tower``         power towers and huge exponents: ``9^{9^{9^{9}}}``, ``10**10**10``, ``2^2^2^2``
* ``frac_nest``     ``\\frac`` (and ``\\sqrt``, brackets, braces) nested up to ~1000 deep
* ``unbalanced``    unbalanced braces/brackets, ``\\boxed{`` never closed, dangling environments
* ``megabyte``      ~1 MB outputs: digits, ``{``, ``}``, ``\\boxed{1}`` repeated, ``$``, backslashes
* ``control``       control characters, NUL bytes, escape sequences, bidi overrides, odd Unicode
* ``surrogate``     lone UTF-16 surrogates (``"\\ud800"``), which cannot be encoded as UTF-8
* ``bad_escape``    invalid / half LaTeX commands and escapes (``\\frac{}{}``, ``\\sqrt[``, ``\\x``)
* ``sympy_slow``    LaTeX that makes a CAS slow: ``100000!``, ``\\binom{10^9}{10^8}``, nested
                    ``\\sqrt``, large matrices, ``\\int``, ``\\sum_{i=1}^{10^{10}}``, big powers
* ``many_boxes``    thousands of ``\\boxed{}`` in one answer, boxes nested in boxes
* ``mutation``      random mutations of realistic responses (and their golds)
* ``random_text``   random code points from mixed alphabets (LaTeX tokens, Unicode, controls)
* ``hostile_gold``  a hostile *gold* answer with a normal or hostile response

Every case carries ``unrelated``: True when the gold has nothing to do with the response (one of
:data:`UNRELATED_GOLDS`, whose numbers the generator never emits), so a ``correct`` verdict for
it is a verifier bug. Mutations graded against their own gold, and hostile golds, have
``unrelated=False`` (a correct verdict may be right there).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "HostileCase",
    "CATEGORIES",
    "UNRELATED_GOLDS",
    "REALISTIC",
    "generate",
    "named_cases",
    "make_case",
]

MB = 1 << 20

# Golds that no generated response may legitimately equal: their numbers (7919, 104729) are
# never produced by the generator's number helpers, and the text gold is not a generated word.
UNRELATED_GOLDS: tuple[str, ...] = (
    "-104729",
    "\\frac{7919}{104729}",
    "7919\\sqrt{104729}",
    "(7919, -104729)",
    "x^2 + 7919x - 104729",
    "\\text{Wednesday}",
    "[-7919, 104729)",
    "\\begin{pmatrix} 7919 \\\\ 104729 \\end{pmatrix}",
    "104729\\pi",
)
_FORBIDDEN_INTS = {7919, 104729}

# Realistic (response, gold) pairs used as mutation seeds when no others are given.
REALISTIC: tuple[tuple[str, str], ...] = (
    ("Janet has 16 - 3 - 4 = 9 eggs left. 9 * 2 = 18.\n#### 18", "18"),
    ("We have $x^2 - 5x + 6 = 0$, so $(x-2)(x-3)=0$.\n\nThe solutions are $\\boxed{2, 3}$.", "2, 3"),
    ("The area is $\\pi r^2 = 25\\pi$.\n\nFinal Answer: The final answer is $25\\pi$. I hope it is correct.",
     "25\\pi"),
    ("Let $s = \\sin\\theta$. Then $\\frac{\\sqrt{2}}{2}$ is the value.\n\n$\\boxed{\\frac{\\sqrt{2}}{2}}$",
     "\\frac{1}{\\sqrt{2}}"),
    ("The matrix is $\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$.",
     "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"),
    ("Solving, $x > 2$ so the answer is $(2, \\infty)$.", "(2,\\infty)"),
    ("He pays 3 * $1.50 = $4.50 in total.\nThe answer is 4.5", "4.50"),
    ("**Step 1.** Compute $2^{10} = 1024$.\n\n**Answer: 1024**", "1024"),
    ("Thus $a_n = 3n + 1$ and $a_{10} = 31$. \\[ \\boxed{31} \\]", "31"),
    ("The probability is $\\dfrac{3}{8} = 37.5\\%$, i.e. $\\boxed{\\frac{3}{8}}$.", "\\frac{3}{8}"),
    ("So $y = 2x + 3$.\n\nThe line is $\\boxed{y = 2x + 3}$", "y=2x+3"),
    ("The set of solutions is $\\boxed{\\{-1, 1\\}}$.", "\\{1,-1\\}"),
    ("It takes 3 hours and 20 minutes, so the answer is 200 minutes.", "200"),
    ("The answer is (C).", "C"),
    ("We get $\\sqrt{50} = 5\\sqrt{2}$, so the final answer is $5\\sqrt{2}$", "5\\sqrt 2"),
)


@dataclass(frozen=True)
class HostileCase:
    """One fuzz input.

    category:  which generator made it (one of CATEGORIES).
    response:  the model output to grade.
    gold:      the gold answer.
    unrelated: True when no correct verdict is possible (gold from UNRELATED_GOLDS).
    truncated: the ``truncated`` flag passed to the verifier (sampler hit the length limit).
    """

    category: str
    response: str
    gold: str
    unrelated: bool
    truncated: bool = False


# ----------------------------------------------------------------------------- small helpers

def _int(rng: random.Random, lo: int, hi: int) -> int:
    while True:
        v = rng.randint(lo, hi)
        if v not in _FORBIDDEN_INTS and "7919" not in str(v) and "104729" not in str(v):
            return v


def _digits(rng: random.Random, n: int) -> str:
    """n random decimal digits that never contain the UNRELATED_GOLDS numbers."""
    s = "".join(rng.choice("0123456789") for _ in range(min(n, 64)))
    s = (s * (n // max(1, len(s)) + 1))[:n]
    return s.replace("7919", "7818").replace("104729", "104628")


def _wrap(rng: random.Random, expr: str) -> str:
    """Put an answer expression into a response in one of the ways models do."""
    k = rng.randrange(8)
    if k == 0:
        return f"The answer is $\\boxed{{{expr}}}$."
    if k == 1:
        return f"Let me compute.\n\n\\[ {expr} \\]"
    if k == 2:
        return f"Final Answer: The final answer is ${expr}$. I hope it is correct."
    if k == 3:
        return f"#### {expr}"
    if k == 4:
        return f"\\boxed{{{expr}}}"
    if k == 5:
        return f"So we get $x = {expr}$"
    if k == 6:
        return f"**{expr[:250]}**"
    return expr


def _sized(rng: random.Random, unit: str, size: int) -> str:
    return unit * max(1, size // max(1, len(unit)))


# ----------------------------------------------------------------------------- fragments

def _tower(rng: random.Random) -> str:
    k = rng.randrange(14)
    if k == 0:
        return "9^{9^{9^{9}}}"
    if k == 1:
        return "10**10**10"
    if k == 2:
        return "^".join(["2"] * rng.randint(3, 600))
    if k == 3:
        return "**".join([str(_int(rng, 2, 99))] * rng.randint(3, 50))
    if k == 4:
        d = rng.randint(2, 12)
        return "".join(f"{_int(rng, 2, 99)}^{{" for _ in range(d)) + str(_int(rng, 2, 99)) + "}" * d
    if k == 5:
        return f"10^{{{_digits(rng, rng.randint(5, 12))}}}"
    if k == 6:
        return f"{_int(rng, 2, 9)}^{{{_int(rng, 10**5, 10**9)}}}"
    if k == 7:
        return f"1e{_int(rng, 10**4, 10**10)}"
    if k == 8:
        return f"1.5 \\times 10^{{{_int(rng, 10**3, 10**9)}}}"
    if k == 9:
        return "\\exp(\\exp(\\exp(\\exp(" + str(_int(rng, 10, 1000)) + "))))"
    if k == 10:
        return "2\\uparrow\\uparrow " + str(_int(rng, 5, 100))
    if k == 11:
        return f"(10^{{{_int(rng, 10, 99)}}})^{{10^{{{_int(rng, 10, 99)}}}}}"
    if k == 12:
        return "e^{e^{e^{e^{" + str(_int(rng, 10, 99)) + "}}}}"
    return "x^{x^{x^{x^{x^{" + str(_int(rng, 10, 99)) + "}}}}}"


def _nest(rng: random.Random) -> str:
    d = rng.choice([50, 200, 999, 1000, 1000, rng.randint(100, 3000)])
    k = rng.randrange(8)
    if k == 0:
        return "\\frac{1}{" * d + "2" + "}" * d
    if k == 1:
        return "\\frac{" * d + "1" + "}{2}" * d
    if k == 2:
        return "\\dfrac{1}{1+" * d + "x" + "}" * d
    if k == 3:
        return "\\sqrt{" * d + "2" + "}" * d
    if k == 4:
        return "(" * d + "1" + ")" * d
    if k == 5:
        return "{" * d + "1" + "}" * d
    if k == 6:
        return "\\left(" * d + "1" + "\\right)" * d
    return "\\frac{1}{" * d + "2" + "}" * (d // 2)  # half-closed


def _unbalanced(rng: random.Random) -> str:
    k = rng.randrange(10)
    if k == 0:
        return "The answer is \\boxed{" + _digits(rng, rng.randint(1, 40))
    if k == 1:
        return "\\boxed{" * rng.randint(2, 500) + "1"
    if k == 2:
        return "\\boxed{1}" + "}" * rng.randint(1, 1000)
    if k == 3:
        return "".join(rng.choice("{}[]()") for _ in range(rng.randint(10, 5000)))
    if k == 4:
        return "\\boxed{\\frac{1}{2"
    if k == 5:
        return "\\boxed{\\left( 1, 2 }"
    if k == 6:
        return "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4}"
    if k == 7:
        return "$$ 1 + \\boxed{2 $$ } $"
    if k == 8:
        return "\\boxed{" + "{" * rng.randint(1, 2000) + "3" + "}" * rng.randint(0, 3)
    return "\\boxed{\\}" + "\\{" * rng.randint(1, 300)


def _megabyte(rng: random.Random) -> str:
    size = rng.randint(MB - 4096, MB + 4096)
    k = rng.randrange(18)
    units = [
        "1", "{", "}", "\\boxed{1}", "\\boxed{", "\\frac{", "$", "\\", " ", "\n", "the answer is ",
        "#### ", "**1** ", "1,000,", "(", "x^", "^{", "\\sqrt",
    ]
    unit = units[k]
    if unit == " ":
        return _sized(rng, " ", size) + "\\boxed{" + str(_int(rng, 0, 99)) + "}"
    if unit == "1":
        return _digits(rng, size) if rng.random() < 0.5 else "1" * size
    if rng.random() < 0.2:  # several units interleaved
        unit = "".join(rng.choice(units) for _ in range(rng.randint(2, 9)))
    out = _sized(rng, unit, size)
    if rng.random() < 0.3:
        out = "#### " + out if rng.random() < 0.5 else "\\[" + out + "\\]"
    return out


_CONTROL = [chr(c) for c in range(0, 32)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]
_ODD = ["\u202e", "\u202d", "\u200b", "\u200d", "\ufeff", "\ufffd", "\uffff", "\U0010ffff",
        "\u0301", "\u0300" * 50, "\x1b[2J", "\x1b[31m", "\r\n", "\r", "\u2028", "\u2029",
        "\uff14\uff12", "\u0664\u0662", "\U0001d7d0", "\u00bd", "\u2153", "\U0001f600"]


def _control(rng: random.Random) -> str:
    k = rng.randrange(6)
    if k == 0:
        return "".join(rng.choice(_CONTROL) for _ in range(rng.randint(1, 3000)))
    if k == 1:
        return "\\boxed{4\x002}" if rng.random() < 0.5 else "\x00" * rng.randint(1, 100_000)
    if k == 2:
        base = rng.choice(REALISTIC)[0]
        pos = sorted(rng.randrange(len(base) + 1) for _ in range(rng.randint(1, 20)))
        out, last = [], 0
        for p in pos:
            out.append(base[last:p])
            out.append(rng.choice(_CONTROL + _ODD))
            last = p
        out.append(base[last:])
        return "".join(out)
    if k == 3:
        return "\\boxed{" + "".join(rng.choice(_ODD) for _ in range(rng.randint(1, 30))) + "}"
    if k == 4:
        return "The answer is " + rng.choice(_CONTROL) * rng.randint(1, 500) + str(_int(rng, 0, 999))
    return "".join(rng.choice(_CONTROL + _ODD + ["\\boxed{", "}", "1", "$"]) for _ in range(rng.randint(1, 2000)))


def _surrogate(rng: random.Random) -> str:
    lone = chr(rng.randint(0xD800, 0xDFFF))
    k = rng.randrange(7)
    if k == 0:
        return "\ud800"
    if k == 1:
        return f"\\boxed{{{lone}}}"
    if k == 2:
        return f"The answer is {lone}42{lone}"
    if k == 3:
        return "".join(chr(rng.randint(0xD800, 0xDFFF)) for _ in range(rng.randint(1, 5000)))
    if k == 4:
        return "\ud83d\ude00 \\boxed{\ud83d}" + "\udfff" * rng.randint(1, 100)
    if k == 5:
        base = rng.choice(REALISTIC)[0]
        p = rng.randrange(len(base) + 1)
        return base[:p] + lone + base[p:]
    return "#### " + lone * rng.randint(1, 200_000)


_BAD_ESCAPES = [
    "\\x", "\\q\\w\\e", "\\frac", "\\frac{}{}", "\\frac{1}{}", "\\sqrt[", "\\sqrt[]{}", "\\begin{pmatrix}",
    "\\end{pmatrix}", "\\\\\\\\", "\\", "\\{", "a_", "^", "_^_^", "\\left", "\\right)", "\\text{",
    "\\mathrm", "\\operatorname{}", "\\over", "1 \\over 0", "1/0", "0/0", "\\frac{1}{0}", "\\log(0)",
    "\\infty - \\infty", "%", "#", "&&&", "\\u00", "\\N{", "\\0", "\\t", "\\csname", "\\def\\a{\\a}\\a",
    "\\mathbb{}", "\\pmod", "\\begin{array}{", "\\begin{cases} x & y", "\\end{cases}", "\\\\[2pt]",
    "\\hline", "\\color{red}{", "\\tfrac12", "\\frac12 3", "'''", "\"\"\"", "\\boxed", "\\fbox",
    "\\lim_{", "\\sum_{}^{}", "\\int_{}^{}", "\\binom{}{}", "\\sqrt{-}", "---", "+-+-", "==", "=<>=",
    "\\leq\\geq", "\\pm\\mp\\pm", "\\cup\\cup", "\\{\\}", "()", "[]", "\\emptyset", "\\varnothing",
    "\\text{\\text{\\text{", "\\frac{\\frac{}{}}{\\frac{}{}}", "\\sqrt[0]{0}", "0^0", "0^{-1}",
    "\\ln(-1)", "i^i", "\\tan(\\pi/2)", "\\cot 0", "\\arcsin 2", "\\log_1 2", "\\log_0 0",
]


def _bad_escape(rng: random.Random) -> str:
    k = rng.randrange(4)
    if k == 0:
        return _wrap(rng, rng.choice(_BAD_ESCAPES))
    if k == 1:
        return _wrap(rng, " ".join(rng.choice(_BAD_ESCAPES) for _ in range(rng.randint(2, 30))))
    if k == 2:  # command soup
        toks = []
        for _ in range(rng.randint(1, 200)):
            name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8)))
            toks.append("\\" + name + rng.choice(["", "{", "}", "{}", "[", "^", "_", " "]))
        return _wrap(rng, "".join(toks))
    return "\\boxed{" + "\\" * rng.randint(1, 2000) + "}"


def _sympy_slow(rng: random.Random) -> str:
    k = rng.randrange(24)
    n = _int(rng, 2, 9)
    if k == 0:
        return f"{rng.choice([2001, 10**5, 10**9, _int(rng, 3000, 10**6)])}!"
    if k == 1:
        return f"({_int(rng, 2, 9)}^{{{_int(rng, 3, 9)}}})!"
    if k == 2:
        return f"\\binom{{10^{n}}}{{10^{max(1, n - 1)}}}"
    if k == 3:
        a = _int(rng, 10**4, 10**6)
        b = a // 2 + (1 if a // 2 in _FORBIDDEN_INTS else 0)
        return f"\\binom{{{a}}}{{{b}}}"
    if k == 4:
        d = rng.randint(20, 200)
        return "\\sqrt{" * d + str(_int(rng, 2, 99)) + "}" * d
    if k == 5:
        d = rng.randint(10, 60)
        return "".join(f"\\sqrt{{{_int(rng, 2, 99)}+" for _ in range(d)) + "1" + "}" * d
    if k == 6:
        m = rng.randint(8, 40)
        rows = "\\\\".join("&".join(rng.choice(["x", "y", str(_int(rng, 0, 99)), "x^2", "\\pi"]) for _ in range(m))
                           for _ in range(m))
        return f"\\det\\begin{{pmatrix}}{rows}\\end{{pmatrix}}" if rng.random() < 0.5 else \
            f"\\begin{{pmatrix}}{rows}\\end{{pmatrix}}"
    if k == 7:
        return f"\\int_0^1 e^{{-x^2}}\\sin(x^{{{_int(rng, 50, 500)}}})\\,dx"
    if k == 8:
        return "\\int x^{x} \\, dx"
    if k == 9:
        return f"\\sum_{{i=1}}^{{10^{{{_int(rng, 8, 20)}}}}} i^{{i}}"
    if k == 10:
        return f"\\sum_{{i=1}}^{{{_int(rng, 10**6, 10**9)}}} \\frac{{1}}{{i^2}}"
    if k == 11:
        return f"\\prod_{{k=1}}^{{{_int(rng, 10**5, 10**8)}}} k"
    if k == 12:
        return "\\lim_{x \\to 0} \\sin(1/x) \\cdot x^{" + str(_int(rng, 100, 1000)) + "}"
    if k == 13:
        return f"(x+1)^{{{_int(rng, 2000, 20000)}}}"
    if k == 14:
        return f"(x+y+z+w)^{{{_int(rng, 30, 200)}}}"
    if k == 15:
        return f"\\sin(10^{{{_int(rng, 50, 999)}}})"
    if k == 16:
        return f"\\Gamma({_int(rng, 10**5, 10**7)})"
    if k == 17:
        return "e^{\\pi\\sqrt{163}}"
    if k == 18:
        return f"2^{{{_int(rng, 10000, 20000)}}} - 2^{{{_int(rng, 10000, 20000)}}} + \\frac{{1}}{{3}}"
    if k == 19:
        return "+".join(f"\\frac{{{_int(rng, 1, 99)}}}{{{_int(rng, 2, 99)}}}" for _ in range(rng.randint(20, 60)))
    if k == 20:
        return f"\\sqrt[{_int(rng, 100, 10**6)}]{{2}}"
    if k == 21:
        return "\\pi^{\\pi^{\\pi^{\\pi}}}"
    if k == 22:
        return f"\\lfloor 10^{{{_int(rng, 100, 10**4)}}}\\pi \\rfloor"
    return f"\\frac{{(x+1)^{{{_int(rng, 40, 300)}}}-(x-1)^{{{_int(rng, 40, 300)}}}}}{{x}}"


def _many_boxes(rng: random.Random) -> str:
    n = rng.choice([10, 100, 1000, 10_000, rng.randint(2, 50_000)])
    k = rng.randrange(6)
    if k == 0:
        return " ".join(["\\boxed{1}"] * n)
    if k == 1:
        return " ".join(f"\\boxed{{{_int(rng, 0, 10**6)}}}" for _ in range(n))
    if k == 2:
        d = min(n, 3000)
        return "\\boxed{" * d + "5" + "}" * d
    if k == 3:
        return "\n\n".join(f"\\boxed{{{_int(rng, 0, 99)}}}" for _ in range(n))
    if k == 4:
        return "\\boxed{}" * n
    return " or ".join(f"\\fbox{{{_int(rng, 0, 99)}}}" for _ in range(min(n, 5000)))


_LATEX_TOKENS = ["\\frac", "\\sqrt", "\\boxed", "{", "}", "^", "_", "\\pi", "\\infty", "\\cdot", "\\left(",
                 "\\right)", "$", "$$", "\\[", "\\]", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\\\\", "=",
                 "<", ">", "\\leq", ",", ";", " or ", " and ", "\\cup", "\\{", "\\}", "x", "y", "e", "i",
                 "%", "\\%", "^\\circ", "\\text{", "####", "The answer is", "**", "\n\n", "!", ".", "-", "+"]


def _random_text(rng: random.Random) -> str:
    n = rng.randint(0, 2000) if rng.random() < 0.97 else rng.randint(10_000, 60_000)
    k = rng.randrange(3)
    if k == 0:  # any code point, surrogates included
        return "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(n))
    if k == 1:
        return "".join(rng.choice(_LATEX_TOKENS) for _ in range(n // 3 + 1))
    pool = _LATEX_TOKENS + _CONTROL + _ODD + [chr(rng.randint(0xD800, 0xDFFF)), str(_int(rng, 0, 999))]
    return "".join(rng.choice(pool) for _ in range(n // 3 + 1))


_FRAGMENTS = (_tower, _nest, _unbalanced, _bad_escape, _sympy_slow, _surrogate)


def _mutate(rng: random.Random, resp: str) -> tuple[str, bool]:
    """A mutated copy of a realistic response; returns (text, truncated)."""
    s = resp
    truncated = False
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        p = rng.randrange(len(s) + 1)
        q = min(len(s), p + rng.randint(0, 40))
        if op == 0:
            s = s[:p] + rng.choice(_FRAGMENTS)(rng) + s[p:]
        elif op == 1:
            reps = min(rng.randint(2, 2000), max(2, MB // max(1, q - p)))
            s = s[:p] + s[p:q] * reps + s[q:]
        elif op == 2:
            s = s[:p] + s[q:]
        elif op == 3:
            s = s.replace("}", "", 1) if rng.random() < 0.5 else s.replace("{", "{{", rng.randint(1, 5))
        elif op == 4:
            i = s.rfind("\\boxed{")
            if i >= 0:
                s = s[: i + 7] + rng.choice(_FRAGMENTS)(rng) + "}"
            else:
                s = s + " \\boxed{" + rng.choice(_FRAGMENTS)(rng) + "}"
        elif op == 5:
            s = s[:p] + "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 20))) + s[p:]
        elif op == 6:
            s = s[:p]
            truncated = True
        elif op == 7:
            s = (s + "\n\n") * min(rng.randint(2, 300), max(2, MB // (len(s) + 2)))
        else:
            s = s[:p] + rng.choice(_LATEX_TOKENS) + s[p:]
        if len(s) > 2 * MB:  # keep every case near the issue's "megabyte-long" scale
            s = s[-2 * MB :]
    return s, truncated


def make_case(rng: random.Random, category: str, seeds: Sequence[tuple[str, str]] = REALISTIC) -> HostileCase:
    """One case of ``category`` drawn with ``rng``."""
    ugold = rng.choice(UNRELATED_GOLDS)
    trunc = rng.random() < 0.1
    if category == "tower":
        return HostileCase(category, _wrap(rng, _tower(rng)), ugold, True, trunc)
    if category == "frac_nest":
        return HostileCase(category, _wrap(rng, _nest(rng)), ugold, True, trunc)
    if category == "unbalanced":
        return HostileCase(category, _unbalanced(rng), ugold, True, trunc)
    if category == "megabyte":
        return HostileCase(category, _megabyte(rng), ugold, True, trunc)
    if category == "control":
        return HostileCase(category, _control(rng), ugold, True, trunc)
    if category == "surrogate":
        return HostileCase(category, _surrogate(rng), ugold, True, trunc)
    if category == "bad_escape":
        return HostileCase(category, _bad_escape(rng), ugold, True, trunc)
    if category == "sympy_slow":
        return HostileCase(category, _wrap(rng, _sympy_slow(rng)), ugold, True, trunc)
    if category == "many_boxes":
        return HostileCase(category, _many_boxes(rng), ugold, True, trunc)
    if category == "random_text":
        return HostileCase(category, _random_text(rng), ugold, True, trunc)
    if category == "mutation":
        resp, gold = rng.choice(seeds)
        text, cut = _mutate(rng, resp)
        if rng.random() < 0.5:
            return HostileCase(category, text, ugold, True, cut or trunc)
        return HostileCase(category, text, gold, False, cut or trunc)
    if category == "hostile_gold":
        k = rng.randrange(10)
        if k == 0:
            gold = rng.choice(["", " ", "\n", "\x00", "\\boxed{", "{", "}"])
        elif k == 1:
            gold = _digits(rng, rng.choice([500, 5000, MB]))
        else:
            gold = rng.choice(_FRAGMENTS + (_control, _many_boxes))(rng)
            if len(gold) > 200_000:
                gold = gold[:200_000]
        resp = rng.choice([f"The answer is $\\boxed{{{_int(rng, 0, 99)}}}$.", rng.choice(seeds)[0],
                           _wrap(rng, rng.choice(_FRAGMENTS)(rng)), _wrap(rng, gold[:5000])])
        return HostileCase(category, resp, gold, False, trunc)
    raise ValueError(f"unknown hostile category {category!r}; allowed: {sorted(CATEGORIES)}")


# category -> share of generated cases (sums to 1)
CATEGORIES: dict[str, float] = {
    "tower": 0.09,
    "frac_nest": 0.07,
    "unbalanced": 0.08,
    "megabyte": 0.01,
    "control": 0.08,
    "surrogate": 0.08,
    "bad_escape": 0.09,
    "sympy_slow": 0.10,
    "many_boxes": 0.04,
    "mutation": 0.22,
    "random_text": 0.08,
    "hostile_gold": 0.06,
}


def generate(n: int, seed: int = 0, seeds: Sequence[tuple[str, str]] | None = None,
              categories: dict[str, float] | None = None) -> Iterator[HostileCase]:
    """Yield ``n`` hostile cases, deterministically from ``seed``.

    ``seeds``: realistic (response, gold) pairs to mutate (default :data:`REALISTIC`).
    ``categories``: name -> weight (default :data:`CATEGORIES`); names must be known.
    Case ``k`` depends only on (seed, k), so any single case can be regenerated.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    weights = dict(categories or CATEGORIES)
    unknown = set(weights) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown hostile categories {sorted(unknown)}; allowed: {sorted(CATEGORIES)}")
    names = list(weights)
    w = [weights[k] for k in names]
    pairs = list(seeds) if seeds else list(REALISTIC)
    for k in range(n):
        rng = random.Random(f"{seed}:{k}")
        cat = rng.choices(names, w)[0]
        yield make_case(rng, cat, pairs)


def named_cases() -> list[HostileCase]:
    """Hand-written cases, at least one per category, as named in CATEGORIES."""
    u = UNRELATED_GOLDS
    big = "9" * 400
    cases = [
        HostileCase("tower", "\\boxed{9^{9^{9^{9}}}}", u[0], True),
        HostileCase("tower", "The answer is 10**10**10", u[1], True),
        HostileCase("tower", "\\boxed{" + "^".join(["2"] * 500) + "}", u[0], True),
        HostileCase("tower", "\\boxed{10^{99999999}}", u[2], True),
        HostileCase("tower", "\\boxed{1e999999999}", u[0], True),
        HostileCase("frac_nest", "\\boxed{" + "\\frac{1}{" * 1000 + "2" + "}" * 1000 + "}", u[1], True),
        HostileCase("frac_nest", "\\boxed{" + "\\frac{1}{" * 1000 + "2", u[1], True),
        HostileCase("frac_nest", "$" + "(" * 1000 + "1" + ")" * 1000 + "$", u[0], True),
        HostileCase("unbalanced", "The answer is \\boxed{42", u[0], True),
        HostileCase("unbalanced", "\\boxed{{{{{{1}", u[0], True),
        HostileCase("unbalanced", "}}}}\\boxed{1}}}}{{{{", u[3], True),
        HostileCase("megabyte", "1" * MB, u[0], True),
        HostileCase("megabyte", "{" * MB, u[0], True),
        HostileCase("megabyte", "\\boxed{1}" * (MB // 9), u[0], True),
        HostileCase("megabyte", "#### " + "$" * MB, u[0], True),
        HostileCase("megabyte", "\\[" + "$" * MB + "\\]", u[0], True),
        HostileCase("control", "\\boxed{4\x002}", u[0], True),
        HostileCase("control", "".join(chr(c) for c in range(32)) * 100, u[0], True),
        HostileCase("control", "The answer is \x1b[31m42\x1b[0m", u[0], True),
        HostileCase("surrogate", "\ud800", u[0], True),
        HostileCase("surrogate", "\\boxed{\ud800}", u[0], True),
        HostileCase("surrogate", "The answer is \udfff42\ud800", u[0], True),
        HostileCase("surrogate", "\\boxed{42}", "\ud800", False),
        HostileCase("bad_escape", "\\boxed{\\frac{}{}}", u[1], True),
        HostileCase("bad_escape", "\\boxed{\\sqrt[}", u[1], True),
        HostileCase("bad_escape", "\\boxed{\\x\\q \\u00 \\N{}", u[1], True),
        HostileCase("bad_escape", "\\boxed{\\frac{1}{0}}", u[1], True),
        HostileCase("sympy_slow", "\\boxed{100000!}", u[0], True),
        HostileCase("sympy_slow", "\\boxed{\\binom{10^9}{10^8}}", u[0], True),
        HostileCase("sympy_slow", "\\boxed{" + "\\sqrt{" * 100 + "2" + "}" * 100 + "}", u[0], True),
        HostileCase("sympy_slow", "\\boxed{\\sum_{i=1}^{10^{10}} i}", u[0], True),
        HostileCase("sympy_slow", "\\boxed{\\int_0^1 e^{-x^2}\\sin(x^{100})\\,dx}", u[0], True),
        HostileCase("sympy_slow", "\\boxed{\\begin{pmatrix}" + "\\\\".join(
            "&".join(f"x^{i + j}" for j in range(30)) for i in range(30)) + "\\end{pmatrix}}", u[7], True),
        HostileCase("sympy_slow", "\\boxed{(x+1)^{20000}}", u[4], True),
        HostileCase("sympy_slow", f"\\boxed{{{big}^{{{big}}}}}", u[0], True),
        HostileCase("many_boxes", " ".join(f"\\boxed{{{i}}}" for i in range(50_000)), u[0], True),
        HostileCase("many_boxes", "\\boxed{" * 3000 + "5" + "}" * 3000, u[0], True),
        HostileCase("many_boxes", "\\boxed{}" * 10_000, u[0], True),
        HostileCase("mutation", REALISTIC[0][0] * 1000, REALISTIC[0][1], False),
        HostileCase("mutation", REALISTIC[3][0][:40], u[1], True, True),
        HostileCase("random_text", "".join(chr(c) for c in range(0, 0x3000, 7)), u[0], True),
        HostileCase("hostile_gold", "\\boxed{1}", "\\frac{1}{" * 1000 + "2" + "}" * 1000, False),
        HostileCase("hostile_gold", "\\boxed{1}", "1" * MB, False),
        HostileCase("hostile_gold", "\\boxed{1}", "", False),
        HostileCase("hostile_gold", "\\boxed{\\binom{10^9}{10^8}}", "\\binom{10^9}{10^8}", False),
    ]
    return cases
