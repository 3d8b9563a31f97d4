"""grade / grade_batch: hard timeouts from any thread, order, worker replacement, never raising."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from mathrl.reward import Grade, GradeOptions, grade, grade_batch
from mathrl.reward.pool import get_pool

# inputs that pass the size guard but make sympy compute for minutes (measured: > 10 s)
SLOW = ["\\boxed{(10^{20000}+1)^{20000}}", "\\boxed{(3^{20000})^{20000}}"]


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - surfaced to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    assert not t.is_alive(), "grading thread hung"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_grade_basic():
    g = grade("so the answer is $\\boxed{\\sqrt{8}}$", "2\\sqrt{2}")
    assert g == Grade(True, "\\sqrt{8}", "ok")
    assert grade("I give up", "3", truncated=True).reason == "no_answer"
    assert grade("\\boxed{4}", "3").reason == "mismatch"


@pytest.mark.parametrize("resp", ["\\boxed{9^{9^{9^9}}}", "\\boxed{1000000!}", "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}"])
def test_explosive_inputs_from_a_thread(resp):
    t = time.perf_counter()
    g = _in_thread(lambda: grade(resp, "3", timeout=2.0))
    assert g.reason == "error" and not g.correct, g  # README: "come back as `error` at once", not by timeout
    assert time.perf_counter() - t < 1.0


def test_hard_timeout_from_a_thread_kills_and_replaces_worker():
    pool = get_pool()
    before = pool.stats["restarts"]
    t = time.perf_counter()
    g = _in_thread(lambda: grade(SLOW[0], "3", timeout=1.0))
    elapsed = time.perf_counter() - t
    assert g == Grade(False, None, "timeout")
    assert elapsed < 6, elapsed
    assert pool.stats["restarts"] > before
    # the replaced worker serves the next call
    assert grade("\\boxed{x^2-1}", "(x-1)(x+1)", timeout=30).correct


@pytest.mark.slow
def test_batch_order_timeouts_and_replacement():
    golds, resps, expect = [], [], []
    for k in range(40):
        if k in (5, 23):
            resps.append(SLOW[k % 2])
            golds.append("3")
            expect.append("timeout")
        elif k % 3 == 0:
            resps.append(f"so \\boxed{{\\frac{{{k}}}{{\\sqrt{{4}}}}}}")  # needs sympy (worker)
            golds.append(f"{k}/2")
            expect.append("ok")
        elif k % 3 == 1:
            resps.append(f"#### {k}")  # fast path
            golds.append(str(k))
            expect.append("ok")
        else:
            resps.append(f"\\boxed{{{k}\\sqrt{{2}}}}")
            golds.append(f"{k + 1}\\sqrt{{2}}")
            expect.append("mismatch")
    t = time.perf_counter()
    grades = _in_thread(lambda: grade_batch(resps, golds, timeout=1.5, workers=2))
    assert [g.reason for g in grades] == expect
    assert time.perf_counter() - t < 30


def test_worker_crash_is_an_error_and_is_replaced():
    pool = get_pool(2)
    result = {}

    def run():
        result["g"] = grade_batch([SLOW[1]], ["3"], timeout=60, workers=2)

    th = threading.Thread(target=run)
    th.start()
    deadline = time.time() + 30
    busy = []
    while time.time() < deadline and not busy:
        busy = [w for w in pool._workers if w.task is not None]
        time.sleep(0.05)
    assert busy, "task never dispatched"
    os.kill(busy[0].proc.pid, signal.SIGKILL)
    th.join(60)
    assert result["g"][0].reason == "error"
    assert grade_batch(["\\boxed{\\pi}"], ["\\pi"], workers=2)[0].correct


def test_never_raises_on_odd_input():
    odd = ["", "\\boxed{", "}}}{{{", "\x00\xff", "$" * 1000, "\\boxed{\\begin{pmatrix}}", "a" * 200000,
           "\\frac{", "\\boxed{\\\\\\}", "😀 \\boxed{😀}", "\\boxed{1/0}", "\\boxed{\\sqrt{-1}}"]
    grades = grade_batch(odd, ["1"] * len(odd), timeout=5)
    assert all(isinstance(g, Grade) and not g.correct for g in grades)
    assert grade_batch([None], ["1"])[0].reason == "error"  # type: ignore[list-item]


def test_argument_errors():
    with pytest.raises(ValueError, match="golds"):
        grade_batch(["a"], [])
    with pytest.raises(ValueError, match="timeout"):
        grade("a", "b", timeout=0)
    with pytest.raises(ValueError, match="truncated"):
        grade_batch(["a"], ["b"], truncated=[True, False])


def test_broken_worker_environment_gives_errors_not_a_hang(monkeypatch):
    from mathrl.reward.pool import GraderPool

    # an executable that exits at once stands for an interpreter that cannot start workers
    pool = GraderPool(1, python="/bin/false")
    try:
        with pytest.warns(RuntimeWarning, match="fail to start"):
            out = pool.grade_many([("\\boxed{x}", "x", False)] * 3, GradeOptions(timeout=2.0))
    finally:
        pool.close()
    assert [g.reason for g in out] == ["error"] * 3


def test_concurrent_calls_from_threads():
    from concurrent.futures import ThreadPoolExecutor

    def job(k):
        return grade_batch([f"\\boxed{{\\sqrt{{{k * k}}}}}", f"#### {k}"], [str(k), str(k + 1)], timeout=10)

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(job, range(2, 10)))
    assert all(o[0].correct and o[1].reason == "mismatch" for o in outs)


def test_workers_run_single_threaded_with_a_memory_cap():
    pool = get_pool()
    deadline = time.time() + 60
    while time.time() < deadline and not all(w.ready for w in pool._workers):
        pool.grade_many([("\\boxed{1}", "1", False)] * 2 * pool.size, GradeOptions(timeout=30))  # through the workers
    assert all(w.ready for w in pool._workers)
    for w in pool._workers:
        limits = open(f"/proc/{w.proc.pid}/limits").read()
        line = next(ln for ln in limits.splitlines() if ln.startswith("Max address space"))
        assert "unlimited" not in line.split("Max address space")[1].split()[0]
        env = open(f"/proc/{w.proc.pid}/environ", "rb").read().split(b"\0")
        assert b"OMP_NUM_THREADS=1" in env
