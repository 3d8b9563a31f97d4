"""The rows every training forward reads (:class:`ForwardBatch`): a leaf of the forward layouts
(:mod:`mathrl.train.forward`, :mod:`mathrl.train.packing`, :mod:`mathrl.train.varlen`,
:mod:`mathrl.train.layouts`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ForwardBatch"]


@dataclass(frozen=True)
class ForwardBatch:
    """The rows every training forward reads: left-padded prompts and right-padded responses, ``[N, P]``
    and ``[N, T]``. A :class:`~mathrl.train.layouts.Layout` cuts it into micro-batches."""

    prompt_ids: Tensor      # [N, P]
    prompt_mask: Tensor     # [N, P] (1 at prompt tokens)
    response_ids: Tensor    # [N, T]
    response_mask: Tensor   # [N, T] bool (the response tokens; a 0/1 mask is taken as bool)

    def __post_init__(self):
        if self.response_mask.dtype != torch.bool:
            object.__setattr__(self, "response_mask", self.response_mask.bool())

    @classmethod
    def of(cls, batch, response_mask: Tensor | None = None) -> "ForwardBatch":
        """The rows of a :class:`~mathrl.rollout.RolloutBatch` (or any object with its four fields), with
        ``response_mask`` in place of its own where given."""
        mask = batch.response_mask if response_mask is None else response_mask
        return cls(batch.prompt_ids, batch.prompt_mask, batch.response_ids, mask)
