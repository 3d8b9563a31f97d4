"""The weight side of the vllm backend, run inside vLLM's workers through ``LLM.collective_rpc``: which
loader pushes ``(name, tensor)`` pairs into this vLLM version (`select_weight_loader`), the CPU LM-head
fix after a reload (`refresh_cpu_embedding_gemm`), and the level-2 sleep's buffer save/restore and
unwritten-parameter check. Imports only torch; `mathrl.rollout.vllm_core` explains the reload path."""

from __future__ import annotations

from typing import Any

import torch


def refresh_cpu_embedding_gemm(model: torch.nn.Module) -> int:
    """Rebuild the CPU GEMM handle of every embedding / LM-head module from its live weight.

    vLLM CPU (checked on 0.32.0) builds a oneDNN handle for the LM head from the embedding weight
    in ``UnquantizedEmbeddingMethod.process_weights_after_loading``. ``reload_weights`` reruns that
    on a temporary copy of the layer and then copies the values back into the original tensor, so
    the input embedding is updated but the LM-head handle is not: with tied embeddings (SmolLM2)
    the logits stay wrong (measured: max |dlogprob| 0.5 after a 1% perturbation of the embedding
    alone). Re-dispatching from the original, now updated, tensor fixes it.
    """
    n = 0
    for module in model.modules():
        qm = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if type(qm).__name__ == "UnquantizedEmbeddingMethod" and isinstance(weight, torch.Tensor) \
                and weight.numel() > 0 and weight.ndim == 2:
            qm.process_weights_after_loading(module)
            n += 1
    return n


def accepts_keyword(fn, name: str) -> bool | None:
    """True: ``fn`` has a parameter ``name``; None: it only forwards ``**kwargs``; False: neither."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        return True
    return None if any(q.kind == q.VAR_KEYWORD for q in params.values()) else False


def select_weight_loader(worker) -> tuple[str, Any]:
    """How to push ``(name, tensor)`` pairs into this vLLM worker: ``(kind, load(weights))``.

    * ``reload_weights``: ``Worker.reload_weights(weights_iterator=...)`` (layerwise reload, e.g.
      vLLM 0.32): reruns the post-load processing, needed on CPU (repacked oneDNN weights) and for
      quantized / repacked kernels.
    * ``load_weights``: the model's own ``load_weights(weights)`` (vLLM versions whose
      ``reload_weights(self)`` takes no arguments and re-reads the checkpoint from disk, e.g. around
      0.14, or have none): a plain copy into the parameters, which GPU kernels read directly.
    """
    w = getattr(worker, "worker", worker)
    reload = getattr(w, "reload_weights", None)
    runner = getattr(w, "model_runner", None)
    if reload is not None:
        takes = accepts_keyword(reload, "weights_iterator")
        if takes is None:  # vLLM 0.32's Worker.reload_weights(*args, **kwargs) forwards to its model runner
            runner_reload = getattr(runner, "reload_weights", None)
            takes = runner_reload is not None and accepts_keyword(runner_reload, "weights_iterator") is True
        if takes:
            return "reload_weights", lambda weights: reload(weights_iterator=weights)
    model = None
    if runner is not None:
        model = runner.get_model() if callable(getattr(runner, "get_model", None)) else getattr(runner, "model", None)
    if model is not None and callable(getattr(model, "load_weights", None)):
        return "load_weights", model.load_weights
    raise RuntimeError(f"vLLM worker {type(w).__name__}: no way to load weights (neither "
                       "reload_weights(weights_iterator=...) nor model_runner.model.load_weights)")


def worker_model(worker) -> torch.nn.Module:
    w = getattr(worker, "worker", worker)
    runner = w.model_runner
    return runner.get_model() if callable(getattr(runner, "get_model", None)) else runner.model


def rpc_save_buffers(worker) -> int:
    """Before a level-2 sleep (which discards everything allocated with the weights): a CPU copy of every
    buffer of the model, kept on the worker. Returns how many."""
    w = getattr(worker, "worker", worker)
    w._mathrl_saved_buffers = {n: b.detach().to("cpu", copy=True)
                               for n, b in worker_model(worker).named_buffers()}
    return len(w._mathrl_saved_buffers)


def rpc_restore_buffers_poison_parameters(worker) -> int:
    """After the weights' wake from a level-2 sleep: copy the saved buffers back, and fill every floating-point
    parameter with NaN, so that `rpc_unloaded_parameters` finds the ones a weight sync did not write.
    Returns the number of parameters filled."""
    w = getattr(worker, "worker", worker)
    model = worker_model(worker)
    saved = getattr(w, "_mathrl_saved_buffers", {})
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in saved:
                b.copy_(saved[n])
        filled = 0
        for p in model.parameters():
            if p.is_floating_point():
                p.fill_(float("nan"))
                filled += 1
    return filled


def rpc_unloaded_parameters(worker) -> list[str]:
    """Names of the model's floating-point parameters that still hold NaN (none after a complete sync)."""
    model = worker_model(worker)
    named = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    if not named:
        return []
    with torch.no_grad():
        flags = torch.stack([torch.isnan(p).any() for _, p in named]).tolist()
    return [n for (n, _), bad in zip(named, flags) if bad]
