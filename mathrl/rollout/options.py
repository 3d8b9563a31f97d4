"""What builds a rollout engine from a config: :class:`EngineOptions`, the one object that both the trainer
(:func:`mathrl.train.models.make_rollout`) and ``mathrl eval`` (:func:`mathrl.eval.evaluate.make_eval_engine`)
build, so the two cannot read the ``rollout.*`` settings differently.

Resolved once, here: the backend (``auto`` -> vllm or hf, with the reason), the engine's dtype
(:func:`mathrl.config.auto.rollout_dtype`: ``rollout.dtype``, else the model's), the
engine seed (``rollout.seed``, else ``train.seed``) and the backend's own options. Both purposes pass vLLM
``rollout.kv_cache_gb``, ``max_model_len``, ``max_num_batched_tokens`` and ``enforce_eager``; training adds
what only colocation with the trainer needs (``gpu_memory_utilization``, tensor parallelism over the
trainer's ranks, sleep mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mathrl.config import auto
from mathrl.rollout.base import RolloutEngine
from mathrl.rollout.vllm import dist_from_env

__all__ = ["EngineOptions", "engine_dtype"]


def engine_dtype(cfg) -> str:
    """The rollout engine's dtype: ``rollout.dtype``, else the trainer's model's
    (:func:`mathrl.config.auto.rollout_dtype`)."""
    return auto.rollout_dtype(cfg)


@dataclass(frozen=True)
class EngineOptions:
    """A rollout engine's settings, resolved from a config (:meth:`from_config`); :meth:`build` makes it."""

    backend: str                       # "hf" or "vllm" (auto resolved)
    why: str                           # why: "asked for", or what auto found
    dtype: str
    seed: int
    vllm_python: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # the backend's own keyword arguments

    @classmethod
    def from_config(cls, cfg, *, purpose: Literal["train", "eval"], device=None) -> EngineOptions:
        """``purpose = "train"``: the engine colocated with the trainer; ``"eval"``: a standalone evaluation
        engine. ``device``: where the hf backend runs (the trainer's device). A bad ``rollout.backend``
        raises ``ValueError`` naming the allowed values."""
        from mathrl.rollout import resolve_backend  # here: looked up at call time, tests stand in for mathrl.rollout.resolve_backend

        r = cfg.rollout
        backend, why = resolve_backend(r.backend, r.vllm_python)
        options: dict[str, Any] = {}
        if backend == "hf":
            if device is not None:
                options["device"] = device
        else:
            options.update(cpu_kv_cache_gb=r.kv_cache_gb, max_model_len=r.max_model_len,
                           max_num_batched_tokens=r.max_num_batched_tokens, enforce_eager=r.enforce_eager)
            if purpose == "train":

                options.update(gpu_memory_utilization=r.gpu_memory_utilization,
                               tensor_parallel_size=r.tensor_parallel_size, enable_sleep_mode=r.enable_sleep_mode,
                               sleep_between_steps=r.sleep_between_steps, sleep_level=r.sleep_level,
                               dist=dist_from_env())
        seed = cfg.train.seed if r.seed is None else r.seed
        return cls(backend=backend, why=why, dtype=engine_dtype(cfg), seed=seed, vllm_python=r.vllm_python,
                   options=options)

    def build(self, model_path: str, *, tokenizer=None, model=None) -> RolloutEngine:
        """The engine for ``model_path``; ``model`` (hf only): a loaded module to generate with (shared)."""
        from mathrl.rollout import make_engine  # here: looked up at call time, tests stand in for mathrl.rollout.make_engine

        kwargs = dict(self.options)
        if model is not None:
            kwargs["model"] = model
        return make_engine(self.backend, model_path, vllm_python=self.vllm_python, dtype=self.dtype, seed=self.seed,
                           tokenizer=tokenizer, **kwargs)
