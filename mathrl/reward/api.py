"""Public grading API: :func:`grade`, :func:`grade_batch` and :class:`GradeStream` (grading while a
rollout engine is still generating).

Hard timeouts: everything that can be slow (sympy) runs in the worker pool
(:mod:`mathrl.reward.pool`), whose deadline is enforced by the *calling* process with
``select`` + SIGKILL, so it works from any thread and for inputs that ignore signals.
Before that, the caller tries :func:`mathrl.reward.grader.fast_grade` in-process: pure-Python,
length-bounded extraction and exact rational comparison, which decides most numeric answers
in microseconds and gives the same verdict the worker would.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

from mathrl.reward.grader import Grade, fast_grade
from mathrl.reward.options import GradeOptions
from mathrl.reward.pool import get_pool

__all__ = ["GradeStream", "grade", "grade_batch"]


def grade(response: str, gold: str, options: GradeOptions | None = None, *, truncated: bool = False,
          timeout: float | None = None, rel_tol: float | None = None) -> Grade:
    """Grade one response against its gold answer.

    ``truncated=True`` means the sampler stopped at the length limit; then only an explicit
    final-answer marker (box, ``####``, "the answer is") counts (see
    :mod:`mathrl.reward.extract` for the full extraction and hedging policy).
    ``options`` (or the shorthand ``timeout=``, ``rel_tol=``): as for :func:`grade_batch`.
    Never raises on any response; a call that needs more than ``timeout`` seconds returns
    ``Grade(False, None, "timeout")``.
    """
    options = GradeOptions.resolve(options, timeout=timeout, rel_tol=rel_tol)
    return grade_batch([response], [gold], options, truncated=[truncated])[0]


def grade_batch(
    responses: Sequence[str],
    golds: Sequence[str],
    options: GradeOptions | None = None,
    *,
    truncated: Sequence[bool] | bool | None = None,
    durations: list[float] | None = None,
    timeout: float | None = None,
    workers: int | None = None,
    rel_tol: float | None = None,
) -> list[Grade]:
    """Grade many responses in parallel worker processes; results in input order.

    ``options``: a :class:`~mathrl.reward.options.GradeOptions` (the trainer and ``mathrl eval`` build it
    from the config with ``GradeOptions.from_config``); ``timeout=``, ``workers=`` and ``rel_tol=`` are a
    shorthand for ``GradeOptions(timeout=..., workers=..., rel_tol=...)`` (the defaults for those not
    given), not to be combined with ``options``. Each call is limited to ``timeout`` seconds (killed and
    recorded as ``timeout``; the worker is replaced). ``workers`` sets the shared pool's size (default:
    usable CPUs, at most 16). ``rel_tol``: relative tolerance for numeric answers; 0, the default, compares
    numbers exactly (0.333 is not 1/3).
    ``truncated``: one bool per response, a single bool for all, or None (= all False).
    ``durations``: if a list is given, it is filled with one float per response: seconds spent
    on it (in this process for the fast path; from dispatch to verdict for the worker pool, so
    a timeout shows as about ``timeout``). For profiling the verifier; costs nothing otherwise.
    Safe to call from any thread.
    """
    options = GradeOptions.resolve(options, timeout=timeout, workers=workers, rel_tol=rel_tol)
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
    out: list[Grade | None] = []
    slow: list[int] = []
    times = [0.0] * len(responses) if durations is not None else None
    for i, (r, g, tr) in enumerate(zip(responses, golds, truncs)):
        t0 = time.perf_counter() if times is not None else 0.0
        fg = fast_grade(r, g, tr, options.rel_tol) if isinstance(r, str) and isinstance(g, str) else None
        if fg is None and not (isinstance(r, str) and isinstance(g, str)):
            fg = Grade(False, None, "error")
        out.append(fg)
        if times is not None:
            times[i] = time.perf_counter() - t0
        if fg is None:
            slow.append(i)
    if slow:
        pool = get_pool(options.workers)
        pool_times: list[float] | None = [] if times is not None else None
        res = pool.grade_many([(responses[i], golds[i], truncs[i]) for i in slow], options, durations=pool_times)
        for k, (i, g) in enumerate(zip(slow, res)):
            out[i] = g
            if times is not None and pool_times is not None:
                times[i] += pool_times[k]
    if durations is not None and times is not None:
        durations[:] = times
    return out  # type: ignore[return-value]


class GradeStream:
    """Grades responses while the engine is still generating the rest (``rollout`` calls
    :meth:`put` as each response finishes; see ``RolloutEngine.generate(on_row=...)``).

    A background thread takes whatever has arrived and grades it with :func:`grade_batch` (the
    in-process fast path, then the worker pool with its hard timeouts), so verdicts are those of
    ``grade_batch`` on the same inputs by construction. :meth:`finish` is handed the final
    responses: any row that never arrived, or arrived with a different text, is graded then, so an
    engine that streams nothing (or streams wrongly) still gets every row graded right.

    ``golds``: one gold answer per row; ``options`` (or the shorthand ``timeout=``, ``workers=``,
    ``rel_tol=``) as for :func:`grade_batch`.
    """

    def __init__(self, golds: Sequence[str], options: GradeOptions | None = None, *,
                 timeout: float | None = None, workers: int | None = None, rel_tol: float | None = None) -> None:
        self.golds = list(golds)
        self.options = GradeOptions.resolve(options, timeout=timeout, workers=workers, rel_tol=rel_tol)
        self._queue: queue.Queue = queue.Queue()
        self._got: dict[int, tuple[str, bool, Grade]] = {}
        self._error: BaseException | None = None
        self.streamed = 0  # rows graded before finish()
        self._thread = threading.Thread(target=self._serve, name="mathrl-grade-stream", daemon=True)
        self._thread.start()

    def put(self, row: int, response: str, truncated: bool) -> None:
        """Row ``row`` has finished with ``response`` (``truncated``: stopped at the length limit).
        Returns at once; never raises for bad input (it is graded like any other response)."""
        self._queue.put((int(row), response, bool(truncated)))

    def on_row(self, row: int, response: str, finish_reason: str) -> None:
        """:meth:`put` in the form of a rollout engine's ``on_row`` callback (``finish_reason == "length"`` is
        a truncated response): pass ``stream.on_row`` to ``RolloutEngine.generate``."""
        self.put(row, response, finish_reason == "length")

    def _serve(self) -> None:
        while True:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(it is None for it in items)
            items = [it for it in items if it is not None and 0 <= it[0] < len(self.golds)]
            if items and self._error is None:
                try:
                    res = grade_batch([r for _, r, _ in items], [self.golds[i] for i, _, _ in items], self.options,
                                      truncated=[t for _, _, t in items])
                    for (i, r, t), g in zip(items, res):
                        self._got[i] = (r, t, g)
                except BaseException as exc:  # re-raised by finish()
                    self._error = exc
            if stop:
                return

    def close(self) -> None:
        """Stop the background thread without waiting for verdicts (the generation failed)."""
        self._error = self._error or RuntimeError("GradeStream closed")
        self._queue.put(None)

    def finish(self, responses: Sequence[str], truncated: Sequence[bool]) -> list[Grade]:
        """The grades of ``responses`` (the final batch, row order), waiting for those in flight."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        if len(responses) != len(self.golds) or len(truncated) != len(self.golds):
            raise ValueError(f"GradeStream.finish: {len(responses)} responses and {len(truncated)} flags "
                             f"for {len(self.golds)} golds")
        out: list[Grade | None] = [None] * len(responses)
        late = []
        for i, (r, t) in enumerate(zip(responses, truncated)):
            got = self._got.get(i)
            if got is not None and got[0] == r and got[1] == bool(t):
                out[i] = got[2]
            else:
                late.append(i)
        self.streamed = len(responses) - len(late)
        if late:
            res = grade_batch([responses[i] for i in late], [self.golds[i] for i in late], self.options,
                              truncated=[bool(truncated[i]) for i in late])
            for i, g in zip(late, res):
                out[i] = g
        return out  # type: ignore[return-value]
