"""The colocated GPU schedule (TRL's ``vllm_enable_sleep_mode``, verl's rollout resume/release):
the rollout engine hands its GPU memory to the trainer between generations.

Per training step::

    generate            (engine fully awake)
    sleep(level)        after generation: KV cache freed, weights offloaded (1) or dropped (2)
    ... train ...       the trainer has the memory
    wake_up(["weights"])     before the weight sync: weights back, KV cache still free
    update_weights      the sync
    wake_up(["kv_cache"])    before the next generation

`SleepSchedule` keeps the engine's state and does these calls; ``train_step`` calls
`before_generate`, `after_generate` and `before_sync` (each returns its timings, logged as
``time/sleep`` and ``time/wake``), and the engine itself calls `ensure_awake` before any other
generation (evaluation) or weight push, so no call ever reaches a sleeping engine. An engine
without a schedule (``rollout.sleep_between_steps`` off, the default, and always on CPU: vLLM-CPU
has no sleep mode) gets no call at all: the functions below return ``{}`` and do nothing.
"""

from __future__ import annotations

import time

AWAKE, ASLEEP, WEIGHTS_ONLY = "awake", "asleep", "weights"


class SleepSchedule:
    """Sleep / wake bookkeeping for one engine with ``sleep(level)`` and ``wake_up(tags=None)``."""

    def __init__(self, engine, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"rollout.sleep_level={level}: vLLM sleep levels are 1 and 2")
        self.engine = engine
        self.level = level
        self.state = AWAKE

    def _wake(self, tags: list[str] | None) -> float:
        t0 = time.perf_counter()
        self.engine.wake_up(tags=tags)
        return time.perf_counter() - t0

    def sleep(self) -> dict[str, float]:
        if self.state == ASLEEP:
            return {}
        if self.state == WEIGHTS_ONLY:  # (never in the schedule) wake the KV cache first: vLLM sleeps all
            self._wake(["kv_cache"])
        t0 = time.perf_counter()
        self.engine.sleep(self.level)
        self.state = ASLEEP
        return {"sleep": time.perf_counter() - t0}

    def wake_weights(self) -> dict[str, float]:
        if self.state != ASLEEP:
            return {}
        dt = self._wake(["weights"])
        self.state = WEIGHTS_ONLY
        return {"wake_weights": dt}

    def wake_all(self) -> dict[str, float]:
        if self.state == AWAKE:
            return {}
        if self.state == ASLEEP:  # weights first, then the KV cache, as in the step schedule
            out = self.wake_weights()
        else:
            out = {}
        out["wake_kv_cache"] = self._wake(["kv_cache"])
        self.state = AWAKE
        return out


def schedule_of(rollout) -> SleepSchedule | None:
    return getattr(rollout, "sleep_schedule", None)


def _with_total(t: dict[str, float]) -> dict[str, float]:
    return {**t, "wake": sum(v for k, v in t.items() if k.startswith("wake_"))}


def before_generate(rollout) -> dict[str, float]:
    """Wake the KV cache (and the weights if needed): ``{"wake": s, "wake_kv_cache": s, ...}``;
    ``{}`` without a schedule."""
    s = schedule_of(rollout)
    return _with_total(s.wake_all()) if s is not None else {}


def after_generate(rollout) -> dict[str, float]:
    """Put the engine to sleep: ``{"sleep": seconds}``; ``{}`` without a schedule."""
    s = schedule_of(rollout)
    return {"sleep": 0.0, **s.sleep()} if s is not None else {}


def before_sync(rollout) -> dict[str, float]:
    """Wake the weights only (the KV cache stays free during the sync): ``{"wake": s,
    "wake_weights": s}``; ``{}`` without a schedule."""
    s = schedule_of(rollout)
    return _with_total(s.wake_weights()) if s is not None else {}


def ensure_awake(rollout, *, weights_only: bool = False) -> None:
    """Called by the engine before generating / scoring (everything) or loading weights (weights)."""
    s = schedule_of(rollout)
    if s is not None:
        s.wake_weights() if weights_only else s.wake_all()
