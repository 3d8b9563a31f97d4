"""Fault injection for the reliability tests and the GPU check: real faults at chosen points of a real run,
installed from outside the product's code (nothing in ``mathrl/train`` knows about them).

``MATHRL_FAULT`` (or the ``spec`` given to :func:`install`) holds comma-separated ``action@point@step``
entries; each fires once, when the trainer passes ``point`` at ``step`` (the step being computed, counted
from 1; ``ckpt_write`` uses the checkpoint's step). Actions:

* ``kill`` -- SIGKILL this process (no cleanup, no ``finally``: what a power cut or the OOM killer does);
* ``fsize=<bytes>`` -- lower RLIMIT_FSIZE, so every later write past that file size fails with
  EFBIG (a real kernel-enforced write failure, like a full disk; SIGXFSZ is ignored so the write
  returns an error instead of killing the process);
* ``nan`` -- the value at that point becomes NaN (``loss`` only).

Points, each a wrapper around the product function named:

* ``step_start`` -- before the RL step (:func:`mathrl.train.loop.train_step`);
* ``generate`` -- after sampling, before grading (:func:`mathrl.train.sampling.grade_and_score`, in the
  synchronous and the asynchronous sampler);
* ``loss`` -- the loss of the last real micro-batch of an update, after the others were backpropagated
  (the ``micro_loss`` that :func:`mathrl.train.update.accumulate_and_step` runs);
* ``optimizer`` -- after the backwards, before the optimizer step (:func:`mathrl.train.update.skip_or_step`);
* ``ckpt_write`` -- the checkpoint's DeepSpeed state and weights written, its manifest not yet
  (:func:`mathrl.train.checkpoint.hash_own_files`).

In a test: ``install("nan@loss@2", setattr=monkeypatch.setattr)`` (undone with the monkeypatch). In a child
process: ``python -m mathrl.testing.faults train ...`` is ``mathrl train ...`` with ``MATHRL_FAULT``'s faults
installed (what scripts/gpu_check.py launches).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

__all__ = ["ENV", "POINTS", "install", "parse"]

ENV = "MATHRL_FAULT"
POINTS = ("generate", "loss", "optimizer", "ckpt_write", "step_start")


def parse(spec: str) -> dict[tuple[str, int], str]:
    """``{(point, step): action}`` of a fault spec (a ``ValueError`` naming the bad entry)."""
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


class _Plan:
    def __init__(self, spec: str) -> None:
        self.todo = parse(spec)

    def fire(self, point: str, step: int) -> bool:
        """Fire the fault planned for (point, step), if any; True when the caller should inject a NaN."""
        action = self.todo.pop((point, step), None)
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


def install(spec: str | None = None, *, setattr: Callable[[Any, str, Any], None] = setattr) -> None:
    """Wrap the product functions of the planned points (see the module docstring); ``spec`` defaults to
    ``$MATHRL_FAULT``. ``setattr`` replaces each module attribute (``monkeypatch.setattr`` in a test)."""
    from mathrl.train import checkpoint, loop, offpolicy, sampling, sft, update

    plan = _Plan(os.environ.get(ENV, "") if spec is None else spec)
    points = {point for point, _ in plan.todo}
    if "step_start" in points:
        real_step = loop.train_step

        def train_step(cfg, dist, models, rollout, problems, state, *a, **k):
            plan.fire("step_start", state.step + 1)
            return real_step(cfg, dist, models, rollout, problems, state, *a, **k)

        setattr(loop, "train_step", train_step)
    if "generate" in points:
        real_grade = sampling.grade_and_score

        def grade_and_score(cfg, req, *a, **k):
            plan.fire("generate", req.step + 1)
            return real_grade(cfg, req, *a, **k)

        setattr(sampling, "grade_and_score", grade_and_score)
        setattr(offpolicy, "grade_and_score", grade_and_score)
    if "loss" in points:
        real_loop = update.accumulate_and_step

        def accumulate_and_step(engine, plan_, micro_loss, **k):
            n_real, seen = sum(real for _, real in plan_), [0]

            def poisoned(rows, real, check):
                out = micro_loss(rows, real, check)
                seen[0] += real
                if real and seen[0] == n_real and plan.fire("loss", k.get("step", 0)):
                    loss = out.loss * float("nan")
                    guarded = {**out.guarded, out.loss_key: loss}
                    return update.MicroLoss(loss, guarded, out.loss_key)
                return out

            return real_loop(engine, plan_, poisoned, **k)

        setattr(update, "accumulate_and_step", accumulate_and_step)
        setattr(sft, "accumulate_and_step", accumulate_and_step)
    if "optimizer" in points:
        real_skip = update.skip_or_step

        def skip_or_step(engine, guard, problem, what, step):
            plan.fire("optimizer", step)
            return real_skip(engine, guard, problem, what, step)

        setattr(update, "skip_or_step", skip_or_step)
    if "ckpt_write" in points:
        real_hash = checkpoint.hash_own_files

        def hash_own_files(folder, rank, world_size):
            plan.fire("ckpt_write", int(str(folder).rsplit("step_", 1)[1]))
            return real_hash(folder, rank, world_size)

        setattr(checkpoint, "hash_own_files", hash_own_files)


def main(argv: list[str] | None = None) -> int:
    """``mathrl <argv>`` with ``$MATHRL_FAULT``'s faults installed."""
    from mathrl.cli import main as mathrl_main

    install()
    return mathrl_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
