"""A reusable pool of grading worker processes with a hard per-call timeout.

Design
------
* Each worker is a separate Python interpreter started with ``subprocess.Popen``
  (``python -m mathrl.reward._worker``), not ``fork``: the caller may be a multi-threaded
  trainer holding CUDA/torch state, and forking such a process is unsafe. Workers import
  only sympy / latex2sympy, run with ``OMP_NUM_THREADS=1`` and cap their address space
  (``RLIMIT_AS``: size after imports + 2 GiB, env ``MATHRL_VERIFIER_MEM_MB``), so a runaway expression
  ends in MemoryError -> ``error`` instead of eating the machine.
* Messages are length-prefixed pickles over the worker's stdin/stdout pipes; each task carries the
  batch's :class:`~mathrl.reward.options.GradeOptions` (the worker grades with its ``rel_tol``). The
  parent waits with ``select`` and a deadline, so the timeout works from any thread (no signals).
* A task past its deadline: the worker is killed (SIGKILL), the task is recorded as
  ``timeout``, and a fresh worker is started in the background; the batch carries on with the
  others. A worker that dies is recorded as ``error`` and replaced the same way.
* The pool is reused across calls (start-up costs ~1 s per worker; a training step pays it
  once). One batch runs at a time per pool (a lock), so it is safe to call from any thread;
  after ``os.fork`` a child process builds its own pool.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from mathrl.reward.grader import Grade
from mathrl.reward.options import GradeOptions

__all__ = ["GraderPool", "get_pool", "shutdown_pool", "default_workers"]

_HEADER = struct.Struct("<I")
STARTUP_TIMEOUT_S = 120.0
_PKG_ROOT = str(Path(__file__).resolve().parents[2])


def default_workers() -> int:
    """min(#usable CPUs, 16), at least 1 (env MATHRL_VERIFIER_WORKERS overrides)."""
    env = os.environ.get("MATHRL_VERIFIER_WORKERS")
    if env:
        return max(1, int(env))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


class _Worker:
    """One worker process and its read buffer."""

    def __init__(self, python: str) -> None:
        env = dict(os.environ)
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[k] = "1"
        env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONHASHSEED", "0")
        self.proc = subprocess.Popen(
            [python, "-u", "-m", "mathrl.reward._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,
        )
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.ready = False
        self.started = time.monotonic()
        self.task: int | None = None
        self.deadline = 0.0

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)
        self.proc.stdin.flush()

    def read_available(self) -> list:
        """Read what is available (after select said readable); return complete messages.
        Raises EOFError when the worker has exited."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            raise EOFError
        self.buf += chunk
        out = []
        while len(self.buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self.buf)
            if len(self.buf) < _HEADER.size + n:
                break
            out.append(pickle.loads(self.buf[_HEADER.size : _HEADER.size + n]))
            self.buf = self.buf[_HEADER.size + n :]
        return out

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:
                pass


class GraderPool:
    """A fixed-size pool of grading workers. Use :meth:`grade_many`; call :meth:`close` at the end
    (an atexit hook closes the shared pool)."""

    def __init__(self, workers: int | None = None, python: str | None = None) -> None:
        """``workers`` processes (default :func:`default_workers`) running ``python`` (default:
        this interpreter)."""
        self.size = workers or default_workers()
        self.python = python or sys.executable
        if self.size < 1:
            raise ValueError(f"workers must be >= 1, got {self.size}")
        self._lock = threading.Lock()
        self._workers: list[_Worker] = [_Worker(self.python) for _ in range(self.size)]
        self._pid = os.getpid()
        self.stats = {"tasks": 0, "timeouts": 0, "crashes": 0, "restarts": 0}
        self._failed_starts = 0  # workers that died before saying "ready", since the last ready one

    # -- lifecycle
    def close(self) -> None:
        for w in self._workers:
            w.kill()
        self._workers = []

    def _replace(self, idx: int) -> None:
        self._workers[idx].kill()
        self._workers[idx] = _Worker(self.python)
        self.stats["restarts"] += 1

    # -- main loop
    def grade_many(self, tasks: list[tuple], options: GradeOptions,
                   durations: list[float] | None = None) -> list[Grade]:
        """Grade (response, gold, truncated) tasks under ``options`` (its ``timeout`` per task, its
        ``rel_tol`` in the worker; the pool's size is fixed when it is built); results in input order.
        When ``durations`` is a list it is filled with each task's seconds from dispatch to verdict."""
        if not isinstance(options, GradeOptions):
            raise TypeError(f"options must be a GradeOptions, got {type(options).__name__}")
        with self._lock:
            return self._run(tasks, options, durations)

    def _run(self, tasks, options: GradeOptions, durations: list[float] | None = None) -> list[Grade]:
        timeout = options.timeout
        results: list[Grade | None] = [None] * len(tasks)
        sent = [0.0] * len(tasks)
        done = [0.0] * len(tasks)
        pending = list(range(len(tasks) - 1, -1, -1))  # pop() from the end = input order
        remaining = len(tasks)
        while remaining:
            now = time.monotonic()
            # dispatch to idle, ready workers
            for w in self._workers:
                if w.ready and w.task is None and pending:
                    i = pending.pop()
                    resp, gold, trunc = tasks[i]
                    try:
                        w.send((i, resp, gold, trunc, options))
                    except (BrokenPipeError, OSError):
                        pending.append(i)
                        w.ready = False
                        w.task = None
                        w.deadline = -1.0  # marks it for replacement below
                        continue
                    w.task = i
                    w.deadline = now + timeout
                    sent[i] = now
            # wait for something to happen
            fds = {w.fd: k for k, w in enumerate(self._workers) if w.proc.stdout and not w.proc.stdout.closed}
            deadlines = [w.deadline for w in self._workers if w.task is not None]
            deadlines += [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
            wait = max(0.0, min(deadlines) - now) if deadlines else 0.05
            try:
                readable, _, _ = select.select(list(fds), [], [], min(wait, 1.0))
            except (OSError, ValueError):
                readable = []
            for fd in readable:
                k = fds[fd]
                w = self._workers[k]
                try:
                    msgs = w.read_available()
                except (EOFError, OSError):
                    if not w.ready:
                        self._failed_starts += 1
                    if w.task is not None:
                        results[w.task] = Grade(False, None, "error")
                        done[w.task] = time.monotonic()
                        remaining -= 1
                        self.stats["crashes"] += 1
                    self._replace(k)
                    continue
                for msg in msgs:
                    if msg == "ready":
                        w.ready = True
                        self._failed_starts = 0
                        continue
                    i, correct, extracted, reason = msg
                    if w.task == i and results[i] is None:
                        results[i] = Grade(bool(correct), extracted, reason)
                        done[i] = time.monotonic()
                        remaining -= 1
                        self.stats["tasks"] += 1
                    w.task = None
            # deadlines
            now = time.monotonic()
            for k, w in enumerate(self._workers):
                if w.task is not None and now >= w.deadline:
                    results[w.task] = Grade(False, None, "timeout")
                    done[w.task] = now
                    remaining -= 1
                    self.stats["timeouts"] += 1
                    self._replace(k)
                elif w.deadline == -1.0 and w.task is None:
                    self._replace(k)
                elif not w.ready and now - w.started > STARTUP_TIMEOUT_S:
                    self._replace(k)
            if self._failed_starts > 2 * self.size + 2:
                # workers cannot start (broken environment): report errors rather than spin forever
                self._failed_starts = 0
                warnings.warn("mathrl.reward: grading workers fail to start; run "
                              f"`{self.python} -m mathrl.reward._worker` to see why. "
                              "Remaining cases are graded 'error'.", RuntimeWarning, stacklevel=3)
                break
        if durations is not None:
            durations[:] = [max(0.0, d - s) if d and s else 0.0 for s, d in zip(sent, done)]
        return [r if r is not None else Grade(False, None, "error") for r in results]


_POOL: GraderPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(workers: int | None = None) -> GraderPool:
    """The process-wide shared pool (created lazily with ``workers`` or the default size; rebuilt
    when a different ``workers`` is asked for, or after a fork). ``workers=None`` reuses the
    existing pool whatever its size."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and (_POOL._pid != os.getpid()):
            _POOL = None  # inherited from a parent process: do not touch its workers
        if workers is None and _POOL is not None:
            return _POOL  # no size asked for: reuse whatever exists
        want = workers or default_workers()
        if _POOL is not None and _POOL.size != want:
            with _POOL._lock:
                _POOL.close()
            _POOL = None
        if _POOL is None:
            _POOL = GraderPool(want)
        return _POOL


def shutdown_pool() -> None:
    """Stop the shared pool's workers (also registered with atexit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL._pid == os.getpid():
            _POOL.close()
        _POOL = None


atexit.register(shutdown_pool)
