"""Packed micro-batches: each group's responses first-fit into rows no wider than the longest, after
one shared run of the prompt, so short responses are not padded to the longest.

The padded shared-prompt layout (:mod:`mathrl.train.forward`) runs each group's prompt once, repeats
its key/value cache G times and gives every response ``T = max length`` columns: a micro-batch with
one 128-token response and seven 20-token ones computes 8 x 128 response tokens for 268 real ones.
Here the responses of a group are packed first-fit-decreasing into *bins* of width ``T`` (the
longest response of the micro-batch)::

    bin 1: [ response 1 (128)                                  ]
    bin 2: [ response 2 (40) | response 3 (30) | response 4 (20) ...]
    bin 3: [ ... ]

The prompt's cache is repeated once per bin instead of once per response (a differentiable index, so
the prompt still receives every response's gradient), and a 4D boolean mask over ``[prompt | bin]``
keeps the responses apart: a token of response k sees the real prompt tokens and the tokens of
response k before it; padding sees only itself. Response k's positions continue its prompt's
(``P_g, P_g + 1, ...``), as if it were the only response. So each response sees exactly what it sees in
the padded layout, and logprobs, entropies, values and gradients are the same
(tests/train/test_forward_reference.py and, on SmolLM2, tests/train/test_packing.py, to fp32
rounding). A bin costs what a padded row costs (its queries see ``P + T`` keys at most), and there
are fewer bins than rows whenever lengths differ, so packing never computes more than the padded
layout; with equal lengths it is the padded layout (one response per bin).

Which logit scores which token: bin column ``c`` predicts the token in column ``c + 1`` when both
belong to the same response; the first token of every response is scored by the prompt's last
position (as in the padded layout).

Used where the padded layout shares the prompt (``group_size > 1``, no gradient checkpointing, which
drops the cache) and the attention takes a 4D mask (``sdpa``, ``eager``; not ``flash_attention_2``).

One call (``one_call=True``, chosen under ZeRO-3 by :func:`mathrl.train.layouts.choose_layout`). The
two passes above are two model calls, and ZeRO-3 gathers every layer's parameters in each call (and
again in each call's backward). With ``one_call`` a group's prompt and its bins form one row
``[prompt | bin 1 | ... | bin M]`` (``M`` = the most bins of any group; a group with fewer has empty,
masked slots) under one 4D mask: the prompt block is causal over the real prompt tokens, each bin's
block is the bin's mask above (its queries see the real prompt and their own response), and nothing
crosses bins. Same logprobs, values and gradients as the two passes (to fp32 rounding; tested), one
parameter gather per micro-batch; the price is attention over the whole row (``(P + M W)^2`` query-key
pairs per group, some of them masked) instead of ``M W (P + W)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mathrl.algo.logprobs import logprobs_and_entropy_from_logits, logprobs_from_logits
from mathrl.train.rows import ForwardBatch

__all__ = ["CacheCaller", "PackedMicroBatch", "bins_first_fit", "make_packed_micro_batch", "packed_policy_forward",
           "packed_value_forward", "packing_supported", "to_device"]


@dataclass
class PackedMicroBatch:
    """Rows ``rows`` of a batch (whole groups of ``group_size``): the groups' prompts, and their
    responses packed into bins of width ``W``."""

    rows: Tensor            # LongTensor[n] indices into the full batch
    prompt_ids: Tensor      # [R, P] one left-padded prompt per group
    prompt_mask: Tensor     # [R, P]
    prompt_pos: Tensor      # [R, P]
    bin_group: Tensor       # [nb] the group of each bin (the cache row it gets)
    ids: Tensor             # [nb, W] packed response tokens
    pos: Tensor             # [nb, W]
    attention_mask: Tensor  # [nb, 1, W, P + W] bool over [prompt | bin]
    targets: Tensor         # [nb, W] the token column c predicts (column c + 1)
    col_valid: Tensor       # [nb, W] column c predicts a token of the same response
    owner: Tensor           # [n] the group of each response (its first token's logit)
    bin_of: Tensor          # [n] the bin of each response
    take: Tensor            # [n, T] the bin column scoring response token t (t >= 1; 0 elsewhere)
    response_ids: Tensor    # [n, T]
    response_mask: Tensor   # [n, T] bool
    P: int
    W: int
    T: int
    group_size: int
    real_tokens: int        # prompt tokens (once per group) + response tokens
    slot_tokens: int        # R x P + nb x W: what the forward computes
    # one call (``one_call=True``): each group's prompt and its bins in one row, ``M`` bin slots of ``W``
    M: int = 0                         # bin slots per row (the most bins of any group)
    row_ids: Tensor | None = None      # [R, P + M W] [prompt | slot 1 | ... | slot M]
    row_pos: Tensor | None = None      # [R, P + M W]
    row_mask: Tensor | None = None     # [R, 1, P + M W, P + M W] bool
    slot_targets: Tensor | None = None  # [R M, W] ``targets`` by slot (empty slots: 0)
    slot_valid: Tensor | None = None    # [R M, W] ``col_valid`` by slot (empty slots: False)
    slot_of: Tensor | None = None       # [n] the slot of each response (``bin_of`` in the one-call layout)


class CacheCaller:
    """Calls ``model`` passing ``cache_kw=`` under the name its forward uses (``cache`` in
    transformers >= 5.2x, ``past_key_values`` before)."""

    def __init__(self, model):
        import inspect

        self.model = model
        self.module = getattr(model, "module", model)
        self.config = self.module.config
        params = inspect.signature(self.module.forward).parameters
        self.kw = "cache" if "cache" in params else "past_key_values"

    def __call__(self, *, cache_kw, **kwargs):
        return self.model(**kwargs, **{self.kw: cache_kw})


def to_device(x: Tensor, device) -> Tensor:
    """``x`` on ``device``. A host tensor goes to a GPU through pinned memory without blocking: a plain
    ``.to("cuda")`` of pageable memory waits for the device's queue to drain (a host sync per tensor,
    several per micro-batch); the copy keeps its place in the stream, so the values are the same."""
    device = torch.device(device)
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def packing_supported(model) -> bool:
    """Whether ``model``'s attention takes the 4D mask (flash-attention kernels do not)."""
    m = getattr(model, "module", model)
    impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
    return impl in (None, "sdpa", "eager")


