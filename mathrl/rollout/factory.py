"""`make_engine`: the config's ``rollout.backend`` turned into an engine.

The backends are registered here, in :data:`mathrl.registry.ROLLOUT_BACKENDS` (name -> ``build(model_path,
**options)``, each importing its engine lazily); ``auto`` is not a backend but the choice
:func:`resolve_backend` makes between them."""

from __future__ import annotations

from mathrl.registry import ROLLOUT_BACKENDS
from mathrl.rollout.base import RolloutEngine

__all__ = ["ROLLOUT_BACKENDS", "make_engine", "resolve_backend"]


@ROLLOUT_BACKENDS.register("vllm", doc="vLLM, in this process or in a worker interpreter (rollout.vllm_python)")
def build_vllm(model_path: str, *, vllm_python: str | None = None, dtype: str = "float32", seed: int = 0,
               model=None, tokenizer=None, **kwargs) -> RolloutEngine:
    """The vLLM engine for ``model_path`` (it loads the model itself; ``model`` must be None)."""
    from mathrl.rollout.vllm import VLLMRolloutEngine  # here: backends import lazily (the vLLM worker imports mathrl.rollout under another transformers)

    if model is not None:
        raise ValueError("make_engine: `model` is for the hf backend; vLLM loads model_path itself")
    return VLLMRolloutEngine(model_path, vllm_python=vllm_python, dtype=dtype, seed=seed, tokenizer=tokenizer, **kwargs)


@ROLLOUT_BACKENDS.register("hf", doc="transformers' generate in this process (can share the trainer's module)")
def build_hf(model_path: str, *, vllm_python: str | None = None, dtype: str = "float32", seed: int = 0,
             model=None, tokenizer=None, **kwargs) -> RolloutEngine:
    """The transformers engine for ``model_path`` (or ``model``, shared); ``seed`` is per call (``SamplingConfig``)."""
    from mathrl.rollout.hf import HFRolloutEngine  # here: backends import lazily (the vLLM worker imports mathrl.rollout under another transformers)

    return HFRolloutEngine(model_path, model=model, tokenizer=tokenizer, dtype=dtype, **kwargs)


def resolve_backend(backend: str, vllm_python: str | None = None) -> tuple[str, str]:
    """Which backend ``auto`` picks, and why: vLLM when importable here, or when a worker
    interpreter (``vllm_python``, ``$MATHRL_VLLM_PYTHON`` or ``.venv-vllm``) imports it; else hf."""
    if backend != "auto" and backend not in ROLLOUT_BACKENDS:
        raise ValueError(f"rollout.backend={backend!r}: allowed values are {', '.join((*ROLLOUT_BACKENDS, 'auto'))}")
    if backend != "auto":
        return backend, "asked for"
    from mathrl.rollout.vllm import default_vllm_python, probe_vllm_python, vllm_importable  # here: looked up at call time, tests stand in for rollout.vllm.vllm_importable/default_vllm_python

    if vllm_python in (None, "inprocess") and vllm_importable():
        return "vllm", "vllm is importable in this interpreter"
    py = vllm_python if vllm_python not in (None, "inprocess") else default_vllm_python()
    if py is not None:
        ok, why = probe_vllm_python(py)
        if ok:
            return "vllm", f"worker interpreter {py} has vllm {why}"
        return "hf", f"vllm unusable: {why}"
    return "hf", "vllm is not importable and no vllm_python is configured"


def make_engine(backend: str, model_path: str, *, vllm_python: str | None = None, dtype: str = "float32",
                seed: int = 0, model=None, tokenizer=None, **kwargs) -> RolloutEngine:
    """Build a rollout engine.

    Args:
        backend: ``vllm``, ``hf`` or ``auto`` (see `resolve_backend`).
        model_path: model spec (``embedded``, local folder, hub id; vllm needs a local folder).
        vllm_python: worker interpreter for the vllm backend (``None``: in-process if possible,
            else ``$MATHRL_VLLM_PYTHON`` / ``.venv-vllm``).
        dtype: engine dtype.
        seed: vLLM engine seed (the hf backend seeds each call from ``SamplingConfig.seed``).
        model: hf backend only: a loaded model to use (e.g. the trainer's module, shared).
        tokenizer: a loaded tokenizer (else loaded from ``model_path``).
        kwargs: backend-specific options (hf: ``max_batch_rows``, ``device``; vllm:
            ``engine_kwargs``, ``enable_prefix_caching``, ``worker_env``, ``startup_timeout``).
    """
    chosen, _why = resolve_backend(backend, vllm_python)
    return ROLLOUT_BACKENDS.get(chosen)(model_path, vllm_python=vllm_python, dtype=dtype, seed=seed, model=model,
                                        tokenizer=tokenizer, **kwargs)
