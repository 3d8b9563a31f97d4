"""Hostile model output: the verifier and the reward path survive anything a policy
can emit -- no exception, no hang past the timeout, bounded memory, no leftover workers -- and a
hostile string is never graded correct against an unrelated gold.

CI-sized: the named cases of every category, 2,000 generated cases (mathrl.testing.hostile) and
a bounded hypothesis run, all through the real worker pool with real SIGKILL timeouts. The
100,000-case soak is ``scripts/fuzz_verifier.py``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mathrl.reward import REASONS, Grade, compute_rewards, grade_batch, shutdown_pool
from mathrl.reward.rewards import RewardContext
from mathrl.reward.equiv import _BASE_RE, equivalent
from mathrl.reward.extract import extract_answer
from mathrl.reward.grader import fast_grade
from mathrl.testing.fuzz import case_violations
from mathrl.testing.hostile import CATEGORIES, UNRELATED_GOLDS, HostileCase, generate, make_case, named_cases
from mathrl.reward.normalize import GuardError, guard
from mathrl.reward.pool import get_pool
from mathrl.procs import child_processes, cmdline, proc_state, status_kb

WORKERS = 2
TIMEOUT = 1.0  # short, so the cases that do time out (integrals) cost little; the pool kills at it
SLACK = 2.0  # allowed lateness of a timeout verdict (select granularity, SIGKILL, loaded CI)
PARENT_MAX_S = 2.0  # one case's in-process fast path (no timeout of its own)
PARENT_RSS_MB = 1536
WORKER_RSS_MB = 2560  # workers cap their address space at imports + 2048 MiB
TERMS = {"correctness": {}, "format": {"bonus": 0.1}, "length": {}}
MAX_LENGTH = 4096


def _worker_children(include_zombies: bool = True) -> list[tuple[int, str]]:
    """(pid, state) of this process's children that run the grading worker."""
    return [(pid, state) for pid, state in child_processes()
            if b"mathrl.reward._worker" in cmdline(pid) or (include_zombies and state == "Z")]


def _check(cases: list[HostileCase], timeout: float = TIMEOUT) -> tuple[list[Grade], list[float], float]:
    """Grade + reward ``cases`` through the real pool and assert every per-case property."""
    resps = [c.response for c in cases]
    golds = [c.gold for c in cases]
    truncs = [c.truncated for c in cases]
    durations: list[float] = []
    t0 = time.perf_counter()
    grades = grade_batch(resps, golds, timeout=timeout, workers=WORKERS, truncated=truncs, durations=durations)
    rewards = compute_rewards(TERMS, RewardContext(responses=resps, grades=grades, truncated=truncs,
                                                    lengths=[len(r) for r in resps], max_length=MAX_LENGTH))
    wall = time.perf_counter() - t0
    assert len(grades) == len(rewards) == len(durations) == len(cases)
    for c, g, r, d in zip(cases, grades, rewards, durations):
        violations = case_violations(c, g, r, d, max_duration=timeout + SLACK + PARENT_MAX_S)
        assert not violations, violations
    # the whole batch: never more than (cases / workers) * timeout, plus start-up slack
    assert wall <= len(cases) / WORKERS * timeout + 30.0
    return grades, durations, wall


@pytest.fixture(scope="module", autouse=True)
def _pool():
    """A 2-worker pool for this module; afterwards: shut down, no worker process left."""
    shutdown_pool()
    get_pool(WORKERS)
    yield
    pids = {w.proc.pid for w in get_pool()._workers}
    shutdown_pool()
    time.sleep(0.1)
    left = [p for p, state in _worker_children() if p in pids or state != "Z"]
    assert not left, f"worker processes left after shutdown_pool(): {left}"


# ----------------------------------------------------------------------------- named cases

def test_named_cases_cover_every_category():
    cats = {c.category for c in named_cases()}
    assert cats == set(CATEGORIES), set(CATEGORIES) ^ cats


@pytest.mark.slow
def test_named_hostile_cases_survive():
    cases = named_cases()
    grades, durations, _ = _check(cases)
    by_text = {c.response: g for c, g in zip(cases, grades) if c.unrelated}
    # the guard refuses towers and huge factorials/binomials in microseconds, not by timeout
    for text in ("\\boxed{9^{9^{9^{9}}}}", "The answer is 10**10**10", "\\boxed{100000!}",
                 "\\boxed{\\binom{10^9}{10^8}}", "\\boxed{\\sum_{i=1}^{10^{10}} i}"):
        assert by_text[text].reason == "error", (text, by_text[text])
    # a lone surrogate goes through pickling to a worker and back unchanged
    assert by_text["\\boxed{\ud800}"].extracted == "\ud800"


