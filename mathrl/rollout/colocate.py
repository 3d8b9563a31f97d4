"""The colocated GPU schedule (TRL's ``vllm_enable_sleep_mode``, verl's rollout resume/release):
the rollout engine hands its GPU memory to the trainer between generations.

Per training step::

    generate            (engine fully awake)
    sleep(level)        after generation: KV cache freed, weights dropped (2, the default) or offloaded (1)
    ... train ...       the trainer has the memory
    wake_up(["weights"])     before the weight sync: weight memory back (level 2: its content is garbage),
                             KV cache still free
    update_weights      the sync: every weight, so level 2 loses nothing
    wake_up(["kv_cache"])    before the next generation

Level 2 is the default (TRL's choice): level 1 copies the whole model to CPU memory at every sleep and back
at every wake, only for the sync to overwrite it. After a level-2 sleep the weights are garbage until a sync
has pushed them (`weights_loaded`, called by the engine after a completed ``update_weights``). A generation
before that (the next round of dynamic sampling, offline RFT's presampling: generations with no update in
between) first pushes the trainer's weights again through the engine's ``reload`` (`reload_weights_with`,
set by `mathrl.train.models.make_rollout`: the same sync, so under ZeRO-3 a collective that every rank reaches
at the same generation); without one it is refused (`SleepSchedule.wake_all` raises) instead of sampling from
garbage. The engine checks
the sync covered every parameter (`mathrl.rollout.vllm_core.VLLMCore.load_weights`). Before every wake the
trainer's cached-but-free CUDA blocks are returned to the driver (``torch.cuda.empty_cache()``, as TRL does:
vLLM's wake allocates outside PyTorch's caching allocator and can otherwise run out of memory that is free
only inside the cache).

Before the first step the run puts the engine to sleep before it fits the micro-batch budget
(`mathrl.train.memory.fit_micro_batches`), so the update gets the memory the engine frees while it sleeps.

`SleepSchedule` keeps the engine's state and does these calls; ``train_step`` calls
`before_generate`, `after_generate` and `before_sync` (each returns its timings, logged as
``time/sleep`` and ``time/wake``), and the engine itself calls `ensure_awake` before any other
generation (evaluation) or weight push, so no call ever reaches a sleeping engine. An engine
without a schedule (``rollout.sleep_between_steps`` off, the default, and always on CPU: vLLM-CPU
has no sleep mode) gets no call at all: the functions below return ``{}`` and do nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

AWAKE, ASLEEP, WEIGHTS_ONLY = "awake", "asleep", "weights"


class SleepSchedule:
    """Sleep / wake bookkeeping for one engine with ``sleep(level)`` and ``wake_up(tags=None)``.

    ``weights_dropped``: a level-2 sleep discarded the weights and no sync has loaded them since."""

    def __init__(self, engine, level: int = 2) -> None:
        if level not in (1, 2):
            raise ValueError(f"rollout.sleep_level={level}: vLLM sleep levels are 1 and 2")
        self.engine = engine
        self.level = level
        self.state = AWAKE
        self.weights_dropped = False
        self.reload: Callable[[], Any] | None = None  # pushes the trainer's weights (a full sync)

    def _wake(self, tags: list[str] | None) -> float:
        t0 = time.perf_counter()
        torch.cuda.empty_cache()  # give the allocator's free blocks back first (a no-op without CUDA)
        self.engine.wake_up(tags=tags)
        return time.perf_counter() - t0

    def weights_loaded(self) -> None:
        """A complete weight sync has reached the engine: its weights are valid again."""
        self.weights_dropped = False

    def sleep(self) -> dict[str, float]:
        if self.state == ASLEEP:
            return {}
        if self.state == WEIGHTS_ONLY:  # (never in the schedule) wake the KV cache first: vLLM sleeps all
            self._wake(["kv_cache"])
        t0 = time.perf_counter()
        self.engine.sleep(self.level)
        self.state = ASLEEP
        self.weights_dropped = self.weights_dropped or self.level == 2
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
        if self.weights_dropped and self.reload is None:
            raise RuntimeError(
                "rollout.sleep_level=2: the vLLM engine dropped its weights when it went to sleep and no weight sync "
                "has loaded them since, so it would generate from garbage; push the weights first (sync_weights), or "
                "use rollout.sleep_level=1 (the weights are kept in CPU memory)")
        if self.state == ASLEEP:  # weights first, then the KV cache, as in the step schedule
            out = self.wake_weights()
        else:
            out = {}
        if self.weights_dropped:  # level 2 with no sync since the sleep: push the weights again
            t0 = time.perf_counter()
            self.reload()
            if self.weights_dropped:
                raise RuntimeError("rollout.sleep_level=2: the weight reload after a level-2 sleep did not complete")
            out["wake_resync"] = time.perf_counter() - t0
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


def fall_asleep(rollout) -> dict[str, float]:
    """Put the engine to sleep outside the step (before the run fits its micro-batch budget, so that the fit
    sees the memory the sleeping engine leaves free): ``{"sleep": seconds}``; ``{}`` without a schedule."""
    return after_generate(rollout)


def reload_weights_with(rollout, reload: Callable[[], Any]) -> None:
    """How the engine gets the trainer's weights back when it must generate after a level-2 sleep with no sync
    since (``reload()``: a full sync into ``rollout``); nothing without a schedule."""
    s = schedule_of(rollout)
    if s is not None:
        s.reload = reload


def weights_loaded(rollout) -> None:
    """Called by the engine after a complete weight sync (a level-2 sleep's weights are valid again)."""
    s = schedule_of(rollout)
    if s is not None:
        s.weights_loaded()


def ensure_awake(rollout, *, weights_only: bool = False) -> None:
    """Called by the engine before generating / scoring (everything) or loading weights (weights)."""
    s = schedule_of(rollout)
    if s is not None:
        s.wake_weights() if weights_only else s.wake_all()
