"""Grading worker process: ``python -m mathrl.reward._worker`` (started by GraderPool).

Reads length-prefixed pickles ``(index, response, gold, truncated, options)`` from stdin (``options``:
the batch's :class:`mathrl.reward.options.GradeOptions`; the pool enforces its timeout, the worker
grades with its ``rel_tol``) and writes ``(index, correct, extracted, reason)`` to stdout. Announces
``"ready"`` after warming up.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from mathrl.reward.grader import grade_local

_HEADER = struct.Struct("<I")


def _limit_memory() -> None:
    """Cap the address space at (current size + MATHRL_VERIFIER_MEM_MB, default 2048 MiB), so a
    runaway computation raises MemoryError instead of exhausting the machine. Called after the
    imports, so whatever the package imports does not count against the budget."""
    try:
        import resource

        mb = int(os.environ.get("MATHRL_VERIFIER_MEM_MB", "2048"))
        if mb <= 0:
            return
        current = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    current = int(line.split()[1]) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        lim = current + mb * 1024 * 1024
        if hard != resource.RLIM_INFINITY:
            lim = min(lim, hard)
        resource.setrlimit(resource.RLIMIT_AS, (lim, hard))
    except Exception:
        pass


def _exit_with_parent(period: float = 1.0) -> None:
    """Exit when the parent process dies. Closing stdin tells an idle worker to stop, but a
    worker busy with a runaway sympy call only reads stdin after it; if the parent was killed
    (SIGTERM, SIGKILL, OOM) nobody would ever SIGKILL that worker. A daemon thread polls
    ``os.getppid()`` (it changes when the parent dies) and ends the process."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(period)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="mathrl-parent-watch", daemon=True).start()


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main() -> None:
    _exit_with_parent()
    sys.setrecursionlimit(5000)
    import logging

    logging.disable(logging.CRITICAL)

    grade_local("The answer is $\\boxed{\\frac{\\sqrt{2}}{2}}$.", "\\frac{1}{\\sqrt{2}}")  # warm-up
    _limit_memory()
    inp = sys.stdin.buffer
    out = sys.stdout.buffer

    def send(obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()

    send("ready")
    while True:
        head = _read_exact(inp, _HEADER.size)
        if head is None:
            return
        (n,) = _HEADER.unpack(head)
        body = _read_exact(inp, n)
        if body is None:
            return
        i, response, gold, truncated, options = pickle.loads(body)
        g = grade_local(response, gold, bool(truncated), options.rel_tol)
        send((i, g.correct, g.extracted, g.reason))


if __name__ == "__main__":
    main()