def test_surrogates_and_nul_round_trip_through_the_worker():
    """These need sympy, so they travel to a worker process (pickle over a pipe) and back."""
    resp = ["\\boxed{\\sqrt{2}\ud800}", "\\boxed{\\frac{\\sqrt{3}}{2}\x00}", "\\boxed{\\sqrt{8}\udfff\ud83d}"]
    golds = ["\\sqrt{2}", "\\frac{\\sqrt{3}}{2}", "2\\sqrt{2}"]
    assert all(fast_grade(r, g) is None for r, g in zip(resp, golds))  # really the worker path
    grades = grade_batch(resp, golds, timeout=10.0, workers=WORKERS)
    assert [g.extracted for g in grades] == ["\\sqrt{2}\ud800", "\\frac{\\sqrt{3}}{2}\x00", "\\sqrt{8}\udfff\ud83d"]
    assert all(g.reason in REASONS for g in grades)


def test_a_timeout_kills_and_replaces_the_worker():
    slow = "\\boxed{\\int_0^1 e^{-x^2}\\sin(x^{100})\\,dx}"
    pool = get_pool()
    before = dict(pool.stats)
    pids_before = {w.proc.pid for w in pool._workers}
    t0 = time.perf_counter()
    grades = grade_batch([slow, "\\boxed{\\frac{\\sqrt{2}}{2}}"], [UNRELATED_GOLDS[0], "\\frac{1}{\\sqrt{2}}"],
                         timeout=0.5, workers=WORKERS)
    assert time.perf_counter() - t0 < 0.5 + SLACK + 5.0
    assert grades[0] == Grade(False, None, "timeout")
    assert grades[1].correct  # the other worker carried on
    assert pool.stats["timeouts"] == before["timeouts"] + 1
    killed = pids_before - {w.proc.pid for w in pool._workers}
    assert len(killed) == 1
    for pid, state in _worker_children():
        assert pid not in killed, f"killed worker {pid} still present (state {state})"


_ORPHAN_SCRIPT = r"""
import os, signal, threading
from mathrl.reward import grade_batch
from mathrl.reward.pool import get_pool
grade_batch(["\\boxed{\\frac{\\sqrt{2}}{2}}"] * 2, ["\\frac{1}{\\sqrt{2}}"] * 2, timeout=120, workers=2)
print(" ".join(str(w.proc.pid) for w in get_pool()._workers), flush=True)
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
grade_batch(["\\boxed{\\int_0^1 e^{-x^2}\\sin(x^{300})\\,dx}"] * 2, ["1", "2"], timeout=600, workers=2)
"""


