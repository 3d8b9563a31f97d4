"""Padding-free micro-batches: every row's real tokens in one sequence, no attention mask.

The rows of a micro-batch (``[prompt | response]`` each, without their padding) are laid end to
end in a single row of length ``L = sum(prompt_i + response_i)``; each row's positions restart at
0. No attention mask is passed: transformers reads the sequence boundaries from the restarting
``position_ids`` (``masking_utils.find_packed_sequence_indices``, and for flash-attention kernels
the varlen ``cu_seqlens`` built from them), so a token attends only to the earlier tokens of its own
row, as in the padded layout. Only the ``K`` positions that score response tokens go through the
LM head (``logits_to_keep`` as an index tensor)::

    ids  [ p1 p1 p1 r1 r1 | p2 p2 r2 r2 r2 r2 | p3 p3 p3 p3 r3 ]
    pos  [ 0  1  2  3  4  | 0  1  2  3  4  5  | 0  1  2  3  4  ]
    keep [       ^  ^     |    ^  ^  ^  ^     |          ^     ]   position before each response token

Nothing is padded and no dense ``[L, L]`` mask is built by mathrl: this is the layout that
flash-attention's variable-length kernel (``model.attn_implementation=flash_attention_2``) and
``flex_attention`` run natively (TRL's ``padding_free``, verl's ``use_remove_padding``). Prompts
are not shared: each row runs its own prompt (the 4D-mask packed layout of
:mod:`mathrl.train.packing` runs a group's prompt once but needs a dense mask, which flash kernels
do not take). Under ``sdpa``/``eager`` transformers builds a block-diagonal mask over the whole
sequence itself, so there the layout is correct (tested against the padded one on CPU) but attends
over ``L x L`` pairs: it is chosen automatically only for the varlen kernels (``train.packing``),
or on request (``train.padding_free``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mathrl.algo.logprobs import logprobs_and_entropy_from_logits, logprobs_from_logits
from mathrl.train.rows import ForwardBatch
from mathrl.train.packing import to_device

__all__ = ["VARLEN_ATTENTION", "VarlenMicroBatch", "make_varlen_micro_batch", "varlen_kernel", "varlen_policy_forward",
           "varlen_value_forward"]

# attention kernels that take packed sequences without a dense mask (cu_seqlens or block masks)
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class VarlenMicroBatch:
    """Rows ``rows`` of a batch as one padding-free sequence of ``L`` tokens."""

    rows: Tensor            # LongTensor[n] indices into the full batch
    ids: Tensor             # [1, L] the rows' real tokens, end to end
    pos: Tensor             # [1, L] positions, restarting at 0 for each row
    keep: Tensor            # [K] the positions whose logits score a response token
    targets: Tensor         # [1, K] the response token scored at each kept position
    row_of: Tensor          # [K] the micro-batch row of each kept position
    col_of: Tensor          # [K] its response column
    response_ids: Tensor    # [n, T]
    response_mask: Tensor   # [n, T] bool
    T: int
    real_tokens: int        # L: what the forward computes

    def scatter(self, flat: Tensor) -> Tensor:
        """``[K]`` per-kept-position values as ``[n, T]`` (0 at padding); differentiable."""
        out = flat.new_zeros(self.response_mask.shape)
        return out.index_put((self.row_of, self.col_of), flat)


def varlen_kernel(model) -> bool:
    """Whether ``model``'s attention runs packed sequences without a dense mask."""
    m = getattr(model, "module", model)
    config = getattr(m, "config", None) or getattr(getattr(m, "backbone", None), "config", None)
    return getattr(config, "_attn_implementation", None) in VARLEN_ATTENTION


def make_varlen_micro_batch(tokens: ForwardBatch, rows: Tensor, device: torch.device | str = "cpu"
                            ) -> VarlenMicroBatch:
    """The padding-free micro-batch of ``rows`` of ``tokens`` (prompts left-padded, responses right-padded)."""

    prompt_ids, response_ids = tokens.prompt_ids, tokens.response_ids
    pm, rm = tokens.prompt_mask[rows].bool(), tokens.response_mask[rows].bool()
    plen, rlen = pm.sum(1), rm.sum(1)
    if int(plen.min()) < 1:
        raise ValueError("padding-free layout: every row needs at least one prompt token")
    T = max(int(rlen.max()), 1)
    pi, ri = prompt_ids[rows], response_ids[rows]
    ids = torch.cat([torch.cat([pi[i][pm[i]], ri[i][rm[i]]]) for i in range(rows.numel())])
    pos = torch.cat([torch.arange(int(plen[i] + rlen[i])) for i in range(rows.numel())])
    starts = torch.cumsum(plen + rlen, 0) - (plen + rlen)
    row_of = torch.arange(rows.numel()).repeat_interleave(rlen)
    col_of = torch.arange(rm.shape[1]).expand_as(rm)[rm]   # response columns, row by row
    keep = starts[row_of] + plen[row_of] - 1 + col_of      # the position before each response token
    targets = ri[rm]
    dev = lambda x: to_device(x, device)  # noqa: E731
    return VarlenMicroBatch(rows=rows, ids=dev(ids[None]), pos=dev(pos[None]), keep=dev(keep),
                            targets=dev(targets[None]), row_of=dev(row_of), col_of=dev(col_of),
                            response_ids=dev(ri[:, :T]), response_mask=dev(rm[:, :T]), T=T,
                            real_tokens=int(ids.numel()))


def varlen_policy_forward(model, mb: VarlenMicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
                          ) -> tuple[Tensor, Tensor | None]:
    """Per-token logprobs ``[n, T]`` (0 at padding), and optionally entropies, as
    :func:`mathrl.train.forward.padded_policy_forward` returns them for the padded layout."""
    out = model(input_ids=mb.ids, position_ids=mb.pos, attention_mask=None, use_cache=False, logits_to_keep=mb.keep)
    logits = out.logits                                            # [1, K, V]
    valid = torch.ones_like(mb.targets, dtype=torch.bool)
    if with_entropy:
        lp, ent = logprobs_and_entropy_from_logits(logits, mb.targets, valid, temperature=temperature)
        return mb.scatter(lp[0]), mb.scatter(ent[0])
    return mb.scatter(logprobs_from_logits(logits, mb.targets, mask=valid, temperature=temperature)[0]), None


def varlen_value_forward(critic, mb: VarlenMicroBatch) -> Tensor:
    """Critic values ``[n, T]`` of the states before each response token (0 at padding)."""
    m = getattr(critic, "module", critic)
    hidden = m.backbone(input_ids=mb.ids, position_ids=mb.pos, attention_mask=None, use_cache=False).last_hidden_state
    return mb.scatter(m.value_head(hidden[0, mb.keep]).squeeze(-1).float())