def bins_first_fit(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: indices of ``lengths`` grouped into bins whose sums stay <= ``width``
    (a length above ``width`` gets a bin of its own). Deterministic: ties keep index order."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        t = lengths[i]
        for b, free in enumerate(room):
            if t <= free:
                bins[b].append(i)
                room[b] -= t
                break
        else:
            bins.append([i])
            room.append(width - t)
    return bins


def make_packed_micro_batch(tokens: ForwardBatch, rows: Tensor, device: torch.device | str = "cpu",
                            group_size: int = 1, one_call: bool = False) -> PackedMicroBatch:
    """Pack ``rows`` of ``tokens`` (whole groups: ``group_size`` consecutive rows share a prompt; prompts
    left-padded, responses right-padded). ``one_call``: also the one-row-per-group layout (prompt and
    bins in one model call; see the module docstring)."""
    prompt_ids, prompt_mask, response_ids, response_mask = (tokens.prompt_ids, tokens.prompt_mask,
                                                            tokens.response_ids, tokens.response_mask)
    g = max(1, group_size)
    n = rows.numel()
    if n % g:
        raise ValueError(f"micro-batch of {n} rows is not made of whole groups of {g}")
    R = n // g
    pm, rm = prompt_mask[rows].bool(), response_mask[rows].bool()
    plen = pm.sum(1).view(R, g)[:, 0]
    rlen = rm.sum(1).tolist()
    P = max(int(plen.max()), 1)
    T = max(max(rlen), 1)
    lead = torch.arange(R) * g
    p_ids = prompt_ids[rows][lead][:, prompt_ids.shape[1] - P:]
    p_mask = pm[lead][:, pm.shape[1] - P:].long()
    p_pos = (p_mask.cumsum(1) - 1).clamp(min=0)
    layout = []  # (group, [response rows in the bin])
    for r in range(R):
        for b in bins_first_fit([rlen[r * g + k] for k in range(g)], T):
            layout.append((r, [r * g + k for k in b if rlen[r * g + k] > 0]))
    layout = [(r, b) for r, b in layout if b] or [(0, [])]
    nb = len(layout)
    W = max(max(sum(rlen[i] for i in b) for _, b in layout), 1)
    r_ids = response_ids[rows]
    ids = torch.zeros(nb, W, dtype=response_ids.dtype)
    pos = torch.zeros(nb, W, dtype=torch.long)
    seg = torch.zeros(nb, W, dtype=torch.long)   # 0 padding, k + 1 the k-th response of the bin
    bin_of = torch.zeros(n, dtype=torch.long)
    take = torch.zeros(n, T, dtype=torch.long)
    for b, (r, members) in enumerate(layout):
        off, p = 0, int(plen[r])
        for k, i in enumerate(members):
            t = rlen[i]
            ids[b, off:off + t] = r_ids[i][rm[i]]
            pos[b, off:off + t] = torch.arange(p, p + t)
            seg[b, off:off + t] = k + 1
            bin_of[i] = b
            take[i, 1:t] = torch.arange(off, off + t - 1)   # column off + t - 1 predicts token t
            off += t
    same_next = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    targets = torch.cat([ids[:, 1:], torch.zeros(nb, 1, dtype=ids.dtype)], 1)
    col_valid = torch.cat([same_next, torch.zeros(nb, 1, dtype=torch.bool)], 1)
    bin_group = torch.tensor([r for r, _ in layout], dtype=torch.long)
    q = seg[:, :, None]
    idx = torch.arange(W)
    causal = idx[None, :, None] >= idx[None, None, :]
    own = causal & (seg[:, None, :] == q) & (q > 0)
    own |= (q == 0) & torch.eye(W, dtype=torch.bool)[None]             # padding sees itself
    sees_prompt = p_mask.bool()[bin_group][:, None, :] & (q > 0)       # real queries see the real prompt
    mask = torch.cat([sees_prompt, own], 2)[:, None]                   # [nb, 1, W, P + W]
    def dev(x: Tensor) -> Tensor:
        return to_device(x, device)

    extra = _one_call_layout(p_ids, p_mask, p_pos, layout, ids, pos, mask, targets, col_valid, bin_of, W) \
        if one_call else {}
    extra = {k: (to_device(v, device) if isinstance(v, Tensor) else v) for k, v in extra.items()}
    return PackedMicroBatch(
        rows=rows, prompt_ids=dev(p_ids), prompt_mask=dev(p_mask), prompt_pos=dev(p_pos),
        bin_group=dev(bin_group), ids=dev(ids), pos=dev(pos), attention_mask=dev(mask),
        targets=dev(targets), col_valid=dev(col_valid),
        owner=dev(torch.arange(R).repeat_interleave(g)), bin_of=dev(bin_of), take=dev(take),
        response_ids=dev(response_ids[rows][:, :T]), response_mask=dev(rm[:, :T]), P=P, W=W, T=T,
        group_size=g, real_tokens=int(plen.sum()) + sum(rlen), slot_tokens=R * P + nb * W, **extra)


def _one_call_layout(p_ids, p_mask, p_pos, layout, ids, pos, mask, targets, col_valid, bin_of, W) -> dict:
    """The one-call rows ``[prompt | slot 1 | ... | slot M]`` of the bins ``layout`` (host tensors)."""
    R, P = p_ids.shape
    nb = len(layout)
    count = [0] * R
    slot = []
    for r, _ in layout:
        slot.append(count[r])
        count[r] += 1
    M = max(count)
    L = P + M * W
    slot_idx = torch.tensor([r * M + s for (r, _), s in zip(layout, slot)], dtype=torch.long)
    s_ids = torch.zeros(R * M, W, dtype=ids.dtype)
    s_pos = torch.zeros(R * M, W, dtype=torch.long)
    s_tgt = torch.zeros(R * M, W, dtype=targets.dtype)
    s_valid = torch.zeros(R * M, W, dtype=torch.bool)
    s_ids[slot_idx], s_pos[slot_idx], s_tgt[slot_idx], s_valid[slot_idx] = ids, pos, targets, col_valid
    row_ids = torch.cat([p_ids, s_ids.view(R, M * W)], 1)
    row_pos = torch.cat([p_pos, s_pos.view(R, M * W)], 1)
    real = p_mask.bool()
    m = torch.zeros(R, L, L, dtype=torch.bool)
    m[:, :P, :P] = torch.ones(P, P, dtype=torch.bool).tril() & real[:, None, :] & real[:, :, None]
    m[:, torch.arange(L), torch.arange(L)] = True  # padding (prompt or empty slot) sees itself
    for b in range(nb):
        r, s = divmod(int(slot_idx[b]), M)
        o = P + s * W
        m[r, o:o + W, :P] = mask[b, 0, :, :P]
        m[r, o:o + W, o:o + W] = mask[b, 0, :, P:]
    return {"M": M, "row_ids": row_ids, "row_pos": row_pos, "row_mask": m[:, None], "slot_targets": s_tgt,
            "slot_valid": s_valid, "slot_of": slot_idx[bin_of]}


def _mask_for(model, mask: Tensor) -> Tensor:
    m = getattr(model, "module", model)
    if getattr(getattr(m, "config", None), "_attn_implementation", None) == "eager":  # additive float mask
        dtype = next(m.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def _two_passes(model, mb: PackedMicroBatch, kw: dict):
    """The prompts once (with a cache), the cache indexed once per bin, then the bins."""
    from transformers import DynamicCache

    call = CacheCaller(model)
    cache = DynamicCache(config=call.config)
    first = call(input_ids=mb.prompt_ids, attention_mask=mb.prompt_mask, position_ids=mb.prompt_pos,
                 use_cache=True, **kw, cache_kw=cache)
    cache.batch_select_indices(mb.bin_group)  # differentiable: every bin's gradient reaches its prompt
    rest = call(input_ids=mb.ids, attention_mask=_mask_for(model, mb.attention_mask), position_ids=mb.pos,
                use_cache=True, cache_kw=cache)
    return first, rest


def _one_call(model, mb: PackedMicroBatch, kw: dict):
    """The prompts and their bins in one call (the rows ``mb.row_ids``)."""
    return model(input_ids=mb.row_ids, attention_mask=_mask_for(model, mb.row_mask), position_ids=mb.row_pos,
                 use_cache=False, **kw)


def _assemble(mb: PackedMicroBatch, cols: Tensor, first: Tensor) -> Tensor:
    """Per-response ``[n, T]`` values: token 0 from ``first`` ``[n]``, tokens t >= 1 from the bins'
    columns ``cols`` ``[nb, W]`` (one call: the slots' columns ``[R M, W]``)."""
    where = mb.slot_of if mb.row_ids is not None else mb.bin_of
    out = cols[where[:, None], mb.take]
    out = torch.cat([first[:, None], out[:, 1:]], 1)
    return torch.where(mb.response_mask, out, torch.zeros_like(out))


def packed_policy_forward(model, mb: PackedMicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
                          ) -> tuple[Tensor, Tensor | None]:
    """Per-token logprobs ``[n, T]`` (0 at padding), and optionally entropies, as
    :func:`mathrl.train.forward.padded_policy_forward` returns them for the padded layout."""
    if mb.row_ids is not None:  # one call: the prompt's last position, then the M W slot columns
        out = _one_call(model, mb, {"logits_to_keep": mb.M * mb.W + 1})
        logits = out.logits[:, 1:]                                # [R, M W, V]
        first_logits = out.logits[:, :1][mb.owner]                # [n, 1, V]
        targets, valid = mb.slot_targets.view(logits.shape[:2]), mb.slot_valid.view(logits.shape[:2])
    else:
        first, rest = _two_passes(model, mb, {"logits_to_keep": 1})
        logits = rest.logits                                      # [nb, W, V]
        first_logits = first.logits[:, -1:][mb.owner]             # [n, 1, V]: each prompt's last position
        targets, valid = mb.targets, mb.col_valid
    cols = (-1, mb.W)  # per bin (slot) columns
    first_ids = mb.response_ids[:, :1]
    ones = torch.ones_like(first_ids, dtype=torch.bool)
    if with_entropy:
        lp, ent = logprobs_and_entropy_from_logits(logits, targets, valid, temperature=temperature)
        lp0, ent0 = logprobs_and_entropy_from_logits(first_logits, first_ids, ones, temperature=temperature)
        return _assemble(mb, lp.view(cols), lp0[:, 0]), _assemble(mb, ent.view(cols), ent0[:, 0])
    lp = logprobs_from_logits(logits, targets, mask=valid, temperature=temperature)
    lp0 = logprobs_from_logits(first_logits, first_ids, mask=ones, temperature=temperature)
    return _assemble(mb, lp.view(cols), lp0[:, 0]), None


def packed_value_forward(critic, mb: PackedMicroBatch) -> Tensor:
    """Critic values ``[n, T]`` of the states before each response token (0 at padding)."""
    m = getattr(critic, "module", critic)
    if mb.row_ids is not None:  # one call
        v = m.value_head(_one_call(m.backbone, mb, {}).last_hidden_state).squeeze(-1).float()  # [R, P + M W]
        return _assemble(mb, v[:, mb.P:].reshape(-1, mb.W), v[:, mb.P - 1][mb.owner])
    first, rest = _two_passes(m.backbone, mb, {})
    v_bins = m.value_head(rest.last_hidden_state).squeeze(-1).float()               # state after column c
    v_first = m.value_head(first.last_hidden_state[:, -1]).squeeze(-1).float()[mb.owner]  # before token 0
    return _assemble(mb, v_bins, v_first)
