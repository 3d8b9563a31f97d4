"""Asynchronous one-step off-policy rollout (``rollout.staleness = 1``).

Synchronous RL alternates: sample batch n with weights v_n, update to v_(n+1), push, sample batch n+1.
The engine idles while the trainer updates and the trainer idles while the engine samples. With one
step of staleness (verl's one-step off-policy recipe, AReaL and PipelineRL with the staleness bound at
1) the engine samples batch n+1 *while* the trainer updates on batch n, so batch n+1 comes from
weights v_n, one optimizer step older than the weights it trains (v_(n+1))::

    step n:   take batch n (sampled with v_(n-1)) | submit batch n+1 on v_n | grade n | update -> v_(n+1)
              | wait for batch n+1 | push v_(n+1)
    step n+1: take batch n+1 (sampled with v_n)   | submit batch n+2 on v_(n+1) | ...

The engine cannot take new weights while it samples, so the push waits for the running generation:
the staleness is exactly 1 from the second step on (the first step samples its own batch first, on
v_0, as the synchronous loop does). The gap between the sampler (v_n) and the trainer (v_(n+1))
is what ``algo.tis_cap`` corrects (:mod:`mathrl.algo.correction`: truncated importance weights
pi_trainer / pi_sampler on every token), and what ``mismatch/*`` measures. The PPO ratio stays
relative to the trainer's weights before the update (the "proximal" policy of decoupled PPO).

Logged per step: ``rollout/weight_version`` (how many optimizer steps the sampling weights had),
``rollout/staleness`` (the trainer's step minus that), ``time/generate_async`` (the overlapped
generation's own wall time), ``time/generate_wait`` (how long the trainer then waited for it) and
``time/generate_overlap_frac`` (the share of the generation hidden behind the update).

Exact resume: at a checkpoint the next step's batch is already sampled (with the old weights, which
the checkpoint no longer holds), so each rank saves it (``rollout_ahead_rank<r>.pt``) and a resumed
run trains on it instead of sampling it again with newer weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

from mathrl.config import Config
from mathrl.rollout import PendingBatch, RolloutBatch
from mathrl.dist.collectives import DistInfo
from mathrl.train.sampling import Request, Sampled, grade_and_score, make_request


def batch_to_dict(batch) -> dict[str, Any]:
    """A `RolloutBatch` as plain tensors, strings and numbers (``torch.load(weights_only=True)`` reads it)."""
    return {f.name: getattr(batch, f.name) for f in fields(batch)}


def batch_from_dict(d: dict[str, Any]) -> RolloutBatch:
    return RolloutBatch(**{f.name: d[f.name] for f in fields(RolloutBatch) if f.name in d})


@dataclass
class _Ahead:
    """A batch sampled for ``step`` (0-based) with weights of version ``version``; ``pending`` until
    the generation ends, then ``batch``."""

    step: int
    version: int
    request: Request
    pending: PendingBatch | None = None
    batch: RolloutBatch | None = None
    seconds: float = 0.0         # the generation's own wall time


class OffPolicySampler:
    """Steps 1-3 of the RL loop with the next step's generation running during this step's update.

    The loop calls :meth:`take` at the start of a step (instead of
    :func:`mathrl.train.sampling.sample_step`) and :meth:`wait` before it pushes new weights into
    the engine. Every rank runs the same schedule (no collectives here: each rank has its own engine).
    """

    def __init__(self, cfg: Config, dist: DistInfo, tokenizer, rollout, problems: list) -> None:
        self.cfg, self.dist, self.tokenizer, self.rollout, self.problems = cfg, dist, tokenizer, rollout, problems
        self.ahead: _Ahead | None = None

    def _request(self, step: int) -> Request:
        return make_request(self.cfg, self.dist, self.tokenizer, self.problems, step)

    def take(self, state) -> Sampled:
        """The graded batch of step ``state.step``, and the next step's generation started on the
        engine's current weights (version ``state.step``)."""
        step, G = state.step, self.cfg.rollout.n
        times: dict[str, float] = {}
        ahead, self.ahead = self.ahead, None
        if ahead is not None and (ahead.step != step or ahead.batch is None):
            ahead = None  # not this step's (a resumed run with other settings): sample it now
        if ahead is None:  # the first step, or a resume without a saved batch: sample with the current weights
            req = self._request(step)
            t0 = time.perf_counter()
            batch = self.rollout.generate(req.prompts, G, req.sampling)
            times["generate"] = time.perf_counter() - t0
            version = state.step
        else:
            req, batch, version = ahead.request, ahead.batch, ahead.version
        if step + 1 < self.cfg.train.steps:  # the next step's batch, sampled while this step trains
            nxt = self._request(step + 1)
            self.ahead = _Ahead(step=step + 1, version=state.step, request=nxt,
                                pending=self.rollout.submit(nxt.prompts, G, nxt.sampling))
        s = grade_and_score(self.cfg, req, batch, times)  # grading overlaps the next generation
        s.stats = {"rollout/weight_version": float(version), "rollout/staleness": float(state.step - version)}
        return s

    def wait(self) -> dict[str, float]:
        """Wait for the running generation (before a weight push: the engine cannot take new weights
        while it samples). Returns the times ``generate_async`` (the generation's own wall time) and
        ``generate_wait`` (how long the trainer waited for it after its update); {} when none runs."""
        a = self.ahead
        if a is None or a.pending is None:
            return {}
        t0 = time.perf_counter()
        pending, a.pending = a.pending, None
        a.batch = pending.result()
        a.seconds = pending.seconds
        return {"generate_async": a.seconds, "generate_wait": time.perf_counter() - t0}

    def close(self) -> None:
        """Let a running generation end (the engine is closed next; its thread must not be mid-call)."""
        if self.ahead is not None and self.ahead.pending is not None:
            try:
                self.ahead.pending.result()
            except Exception:  # noqa: BLE001 - closing after a failure: the first error is the one reported
                pass
            self.ahead = None

    # ---- checkpoint -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """The batch already sampled for the next step (None when there is none), after :meth:`wait`."""
        a = self.ahead
        if a is None or a.batch is None:
            return None
        return {"step": a.step, "version": a.version, "indices": a.request.indices,
                "seed": a.request.sampling.seed, "seconds": a.seconds, "batch": batch_to_dict(a.batch)}

    def load_state_dict(self, d: dict[str, Any] | None) -> None:
        if d is None:
            self.ahead = None
            return
        req = make_request(self.cfg, self.dist, self.tokenizer, self.problems, int(d["step"]),
                           indices=[int(i) for i in d["indices"]], seed=int(d["seed"]))
        batch = batch_from_dict(d["batch"])
        if list(batch.prompt_text) != list(req.prompts):
            raise ValueError(f"the saved rollout batch of step {int(d['step']) + 1} was sampled for other prompts "
                             "than the training data gives now (was data.* changed?)")
        self.ahead = _Ahead(step=int(d["step"]), version=int(d["version"]), request=req, batch=batch,
                            seconds=float(d.get("seconds", 0.0)))
