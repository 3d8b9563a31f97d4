"""Forward passes over a RolloutBatch: token-budgeted micro-batches, logprobs, values.

A batch row is ``[left-padded prompt | right-padded response]``. A micro-batch
is a run of rows whose padded size ``rows x (max prompt + max response)`` fits
the token budget; its columns are trimmed to the longest prompt and response in
it, so padding is never computed twice.

The logit that scores response token ``t`` sits at position ``P - 1 + t`` (the
position before it). Only the last ``T + 1`` positions' logits are computed
(``logits_to_keep``), so the prompt never pays for the ``[L, V]`` projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mathrl.algo.losses import entropy_from_logits, logprobs_from_logits


@dataclass
class MicroBatch:
    """Rows ``rows`` of a batch, trimmed to ``P`` prompt and ``T`` response columns."""

    rows: Tensor            # LongTensor[n] indices into the full batch
    input_ids: Tensor       # [n, P + T]
    attention_mask: Tensor  # [n, P + T]
    position_ids: Tensor    # [n, P + T]
    response_ids: Tensor    # [n, T]
    response_mask: Tensor   # [n, T] bool
    P: int
    T: int

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum())


def plan_micro_batches(prompt_mask: Tensor, response_mask: Tensor, token_budget: int,
                       rows: Tensor | None = None) -> list[Tensor]:
    """Split ``rows`` (default: all, in order) into consecutive runs whose padded size fits the budget.

    A single row larger than the budget still forms its own micro-batch.
    """
    if rows is None:
        rows = torch.arange(prompt_mask.shape[0])
    plen = prompt_mask.sum(1)
    rlen = response_mask.sum(1)
    groups: list[Tensor] = []
    current: list[int] = []
    max_p = max_r = 0
    for r in rows.tolist():
        p, t = int(plen[r]), int(rlen[r])
        new_p, new_r = max(max_p, p), max(max_r, t)
        if current and (len(current) + 1) * (new_p + new_r) > token_budget:
            groups.append(torch.tensor(current, dtype=torch.long))
            current, new_p, new_r = [], p, t
        current.append(r)
        max_p, max_r = new_p, new_r
    if current:
        groups.append(torch.tensor(current, dtype=torch.long))
    return groups


def make_micro_batch(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor,
                     rows: Tensor, device: torch.device | str = "cpu") -> MicroBatch:
    pm, rm = prompt_mask[rows], response_mask[rows]
    P = max(int(pm.sum(1).max()), 1)
    T = max(int(rm.sum(1).max()), 1)
    pi = prompt_ids[rows][:, prompt_ids.shape[1] - P:]
    pm = pm[:, pm.shape[1] - P:]
    ri, rm = response_ids[rows][:, :T], rm[:, :T]
    input_ids = torch.cat([pi, ri], 1).to(device)
    attn = torch.cat([pm, rm], 1).to(device).long()
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    return MicroBatch(rows=rows, input_ids=input_ids, attention_mask=attn, position_ids=pos,
                      response_ids=ri.to(device), response_mask=rm.to(device).bool(), P=P, T=T)


def policy_forward(model, mb: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
                   ) -> tuple[Tensor, Tensor | None]:
    """Per-token logprobs ``[n, T]`` (0 at padding) of the response under ``softmax(logits / T)``,
    and optionally per-token entropies."""
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                use_cache=False, logits_to_keep=mb.T + 1)
    logits = out.logits[:, :-1]  # positions P-1 .. P+T-2 predict response tokens 0 .. T-1
    logp = logprobs_from_logits(logits, mb.response_ids, mask=mb.response_mask, temperature=temperature)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits, mb.response_mask, temperature=temperature)
    return logp, ent


def value_forward(critic, mb: MicroBatch) -> Tensor:
    """Values ``[n, T]`` of the states before each response token (0 at padding)."""
    v = critic(mb.input_ids, mb.attention_mask, mb.position_ids)
    v = v[:, mb.P - 1: mb.P - 1 + mb.T]
    return torch.where(mb.response_mask, v, torch.zeros_like(v))


def scatter_rows(full: Tensor, mb: MicroBatch, values: Tensor) -> None:
    """Write a micro-batch's ``[n, T']`` result into the full ``[N, T]`` tensor."""
    full[mb.rows, : mb.T] = values.detach().to(full.device, full.dtype)


@torch.no_grad()
def batch_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, *, token_budget: int,
                   temperature: float, device) -> Tensor:
    """Logprobs ``[N, T]`` of every response token under ``model`` (no grad), micro-batched."""
    full = torch.zeros(response_ids.shape, dtype=torch.float32)
    for rows in plan_micro_batches(prompt_mask, response_mask, token_budget):
        mb = make_micro_batch(prompt_ids, prompt_mask, response_ids, response_mask, rows, device)
        logp, _ = policy_forward(model, mb, temperature=temperature)
        scatter_rows(full, mb, logp)
    return full


@torch.no_grad()
def batch_values(critic, prompt_ids, prompt_mask, response_ids, response_mask, *, token_budget: int,
                 device) -> Tensor:
    """Critic values ``[N, T]`` (no grad), micro-batched."""
    full = torch.zeros(response_ids.shape, dtype=torch.float32)
    for rows in plan_micro_batches(prompt_mask, response_mask, token_budget):
        mb = make_micro_batch(prompt_ids, prompt_mask, response_ids, response_mask, rows, device)
        scatter_rows(full, mb, value_forward(critic, mb))
    return full
