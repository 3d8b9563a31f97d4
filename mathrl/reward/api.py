"""Public grading API: :func:`grade` and :func:`grade_batch`.

Hard timeouts: everything that can be slow (sympy) runs in the worker pool
(:mod:`mathrl.reward.pool`), whose deadline is enforced by the *calling* process with
``select`` + SIGKILL, so it works from any thread and for inputs that ignore signals.
Before that, the caller tries :func:`mathrl.reward.grader.fast_grade` in-process: pure-Python,
length-bounded extraction and exact rational comparison, which decides most numeric answers
in microseconds and gives the same verdict the worker would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from mathrl.reward.grader import Grade, fast_grade
from mathrl.reward.pool import get_pool

__all__ = ["grade", "grade_batch"]


def _check_timeout(timeout: float) -> float:
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}") from None
    if not t > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return t


def grade(response: str, gold: str, *, timeout: float = 5.0, truncated: bool = False,
          rel_tol: float = 0.0) -> Grade:
    """Grade one response against its gold answer.

    ``truncated=True`` means the sampler stopped at the length limit; then only an explicit
    final-answer marker (box, ``####``, "the answer is") counts (see
    :mod:`mathrl.reward.extract` for the full extraction and hedging policy).
    Never raises on any response; a call that needs more than ``timeout`` seconds returns
    ``Grade(False, None, "timeout")``.
    """
    return grade_batch([response], [gold], timeout=timeout, truncated=[truncated], rel_tol=rel_tol)[0]


def grade_batch(
    responses: Sequence[str],
    golds: Sequence[str],
    *,
    timeout: float = 5.0,
    workers: int | None = None,
    truncated: Sequence[bool] | bool | None = None,
    durations: list[float] | None = None,
    rel_tol: float = 0.0,
) -> list[Grade]:
    """Grade many responses in parallel worker processes; results in input order.

    Each call is limited to ``timeout`` seconds (killed and recorded as ``timeout``; the worker
    is replaced). ``workers`` sets the shared pool's size (default: usable CPUs, at most 16).
    ``truncated``: one bool per response, a single bool for all, or None (= all False).
    ``durations``: if a list is given, it is filled with one float per response: seconds spent
    on it (in this process for the fast path; from dispatch to verdict for the worker pool, so
    a timeout shows as about ``timeout``). For profiling the verifier; costs nothing otherwise.
    ``rel_tol``: relative tolerance for numeric answers (``reward.rel_tol``); 0, the default, compares
    numbers exactly (0.333 is not 1/3). Safe to call from any thread.
    """
    t = _check_timeout(timeout)
    try:
        tol = float(rel_tol)
    except (TypeError, ValueError):
        raise ValueError(f"rel_tol must be a number in [0, 1), got {rel_tol!r}") from None
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"rel_tol must be a number in [0, 1), got {rel_tol!r}")
    responses = list(responses)
    golds = list(golds)
    if len(responses) != len(golds):
        raise ValueError(f"grade_batch: {len(responses)} responses but {len(golds)} golds")
    if truncated is None:
        truncs = [False] * len(responses)
    elif isinstance(truncated, bool):
        truncs = [truncated] * len(responses)
    else:
        truncs = [bool(x) for x in truncated]
        if len(truncs) != len(responses):
            raise ValueError(f"grade_batch: {len(truncs)} truncated flags for {len(responses)} responses")
    if workers is not None and int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out: list[Grade | None] = []
    slow: list[int] = []
    times = [0.0] * len(responses) if durations is not None else None
    for i, (r, g, tr) in enumerate(zip(responses, golds, truncs)):
        t0 = time.perf_counter() if times is not None else 0.0
        fg = fast_grade(r, g, tr, tol) if isinstance(r, str) and isinstance(g, str) else None
        if fg is None and not (isinstance(r, str) and isinstance(g, str)):
            fg = Grade(False, None, "error")
        out.append(fg)
        if times is not None:
            times[i] = time.perf_counter() - t0
        if fg is None:
            slow.append(i)
    if slow:
        pool = get_pool(workers)
        pool_times: list[float] | None = [] if times is not None else None
        res = pool.grade_many([(responses[i], golds[i], truncs[i], tol) for i in slow], t, durations=pool_times)
        for k, (i, g) in enumerate(zip(slow, res)):
            out[i] = g
            if times is not None and pool_times is not None:
                times[i] += pool_times[k]
    if durations is not None and times is not None:
        durations[:] = times
    return out  # type: ignore[return-value]
