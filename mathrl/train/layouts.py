"""Forward layouts as strategies: how a model's training forwards lay a batch's rows out.

A :class:`Layout` is chosen once per model (:func:`choose_layout`, when the models are built:
``Models.layouts``) from what the config asks (``train.share_prompt``, ``train.packing``,
``train.padding_free``) and what the model can run (its attention kernel, gradient checkpointing,
ZeRO-3). Every call site then passes a :class:`~mathrl.train.rows.ForwardBatch` and rows:

* ``layout.plan(tokens, budget, rows)``: the token-budgeted micro-batches (runs of rows; whole groups
  where the layout shares a prompt);
* ``layout.micro_batch(tokens, rows, device)``, then ``layout.policy_forward(model, mb, ...)`` (per-token
  logprobs and entropies) or ``layout.value_forward(critic, mb)``;
* ``layout.logprobs(model, tokens, ...)`` / ``layout.values(critic, tokens, ...)``: the no-grad forwards of
  a whole batch, with the micro-batch count agreed across ranks.

The layouts, all with the same logprobs, entropies, values and gradients (tests/train/test_forward_reference.py):

=================  ===================================================================================
``padded``         ``[prompt | response]`` per row, trimmed to the micro-batch's longest
                   (:mod:`mathrl.train.forward`)
``shared-prompt``  padded, each group's prompt run once and its cache repeated G times
``packed``         a group's responses first-fit into bins after one run of its prompt
                   (:mod:`mathrl.train.packing`); ``packed-one-call``: prompt and bins in one model call
                   (chosen under ZeRO-3, which gathers the parameters in every call)
``varlen``         every row's real tokens end to end, no mask (:mod:`mathrl.train.varlen`)
=================  ===================================================================================
"""

from __future__ import annotations

import torch
from torch import Tensor

from mathrl.config import Config
from mathrl.train.rows import ForwardBatch
from mathrl.train.forward import (MicroBatch, agreed_plan, checkpointing, is_zero3,
                                  make_padded_micro_batch, padded_policy_forward, padded_value_forward,
                                  plan_micro_batches)
from mathrl.train.packing import (PackedMicroBatch, make_packed_micro_batch, packed_policy_forward,
                                  packed_value_forward, packing_supported)
from mathrl.train.varlen import (VarlenMicroBatch, make_varlen_micro_batch, varlen_kernel, varlen_policy_forward,
                                 varlen_value_forward)

__all__ = ["Layout", "Padded", "Packed", "Varlen", "choose_layout", "group_share", "layout_request"]


