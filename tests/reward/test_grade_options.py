"""GradeOptions (issue 39 leftover): the verifier's options are one checked object built from the config in one
call, and the numeric tolerance reaches the comparisons as an argument, not through context or module state."""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

import pytest

REWARD_DIR = Path(__file__).resolve().parents[2] / "mathrl" / "reward"


def test_from_config_reads_the_reward_section():
    from mathrl.config import load_config
    from mathrl.eval.runner import EvalSettings
    from mathrl.reward import GradeOptions

    cfg = load_config(None, ["reward.rel_tol=1e-3", "reward.timeout=7", "reward.workers=3"])
    options = GradeOptions.from_config(cfg)
    assert options == GradeOptions(timeout=7.0, rel_tol=1e-3, workers=3)
    assert GradeOptions.from_config(load_config(None, [])) == GradeOptions()  # the defaults agree
    assert EvalSettings.from_config(cfg).grading == options  # mathrl eval grades as the trainer does


def test_from_config_refuses_a_bad_rel_tol_by_its_key():
    from mathrl.config import load_config
    from mathrl.errors import InputError
    from mathrl.reward import GradeOptions

    cfg = load_config(None, [])
    cfg.reward.rel_tol = 1.5  # a Config edited in code, past the loader's checks
    with pytest.raises(ValueError, match=r"^reward\.rel_tol must be a number in \[0, 1\), got 1\.5$") as err:
        GradeOptions.from_config(cfg)
    assert isinstance(err.value, InputError)  # reported to the user as one line, exit status 2
    cfg.reward.rel_tol, cfg.reward.timeout = 0.0, -1.0
    with pytest.raises(ValueError, match=r"^reward\.timeout must be"):
        GradeOptions.from_config(cfg)


def test_options_and_their_shorthand_are_not_mixed():
    from mathrl.reward import GradeOptions, grade_batch
    from mathrl.reward.pool import GraderPool

    with pytest.raises(TypeError, match="not both"):
        grade_batch(["\\boxed{1}"], ["1"], GradeOptions(), rel_tol=1e-3)
    with pytest.raises(TypeError, match="GradeOptions"):
        GraderPool.grade_many(None, [], 5.0)  # type: ignore[arg-type]  # the pool takes the object only


def test_the_reward_package_keeps_no_tolerance_in_context_or_module_state():
    """No ContextVar or thread-local anywhere in mathrl/reward: every comparison is handed its tolerance."""
    found = []
    for path in sorted(REWARD_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, (ast.Name, ast.Attribute)):
                names = [node.id if isinstance(node, ast.Name) else node.attr]
            found += [f"{path.name}:{node.lineno} {n}" for n in names  # type: ignore[attr-defined]
                      if n in ("contextvars", "ContextVar", "local")]
    assert not found, found


def test_the_comparisons_take_the_tolerance_as_an_argument():
    from mathrl.reward.equiv import nodes_equal
    from mathrl.reward.normalize import parse_answer
    from mathrl.reward.symbolic import num_close, sympy_equal, to_sympy

    pi, approx = to_sympy("\\pi"), to_sympy("3.1416")
    assert num_close(pi, approx, 1e-4) and not num_close(pi, approx, 0.0)
    assert sympy_equal(pi, approx, 1e-4) and not sympy_equal(pi, approx, 0.0)
    g, r = parse_answer("\\frac{1}{3}"), parse_answer("0.3333")
    assert nodes_equal(g, r, True, 1e-3) and not nodes_equal(g, r, True, 0.0)


def test_threads_with_different_tolerances_each_get_their_own_verdict():
    """Two threads grade the same pairs at the same time, one exactly and one with a tolerance; the
    interpreter switches threads every microsecond, so a tolerance shared between calls would leak."""
    from mathrl.reward.equiv import equivalent, fast_equivalent

    pairs = [("\\pi", "3.1416"), ("\\frac{1}{3}", "0.3333"), ("(\\frac{1}{3}, 2)", "(0.3333, 2)")]
    start = threading.Barrier(2)
    verdicts: dict[float, list[bool | None]] = {0.0: [], 1e-3: []}

    def work(tol: float) -> None:
        start.wait()
        for _ in range(30):
            for gold, answer in pairs:
                verdicts[tol].append(equivalent(gold, answer, tol))
                if gold != "\\pi":
                    verdicts[tol].append(fast_equivalent(gold, answer, tol))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(tol,)) for tol in verdicts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert verdicts[1e-3] == [True] * 150
    assert verdicts[0.0] == [False] * 150
