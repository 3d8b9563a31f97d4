"""Reading the trainer's parameters for `RolloutEngine.update_weights`, one tensor at a time."""

from __future__ import annotations

from typing import Iterator

import torch


def iter_full_parameters(model: torch.nn.Module, *, dtype: torch.dtype | None = None,
                         strip_prefix: str = "module.") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every parameter of ``model``, lazily.

    A DeepSpeed ZeRO-3 parameter (it has a ``ds_id``) is gathered alone with
    ``deepspeed.zero.GatheredParameters`` and a detached copy is yielded, so at most one full
    parameter is materialised at a time, and the copy stays valid after the shards are released.
    Other parameters are yielded as detached views (no copy). ``strip_prefix`` removes the
    ``module.`` a DDP / DeepSpeed engine wrapper adds. ``dtype`` casts (e.g. bf16 for a GPU engine).
    """
    for name, p in model.named_parameters():
        if strip_prefix and name.startswith(strip_prefix):
            name = name[len(strip_prefix):]
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                t = p.detach().clone()
        else:
            t = p.detach()
        yield name, (t.to(dtype) if dtype is not None and t.dtype != dtype else t)