class Layout:
    """How a model's forwards lay rows out. ``group_size``: rows per prompt that a micro-batch keeps
    together (the planning unit; 1 = any run of rows)."""

    name = ""
    plans_real_tokens = False  # the plan's cost is the rows' real tokens (no padding computed)

    def __init__(self, group_size: int = 1):
        self.group_size = max(1, int(group_size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, group_size={self.group_size})"

    def plan(self, tokens: ForwardBatch, token_budget: int, rows: Tensor | None = None) -> list[Tensor]:
        """``rows`` (default: all) in consecutive micro-batches that fit ``token_budget`` as this layout
        computes them (:func:`~mathrl.train.forward.plan_micro_batches`)."""
        return plan_micro_batches(tokens.prompt_mask, tokens.response_mask, token_budget, rows,
                                  group_size=self.group_size, real=self.plans_real_tokens)

    def agreed(self, plan: list[Tensor]) -> list[tuple[Tensor, bool]]:
        """``plan`` padded to every rank's largest micro-batch count (:func:`~mathrl.train.forward.agreed_plan`)."""
        return agreed_plan(plan, self.group_size)

    def micro_batch(self, tokens: ForwardBatch, rows: Tensor, device: torch.device | str = "cpu"):
        """The micro-batch of ``rows`` in this layout, on ``device``."""
        raise NotImplementedError

    def policy_forward(self, model, mb, *, temperature: float = 1.0, with_entropy: bool = False
                       ) -> tuple[Tensor, Tensor | None]:
        """Per-token logprobs ``[n, T]`` of ``mb``'s responses under ``softmax(logits / temperature)`` (0 at
        padding) and, with ``with_entropy``, per-token entropies."""
        raise NotImplementedError

    def value_forward(self, critic, mb) -> Tensor:
        """Critic values ``[n, T]`` of the states before each response token (0 at padding)."""
        raise NotImplementedError

    @torch.no_grad()
    def logprobs(self, model, tokens: ForwardBatch, *, token_budget: int, temperature: float, device) -> Tensor:
        """Logprobs ``[N, T]`` of every response token of ``tokens`` under ``model`` (no grad), with the same
        forward count on every rank (ZeRO-3 gathers parameters inside each)."""
        return self._whole(tokens, token_budget, device,
                           lambda mb: self.policy_forward(model, mb, temperature=temperature)[0])

    @torch.no_grad()
    def values(self, critic, tokens: ForwardBatch, *, token_budget: int, device) -> Tensor:
        """Critic values ``[N, T]`` of every response token of ``tokens`` (no grad), as :meth:`logprobs`."""
        return self._whole(tokens, token_budget, device, lambda mb: self.value_forward(critic, mb))

    def _whole(self, tokens: ForwardBatch, token_budget: int, device, forward) -> Tensor:
        full = torch.zeros(tokens.response_ids.shape, dtype=torch.float32)
        for rows, real in self.agreed(self.plan(tokens, token_budget)):
            mb = self.micro_batch(tokens, rows, device)
            out = forward(mb)
            if real:  # padding entries only keep the ranks' forward counts equal
                full[mb.rows, : mb.T] = out.detach().to(full.device, full.dtype)
        return full


class Padded(Layout):
    """``[prompt | response]`` per row; with ``share_prompt`` (and ``group_size > 1``) each group's prompt runs
    once and its key/value cache is repeated for the group's responses (the shared-prompt layout)."""

    def __init__(self, group_size: int = 1, share_prompt: bool = True):
        super().__init__(group_size)
        self.share_prompt = share_prompt and self.group_size > 1
        self.name = "shared-prompt" if self.share_prompt else "padded"

    def micro_batch(self, tokens: ForwardBatch, rows: Tensor, device: torch.device | str = "cpu") -> MicroBatch:
        return make_padded_micro_batch(tokens, rows, device, self.group_size if self.share_prompt else 1)

    def policy_forward(self, model, mb: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
                       ) -> tuple[Tensor, Tensor | None]:
        return padded_policy_forward(model, mb, temperature=temperature, with_entropy=with_entropy)

    def value_forward(self, critic, mb: MicroBatch) -> Tensor:
        return padded_value_forward(critic, mb)


class Packed(Layout):
    """Each group's responses packed into bins after one run of its prompt (:mod:`mathrl.train.packing`);
    ``one_call``: prompt and bins in one model call."""

    def __init__(self, group_size: int, one_call: bool = False):
        super().__init__(group_size)
        self.one_call = one_call
        self.name = "packed-one-call" if one_call else "packed"

    def micro_batch(self, tokens: ForwardBatch, rows: Tensor, device: torch.device | str = "cpu"
                    ) -> PackedMicroBatch:
        return make_packed_micro_batch(tokens, rows, device, self.group_size, one_call=self.one_call)

    def policy_forward(self, model, mb: PackedMicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
                       ) -> tuple[Tensor, Tensor | None]:
        return packed_policy_forward(model, mb, temperature=temperature, with_entropy=with_entropy)

    def value_forward(self, critic, mb: PackedMicroBatch) -> Tensor:
        return packed_value_forward(critic, mb)


class Varlen(Layout):
    """Every row's real tokens end to end in one sequence without a mask (:mod:`mathrl.train.varlen`); the
    plan counts real tokens (prompt included in every row) and keeps groups whole (``group_size``)."""

    name = "varlen"
    plans_real_tokens = True

    def micro_batch(self, tokens: ForwardBatch, rows: Tensor, device: torch.device | str = "cpu"
                    ) -> VarlenMicroBatch:
        return make_varlen_micro_batch(tokens, rows, device)

    def policy_forward(self, model, mb: VarlenMicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
                       ) -> tuple[Tensor, Tensor | None]:
        return varlen_policy_forward(model, mb, temperature=temperature, with_entropy=with_entropy)

    def value_forward(self, critic, mb: VarlenMicroBatch) -> Tensor:
        return varlen_value_forward(critic, mb)


def choose_layout(model, request: bool | str = False, group_size: int = 1) -> Layout:
    """The layout ``model``'s forwards use for the request ``request`` (:func:`layout_request`: ``False``,
    ``True`` for ``train.packing``, ``"one_call"``, or ``"varlen"`` for ``train.padding_free``) with groups of
    ``group_size`` rows sharing a prompt (:func:`group_share`):

    * :class:`Varlen` when requested, or when packing is on and the model's attention is a kernel that runs
      packed sequences without a mask (flash-attention, flex);
    * :class:`Packed` when packing is on, groups share prompts, the attention takes the 4D mask and gradient
      checkpointing (which drops the prompt's cache) is off; in one call per micro-batch on request or under
      ZeRO-3, where each call gathers all parameters;
    * :class:`Padded` otherwise, sharing each group's prompt unless gradient checkpointing is on."""
    if request == "varlen" or (request and varlen_kernel(model)):
        return Varlen(group_size)
    ckpt = checkpointing(model)
    if request and group_size > 1 and packing_supported(model) and not ckpt:
        return Packed(group_size, one_call=request == "one_call" or is_zero3(model))
    return Padded(group_size, share_prompt=not ckpt)


def group_share(cfg: Config) -> int:
    """Rows per shared prompt in training forwards (1 = no sharing)."""
    return cfg.rollout.n if cfg.train.share_prompt and cfg.rollout.n > 1 else 1


def layout_request(cfg: Config) -> bool | str:
    """What the config asks of the training forwards' layout: ``"varlen"`` (train.padding_free) or
    train.packing (:func:`choose_layout` decides per model)."""
    return "varlen" if cfg.train.padding_free else cfg.train.packing
