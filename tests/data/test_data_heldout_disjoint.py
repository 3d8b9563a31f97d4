"""The synthetic held-out set shares no arithmetic fact with any training stream a run can draw.

A fact is one step of a problem's expression: its two operands and its operator,
``+`` and ``*`` canonicalised (``3 + 4`` is ``4 + 3``). The facts are read back
from ``meta["expression"]`` here with :mod:`ast`, independently of the
generator's own bookkeeping. Negative controls show that the check fails where
it should: on hand-made overlapping lists, and on the generator's old behaviour
(one unfiltered stream per split), where level 1's 32 held-out sums all occur in
the 1000-problem training stream.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.data import load_problems
from mathrl.data.synthetic import LEVELS, _draw_chain, _render, generate
from mathrl.data.splits import heldout_problems

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"
SEEDS = (0, 1, 2, 3)  # the README's three demo seeds and one more
DEFAULT_SIZE = 2000  # data.synthetic_size's default

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _facts_of(node: ast.AST, out: set[tuple[int, str, int]]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    assert isinstance(node, ast.BinOp), ast.dump(node)
    left, right = _facts_of(node.left, out), _facts_of(node.right, out)
    op = _OPS[type(node.op)]
    out.add((min(left, right), op, max(left, right)) if op in "+*" else (left, op, right))
    return {"+": left + right, "-": left - right, "*": left * right, "/": left // right if right else 0}[op]


def expression_facts(expression: str) -> set[tuple[int, str, int]]:
    """Every (operand, operator, operand) step of an expression such as ``(7 * 3) + 12``."""
    out: set[tuple[int, str, int]] = set()
    _facts_of(ast.parse(expression, mode="eval").body, out)
    return out


def shared_facts(train_expressions, heldout_expressions) -> set[tuple[int, str, int]]:
    """The facts that occur in both lists of expressions (empty when the held-out set is clean)."""
    train: set[tuple[int, str, int]] = set()
    for e in train_expressions:
        train |= expression_facts(e)
    held: set[tuple[int, str, int]] = set()
    for e in heldout_expressions:
        held |= expression_facts(e)
    return train & held


def _expressions(problems) -> list[str]:
    return [p.meta["expression"] for p in problems]


def _old_stream(n: int, level: int, seed: int, split: str) -> list[str]:
    """The generator's behaviour before the fact partition: every valid chain, no fact partition, repeats allowed."""
    rng = random.Random(f"mathrl-synthetic/{split}/L{level}/seed{seed}")
    out: list[str] = []
    while len(out) < n:
        chain = _draw_chain(rng, LEVELS[level])
        if chain is None:
            continue
        _render(rng, chain)  # the old loop consumed the same randomness for the story
        out.append(chain.expression())
    return out


# --------------------------------------------------------------------------- negative controls


def test_checker_flags_overlapping_lists() -> None:
    assert shared_facts(["3 + 4"], ["4 + 3"]) == {(3, "+", 4)}  # commutative: the same fact
    assert shared_facts(["7 * 3"], ["3 * 7"]) == {(3, "*", 7)}
    assert shared_facts(["(5 + 3) - 2"], ["8 - 2"]) == {(8, "-", 2)}  # a fact inside a chain
    assert shared_facts(["(7 * 3) + 12"], ["12 + 21"]) == {(12, "+", 21)}
    assert shared_facts(["((40 / 5) * 3) + 1"], ["40 / 5"]) == {(40, "/", 5)}
    # different operands or operator, or a non-commutative order: no shared fact
    assert shared_facts(["9 - 4", "8 / 2", "3 + 5"], ["4 + 9", "2 * 4", "3 - 5", "2 / 8"]) == set()


def test_checker_flags_the_old_generator() -> None:
    # the review's finding, reproduced: at level 1 every held-out sum occurs in the training stream
    train, held = _old_stream(1000, 1, 0, "train"), _old_stream(32, 1, 0, "test")
    assert all(e in train for e in held)
    assert sum(e in train[:48] for e in held) == 9
    assert shared_facts(train, held)
    # and the old behaviour leaks facts at every level, so the disjointness test below can fail
    for level in LEVELS:
        assert shared_facts(_old_stream(DEFAULT_SIZE, level, 0, "train"), _old_stream(200, level, 0, "test")), level


# --------------------------------------------------------------------------- the property


def _run_streams(level: int, seed: int, size: int) -> tuple[list[str], list[str]]:
    """(training stream, held-out set) that a run of the demo config at ``level`` and ``seed`` draws."""
    from mathrl.data.splits import load_training_problems

    try:
        cfg = load_config(DEMO, [f"data.synthetic_level={level}", f"train.seed={seed}",
                                 f"data.synthetic_size={size}"])
    except ConfigError:  # the config accepts fewer levels than the generator has: the same draws directly
        return (_expressions(load_problems("synthetic", None, "train", n=size, level=level, seed=seed)),
                _expressions(load_problems("synthetic", None, "test", n=32, level=level, seed=seed)))
    name, problems = heldout_problems(cfg)  # what the trainer's before/after evaluation uses
    assert name == "synthetic" and len(problems) == cfg.data.eval_limit
    assert all(p.id.startswith("synthetic/test/") and p.meta["level"] == level for p in problems)
    return _expressions(load_training_problems(cfg)), _expressions(problems)  # exactly what the trainer draws


@pytest.mark.slow
@pytest.mark.parametrize("level", sorted(LEVELS))
def test_heldout_facts_disjoint_from_training(level: int) -> None:
    train: list[str] = []
    held: list[str] = []
    for seed in SEEDS:
        for size in sorted({load_config(DEMO).data.synthetic_size, DEFAULT_SIZE}):
            t, h = _run_streams(level, seed, size)
            train += t
            held += h
        # `mathrl eval --benchmarks synthetic` draws a longer test stream (200 by default)
        held += _expressions(load_problems("synthetic", None, "test", n=200, level=level, seed=seed))
    assert len(train) >= len(SEEDS) * DEFAULT_SIZE and held
    assert shared_facts(train, held) == set()


def test_partition_holds_across_levels() -> None:
    # the partition is global: a level's held-out facts never appear in another level's training stream
    train = [e for level in LEVELS for e in _expressions(generate(500, level, seed=7))]
    held = [e for level in LEVELS for e in _expressions(generate(100, level, seed=7, split="test"))]
    assert shared_facts(train, held) == set()


def test_level1_heldout_set_is_mostly_distinct() -> None:
    # 20 of level 1's 45 facts (38 of its 81 ordered sums) are held out: the demo's 32 problems are distinct
    cfg = load_config(DEMO)
    assert cfg.data.synthetic_level == 1 and cfg.data.eval_limit == 32
    for seed in (0, 1, 2):
        problems = generate(38, 1, seed, split="test")
        assert len({p.meta["expression"] for p in problems}) == 38
        facts = set().union(*(expression_facts(p.meta["expression"]) for p in problems))
        assert len(facts) == 20
        # after the 38 held-out sums are used up, the stream starts a new cycle instead of stopping,
        # and stays deterministic and prefix-stable
        longer = generate(80, 1, seed, split="test")
        assert longer[:38] == problems and longer == generate(80, 1, seed, split="test")
        assert {p.meta["expression"] for p in longer} == {p.meta["expression"] for p in problems}
