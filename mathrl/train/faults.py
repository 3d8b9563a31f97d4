"""Fault injection for the reliability tests: real faults at chosen points of a real run.

``MATHRL_FAULT`` holds comma-separated ``action@point@step`` entries; each fires once, when the
trainer passes ``point`` at ``step`` (the step being computed, counted from 1; checkpoint points use
the checkpoint's step). Actions:

* ``kill`` -- SIGKILL this process (no cleanup, no ``finally``: what a power cut or the OOM killer does);
* ``fsize=<bytes>`` -- lower RLIMIT_FSIZE, so every later write past that file size fails with
  EFBIG (a real kernel-enforced write failure, like a full disk; SIGXFSZ is ignored so the write
  returns an error instead of killing the process);
* ``nan`` -- :func:`fault` returns True and the caller poisons the value it guards with NaN.

Points: ``generate`` (after sampling), ``loss`` (the policy loss of the last micro-batch of a
mini-batch, after the others were backpropagated),
``optimizer`` (after backward, before the optimizer step), ``ckpt_write`` (DeepSpeed state
written, manifest not yet), ``step_start``.

Unset (every normal run), :func:`fault` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["fault", "parse"]

ENV = "MATHRL_FAULT"
POINTS = ("generate", "loss", "optimizer", "ckpt_write", "step_start")


def parse(spec: str) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            action, point, step = item.split("@")
            key = (point, int(step))
        except ValueError:
            raise ValueError(f"{ENV}: bad entry {item!r}; expected action@point@step, e.g. kill@optimizer@3") from None
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown point {point!r} in {item!r}; allowed: {', '.join(POINTS)}")
        if not (action in ("kill", "nan") or action.startswith("fsize=")):
            raise ValueError(f"{ENV}: unknown action {action!r} in {item!r}; allowed: kill, nan, fsize=<bytes>")
        out[key] = action
    return out


_PLAN: dict[tuple[str, int], str] | None = None


def fault(point: str, step: int) -> bool:
    """Fire the fault planned for (point, step), if any; True when the caller should inject a NaN."""
    global _PLAN
    if _PLAN is None:
        _PLAN = parse(os.environ.get(ENV, ""))
    if not _PLAN:
        return False
    action = _PLAN.pop((point, step), None)
    if action is None:
        return False
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action.startswith("fsize="):
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(action.split("=", 1)[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return False
    return action == "nan"