@pytest.mark.slow
def test_busy_workers_exit_when_the_parent_is_killed():
    """SIGKILL of the trainer skips atexit; workers stuck in sympy must still go away."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", _ORPHAN_SCRIPT], capture_output=True, text=True, env=env,
                          cwd=str(root), timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2

    def alive(pid: int) -> bool:
        return proc_state(pid) not in (None, "Z")

    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)], "grading workers outlived their killed parent"


# ----------------------------------------------------------------------------- generated cases

@pytest.mark.slow
def test_generated_hostile_cases_survive_with_bounded_memory():
    cases = list(generate(2000, seed=20261130))
    cats = {c.category for c in cases}
    assert cats == set(CATEGORIES)
    grades, durations, wall = _check(cases)
    assert sum(g.reason == "timeout" for g in grades) <= 0.02 * len(cases)
    parent_mb = status_kb("self", "VmRSS") / 1024
    worker_mb = max(status_kb(w.proc.pid, "VmHWM") for w in get_pool()._workers) / 1024
    assert parent_mb < PARENT_RSS_MB, f"parent RSS {parent_mb:.0f} MB"
    assert worker_mb < WORKER_RSS_MB, f"worker peak RSS {worker_mb:.0f} MB"


def test_generator_is_deterministic_and_rejects_unknown_categories():
    a = [(c.category, c.response, c.gold) for c in generate(50, seed=3)]
    b = [(c.category, c.response, c.gold) for c in generate(50, seed=3)]
    assert a == b
    assert a != [(c.category, c.response, c.gold) for c in generate(50, seed=4)]
    with pytest.raises(ValueError, match="unknown hostile categories"):
        list(generate(1, categories={"nope": 1.0}))
    with pytest.raises(ValueError, match="unknown hostile category"):
        make_case(random.Random(0), "nope")


@pytest.mark.slow
def test_unrelated_golds_are_never_emitted_as_numbers():
    """The premise of the 'never correct' check: generated text never holds 7919 or 104729."""
    for c in generate(3000, seed=99):
        if c.unrelated:
            assert not re.search(r"(?<!\d)(7919|104729)(?!\d)", c.response), c.category


# ----------------------------------------------------------------------------- hypothesis

_TOKENS = ["\\boxed{", "\\frac{", "\\sqrt{", "{", "}", "^", "^{", "**", "!", "\\binom{", "$", "\\[", "\\]",
           "####", "The answer is ", "\\begin{pmatrix}", "&", "\\\\", "\\end{pmatrix}", "\\int", "\\sum_{",
           "9", "10", "e", "x", ",", " or ", "(", ")", "\\left(", "\\right)", "\n\n", "\\"]
_ANY_CHAR = st.characters(codec=None, exclude_categories=())  # surrogates and controls included
_HOSTILE_TEXT = st.one_of(
    st.text(_ANY_CHAR, max_size=300),
    st.lists(st.one_of(st.sampled_from(_TOKENS), st.text(_ANY_CHAR, max_size=3)), max_size=80).map("".join),
    st.text(_ANY_CHAR, max_size=60).map(lambda t: "\\boxed{" + t + "}"),
)


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(responses=st.lists(_HOSTILE_TEXT, min_size=1, max_size=6), gold=st.sampled_from(UNRELATED_GOLDS),
       truncated=st.booleans())
@pytest.mark.slow
def test_hypothesis_hostile_text_never_crashes_or_matches(responses, gold, truncated):
    cases = [HostileCase("hypothesis", r, gold, True, truncated) for r in responses]
    _check(cases)


@settings(max_examples=60, deadline=None, database=None)
@given(gold=_HOSTILE_TEXT, response=_HOSTILE_TEXT)
def test_hypothesis_hostile_golds_never_crash(gold, response):
    grades = grade_batch([response], [gold], timeout=TIMEOUT, workers=WORKERS)
    assert grades[0].reason in REASONS


# ----------------------------------------------------------------------------- the fixes

@pytest.mark.parametrize("answer", [
    "2^2^2^2^2^2", "10**10**10", "e^{e^{e^{e^{89}}}}", "x^{x^{x^{x^{34}}}}", "\\exp(\\exp(\\exp(\\exp(9))))",
    "\\binom{10^9}{10^8}", "\\binom{903817}{451908}", "\\Gamma(600781)", "(7^{7})!", "(100000)!",
])
def test_guard_refuses_towers_and_huge_combinatorics(answer):
    with pytest.raises(GuardError):
        guard(answer)


@pytest.mark.parametrize("answer", [
    "x^{x^{x}}", "e^{-x^2}", "2^{10}", "\\binom{10}{3}", "\\binom{2000}{2}", "5!", "(3)!", "\\Gamma(5)",
    "\\exp(-x^2)", "e^{\\frac{x^2}{2}}", "a_{n^2}",
])
def test_guard_allows_ordinary_answers(answer):
    guard(answer)


def test_parent_fast_path_is_linear_on_many_distinct_boxes():
    """50,000 different boxes: extraction deduplicates with a set (was quadratic: ~6 s)."""
    text = " ".join(f"\\boxed{{{i}}}" for i in range(50_000))
    t0 = time.perf_counter()
    ex = extract_answer(text)
    fast_grade(text, "-104729")
    assert time.perf_counter() - t0 < 2.0
    assert ex.hedged


def test_base_notation_regex_is_linear():
    """The base-b regex backtracked quadratically on a long digit run (1 MB of digits: minutes)."""
    t0 = time.perf_counter()
    assert _BASE_RE.match("1" * 200_000 + "x") is None
    assert _BASE_RE.match("1" * 200_000) is None
    assert time.perf_counter() - t0 < 0.5
    assert _BASE_RE.match("52_8").groups() == ("52", "8")
    assert _BASE_RE.match("A3F_{16}").groups() == ("A3F", "16")
    assert _BASE_RE.match("ABC_{16}") is None  # still needs a digit


def test_equivalence_refuses_giant_answers_quickly():
    t0 = time.perf_counter()
    with pytest.raises(GuardError):
        equivalent("42", "1" * 1_000_000)
    with pytest.raises(GuardError):
        equivalent("1" * 1_000_000, "42")
    assert time.perf_counter() - t0 < 1.0
