"""Synthetic arithmetic problems: determinism, exact answers recomputed from the text, level constraints."""

from __future__ import annotations

import ast
import re

import pytest

from mathrl.data import DataError, load_problems
from mathrl.data.synthetic import DEFAULT_LEVEL, LEVELS, generate


def _evaluate(node: ast.AST, values: list[int]) -> int:
    """Evaluate + - * / on integers, recording every intermediate value; '/' must be exact."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, values)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    assert isinstance(node, ast.BinOp), ast.dump(node)
    left, right = _evaluate(node.left, values), _evaluate(node.right, values)
    if isinstance(node.op, ast.Add):
        out = left + right
    elif isinstance(node.op, ast.Sub):
        out = left - right
    elif isinstance(node.op, ast.Mult):
        out = left * right
    elif isinstance(node.op, ast.Div):
        assert right != 0 and left % right == 0, f"inexact division {left} / {right}"
        out = left // right
    else:  # pragma: no cover
        raise AssertionError(f"unexpected operator {node.op}")
    values.append(out)
    return out


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_answers_recomputed_from_question(level: int) -> None:
    lv = LEVELS[level]
    problems = generate(150, level, seed=11)
    assert len(problems) == 150
    for p in problems:
        expr = p.meta["expression"]
        # the story states exactly the expression's numbers, in the same order
        assert [int(x) for x in re.findall(r"\d+", p.question)] == [int(x) for x in re.findall(r"\d+", expr)], p
        values: list[int] = []
        assert str(_evaluate(ast.parse(expr, mode="eval"), values)) == p.gold
        assert all(v >= 0 for v in values), p  # never below zero
        assert p.question.endswith("?")
        ops = p.meta["ops"]
        assert len(ops) == lv.n_ops and set(ops) <= set(lv.ops)
        assert all(r in ops for r in lv.require)
        assert "/" not in ops[:-1]
        assert p.meta["level"] == level and p.source == "synthetic"


def test_easy_levels_draw_what_they_say() -> None:
    for p in generate(200, 1, seed=0):
        a, b = map(int, re.findall(r"\d+", p.meta["expression"]))
        assert p.meta["ops"] == ["+"] and 1 <= a <= 9 and 1 <= b <= 9
    for p in generate(200, 3, seed=0):
        a, b = map(int, re.findall(r"\d+", p.meta["expression"]))
        assert 10 <= a <= 99 and 1 <= b <= 9 and p.meta["ops"][0] in "+-"
    for p in generate(200, 4, seed=0):
        a, b = map(int, re.findall(r"\d+", p.meta["expression"]))
        assert 10 <= a <= 99 and 10 <= b <= 99
    assert {p.meta["ops"][0] for p in generate(200, 2, seed=0)} == {"+", "-"}
    assert all(p.meta["ops"] == ["*"] for p in generate(50, 5, seed=0))


def test_deterministic_and_prefix_stable() -> None:
    a = generate(60, 6, seed=5)
    assert a == generate(60, 6, seed=5)
    assert generate(20, 6, seed=5) == a[:20]
    assert [p.question for p in generate(60, 6, seed=6)] != [p.question for p in a]
    assert [p.question for p in generate(60, 6, seed=5, split="test")] != [p.question for p in a]
    assert len({p.id for p in a}) == 60


def test_templates_and_themes_vary() -> None:
    problems = generate(300, 2, seed=1)
    assert {p.meta["template"] for p in problems} == {"story", "together", "compare"}
    first_words = {p.question.split()[0] for p in problems}
    assert len(first_words) >= 10  # many names / openings
    nouns = {m for p in problems for m in re.findall(r"\b(apples|coins|marbles|stickers|books|cookies)\b", p.question)}
    assert len(nouns) >= 5


def test_load_problems_synthetic_options() -> None:
    assert load_problems("synthetic", level=2, n=10, seed=3) == generate(10, 2, 3)
    assert load_problems("synthetic", n=5, split="test") == generate(5, DEFAULT_LEVEL, 0, split="test")
    assert len(load_problems("synthetic", n=10, limit=4)) == 4
    with pytest.raises(DataError, match="unknown synthetic option"):
        load_problems("synthetic", difficulty=3)
    with pytest.raises(DataError, match="'level' must be one of"):
        load_problems("synthetic", level=0)
    with pytest.raises(DataError, match="'n' must be >= 0"):
        generate(-1, 1, 0)
    with pytest.raises(DataError, match="'seed' must be an integer"):
        generate(3, 1, "0")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="reads no file"):
        load_problems("synthetic", "x.jsonl")


def test_the_config_allows_every_level_the_generator_has():
    """Issue 38 point 15: `mathrl data sources` listed levels 9 and 10 while data.synthetic_level stopped at 8."""
    from mathrl.config import ConfigError, load_config

    for level in sorted(LEVELS):
        assert load_config(None, [f"data.synthetic_level={level}"]).data.synthetic_level == level
    with pytest.raises(ConfigError, match=f"allowed: >= 1 and <= {max(LEVELS)}"):
        load_config(None, [f"data.synthetic_level={max(LEVELS) + 1}"])
