"""The direct LaTeX reader (mathrl/reward/fastlatex.py) gives latex2sympy's value on everything it
accepts: hand-computed values, the inputs it must refuse (where latex2sympy reads text its own way),
and a differential check against latex2sympy on every text the verifier parses while grading the
project's and the peers' labelled sets — with a wrong reader (division turned round) as the
negative control the check must reject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sympy

from mathrl.reward import fastlatex, symbolic
from mathrl.reward.fastlatex import fast_parse
from mathrl.reward.grader import grade_local
from mathrl.reward.symbolic import latex2sympy_value, prepare

ROOT = Path(__file__).resolve().parents[2]
x, y, a, b, c = sympy.symbols("x y a b c")

HAND = [
    ("2x^2+7x-4", 2 * x**2 + 7 * x - 4),
    ("-2^2", sympy.Integer(-4)),
    ("1/2x", 1 / (2 * x)),  # latex2sympy's reading: the implicit product binds first
    ("a/b c", a / (b * c)),
    ("a/b/c", a / (b * c)),
    ("\\frac58", sympy.Rational(5, 8)),
    ("\\dfrac{x+1}{x-1}", (x + 1) / (x - 1)),
    ("3\\sqrt{2}", 3 * sympy.sqrt(2)),
    ("\\sqrt[3]{2}", sympy.Integer(2) ** sympy.Rational(1, 3)),
    ("\\sqrt2", sympy.sqrt(2)),
    ("2^{10}", sympy.Integer(1024)),
    ("x^{-1}", 1 / x),
    ("\\frac{1}{2}^2", sympy.Rational(1, 4)),
    ("\\left(\\frac{1}{2}\\right)^2", sympy.Rational(1, 4)),
    ("2\\cdot 3+4\\times 5", sympy.Integer(26)),
    ("\\frac34i", sympy.Rational(3, 4) * sympy.I),
    ("e^{i\\pi}", sympy.Integer(-1)),
    ("E", sympy.E),
    ("AB", a * b),  # latex2sympy lowercases letters
    ("\\pi r^2", sympy.pi * sympy.Symbol("r") ** 2),
    ("7(x+3)(x-3)", 7 * (x + 3) * (x - 3)),
    ("\\sin(x)+\\cos\\left(\\pi\\right)", sympy.sin(x) - 1),
    ("\\ln(2)", sympy.log(2)),
    ("x 2", 2 * x),
    ("{\\frac{25}{100}}x", x / 4),  # a decimal as prepare() writes it
]


@pytest.mark.parametrize("text,value", HAND)
def test_values_computed_by_hand(text, value):
    got = fast_parse(text)
    assert got is not None, text
    assert sympy.simplify(got - value) == 0 and got.free_symbols == value.free_symbols, (text, got)


# latex2sympy reads these its own way (mixed numbers, sums of adjacent numbers, function application,
# differentials) or they are not single expressions: the reader leaves them to it
REFUSED = ["2(3)", "(2)3", "2 3", "2\\frac58", "2{\\frac{1}{2}}", "1\\frac{1}{2}x", "\\frac12 3", "x(3)",
           "dx", "2^-1", "x^23", "\\sin x", "\\sin^2(x)", "\\frac{1}{0}", "2/0", "(1,2)", "x=1", "x_1",
           "x--y", "\\log_2 16", "4!", "\\infty", "10\\%", "", "x+", "(x", "\\,x"]


@pytest.mark.parametrize("text", REFUSED)
def test_refused(text):
    assert fast_parse(text) is None


def _labelled(name: str) -> list[tuple[str, str, bool]]:
    rows = []
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            trunc = bool(r.get("truncated", False)) or r.get("finish_reason") == "length"
            rows.append((r["response"], r["gold"], trunc))
    return rows


def _parsed_while_grading(monkeypatch) -> list[tuple[str, object]]:
    """Every (text, fast value) the reader accepted while grading the labelled sets."""
    seen: list[tuple[str, object]] = []

    def spy(t):
        v = fast_parse(t)
        if v is not None:
            seen.append((t, v))
        return v

    monkeypatch.setattr(symbolic, "fast_parse", spy)
    symbolic.to_sympy.cache_clear()
    rows = _labelled("tests/reward/cases.jsonl")
    for name in ("peers.jsonl", "peers_fresh.jsonl", "model_outputs_math500.jsonl"):
        rows += _labelled("eval/verifier_sets/" + name)
    for response, gold, trunc in rows:
        grade_local(response, gold, trunc)
    symbolic.to_sympy.cache_clear()
    return seen


def _disagreements(seen) -> list[tuple[str, object, object]]:
    out = []
    for t, v in dict(seen).items():
        try:
            ref = latex2sympy_value(t)
        except Exception as e:  # latex2sympy fails where the reader gave a value
            out.append((t, v, type(e).__name__))
            continue
        same = v == ref or (isinstance(ref, sympy.Expr) and v.free_symbols == ref.free_symbols
                            and sympy.simplify(v - ref) == 0)
        if not same:
            out.append((t, v, ref))
    return out


@pytest.mark.slow
def test_agrees_with_latex2sympy_on_every_text_it_reads_while_grading(monkeypatch):
    seen = _parsed_while_grading(monkeypatch)
    distinct = dict(seen)
    assert len(distinct) >= 300  # the reader takes most of what the verifier parses
    assert _disagreements(seen) == []


@pytest.mark.slow
def test_a_wrong_reader_is_caught(monkeypatch):
    """Negative control: with division turned round the same check finds disagreements."""
    monkeypatch.setattr(fastlatex, "divide", lambda p, q: q / p)
    seen = _parsed_while_grading(monkeypatch)
    assert len(_disagreements(seen)) >= 10


def test_prepare_keeps_what_latex2sympy_read_before():
    """to_sympy = prepare + (reader or latex2sympy): decimals are exact, CAS calls are LaTeX."""
    assert prepare("0.25x") == "{\\frac{25}{100}}x"
    assert symbolic.to_sympy("0.25x") == x / 4
    assert symbolic.to_sympy("sqrt(8)") == 2 * sympy.sqrt(2)
    assert symbolic.to_sympy("x**2/4 + y**2/4") == x**2 / 4 + y**2 / 4
