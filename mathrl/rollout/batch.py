"""The records of the rollout stage: `SamplingConfig` (what to sample) and `RolloutBatch` (what came out).

This module imports only torch and the standard library, so that the vLLM worker (which runs in a
second interpreter, see `mathrl/rollout/vllm_worker.py`) can use the same definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Sequence

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one group of responses.

    Attributes:
        temperature: softmax temperature T (> 0 samples from softmax(logits / T); 0 is greedy).
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        max_tokens: most new tokens per response (>= 1). A response that reaches it without EOS or a
            stop string ends with finish reason ``"length"``.
        stop: strings that end a response (finish reason ``"stop"``). The tokens that complete a
            stop string stay in ``response_ids`` (they were sampled and carry logprobs); the decoded
            ``response_text`` is cut before the stop string. The EOS token ends a response too.
        seed: makes sampling reproducible. ``None`` draws a fresh seed.

    The per-token logprobs that the engines return are those of the distribution actually sampled
    from: ``log_softmax(filter(logits / T))`` where ``filter`` applies top-k then top-p (tokens cut
    by the filter have probability 0; the kept ones are renormalised). With ``top_p=1`` and
    ``top_k`` disabled this is exactly ``log_softmax(logits / T)``, the quantity a trainer recomputes.
    For greedy decoding (T=0) they are the logprobs of ``log_softmax(logits)``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingConfig.temperature={self.temperature!r}: must be a finite number >= 0 (0 = greedy)")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ValueError(f"SamplingConfig.top_p={self.top_p!r}: must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SamplingConfig.top_k={self.top_k!r}: must be an integer >= 1, or 0 / -1 to disable")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingConfig.max_tokens={self.max_tokens!r}: must be an integer >= 1")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise ValueError(f"SamplingConfig.stop contains {s!r}: stop strings must be non-empty strings")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"SamplingConfig.seed={self.seed!r}: must be an integer or None")

    def to_dict(self) -> dict:
        return {f.name: (list(getattr(self, f.name)) if f.name == "stop" else getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingConfig":
        return cls(**{**d, "stop": tuple(d.get("stop", ()))})


@dataclass
class Sample:
    """One generated response before batching (engine-internal record)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    text: str


@dataclass
class RolloutBatch:
    """B prompts x G samples, as tensors. N = B * G rows, prompt-major: rows ``i*G .. i*G+G-1``
    answer prompt ``i``.

    Attributes:
        prompt_ids: LongTensor[N, Lp], left-padded with ``pad_token_id``.
        prompt_mask: LongTensor[N, Lp], 1 on real prompt tokens.
        response_ids: LongTensor[N, T], right-padded with ``pad_token_id``.
        response_mask: LongTensor[N, T], 1 on generated tokens (the EOS token counts when generated).
        logprobs: FloatTensor[N, T], the sampler's logprob of each generated token (see
            `SamplingConfig` for which distribution), 0 on padding.
        finish_reason: N strings, ``"stop"`` (EOS or a stop string) or ``"length"`` (max_tokens).
        group_index: LongTensor[N], the prompt index ``i`` of each row.
        response_text: N decoded responses without the EOS token and without the stop string.
        prompt_text: B prompt strings (decoded from the ids when the caller gave ids).
        group_size: G.
        pad_token_id: the id used for padding.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    finish_reason: list[str]
    group_index: torch.Tensor
    response_text: list[str]
    prompt_text: list[str]
    group_size: int
    pad_token_id: int
    meta: dict = field(default_factory=dict)

    # ---- sizes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_text)

    @property
    def response_lengths(self) -> torch.Tensor:
        """LongTensor[N]: generated tokens per row."""
        return self.response_mask.sum(dim=1)

    @property
    def truncated(self) -> list[bool]:
        """Per row: the response stopped at max_tokens (``finish_reason == "length"``), as the verifier and
        the overlong handling read it."""
        return [f == "length" for f in self.finish_reason]

    @property
    def num_tokens(self) -> int:
        """Generated tokens in the whole batch (the rollout throughput numerator)."""
        return int(self.response_mask.sum().item())

    # ---- tensors -----------------------------------------------------------------------------
    def to(self, device: torch.device | str) -> "RolloutBatch":
        """A copy with every tensor on ``device``."""
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return RolloutBatch(**kw)

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` of prompt + response, each [N, Lp + T], for a
        trainer's forward pass; response token ``t`` sits at column ``Lp + t``."""
        return (torch.cat([self.prompt_ids, self.response_ids], dim=1),
                torch.cat([self.prompt_mask, self.response_mask], dim=1))

    def validate(self) -> None:
        """Raise ValueError naming the first broken invariant (shapes, masks, finish reasons, logprobs)."""
        n = len(self)
        g = self.group_size
        if n != len(self.prompt_text) * g:
            raise ValueError(f"RolloutBatch: {n} rows but {len(self.prompt_text)} prompts x group_size {g}")
        for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs"):
            t = getattr(self, name)
            if t.ndim != 2 or t.shape[0] != n:
                raise ValueError(f"RolloutBatch.{name}: shape {tuple(t.shape)}, expected [{n}, *]")
        if self.prompt_ids.shape != self.prompt_mask.shape or self.response_ids.shape != self.response_mask.shape \
                or self.logprobs.shape != self.response_ids.shape:
            raise ValueError("RolloutBatch: ids / mask / logprobs shapes differ")
        rm = self.response_mask.bool()
        # right padding: mask is 1...1 0...0 in every row
        if rm.shape[1] > 0 and (rm[:, 1:] & ~rm[:, :-1]).any():
            raise ValueError("RolloutBatch.response_mask is not right-padded (a 1 follows a 0)")
        pm = self.prompt_mask.bool()
        if pm.shape[1] > 0 and (pm[:, :-1] & ~pm[:, 1:]).any():
            raise ValueError("RolloutBatch.prompt_mask is not left-padded (a 0 follows a 1)")
        if (self.response_ids[~rm] != self.pad_token_id).any():
            raise ValueError("RolloutBatch.response_ids: padding positions hold a token other than pad_token_id")
        if (self.logprobs[~rm] != 0).any():
            raise ValueError("RolloutBatch.logprobs: padding positions are not 0")
        lp = self.logprobs[rm]
        if not torch.isfinite(lp).all() or (lp > 1e-5).any():
            raise ValueError("RolloutBatch.logprobs: generated tokens must have finite logprobs <= 0")
        expected_groups = torch.arange(self.num_prompts).repeat_interleave(g)
        if not torch.equal(self.group_index.cpu(), expected_groups):
            raise ValueError("RolloutBatch.group_index is not prompt-major (i*G .. i*G+G-1 -> i)")
        if len(self.finish_reason) != n or any(r not in ("stop", "length") for r in self.finish_reason):
            raise ValueError(f"RolloutBatch.finish_reason must be {n} values of 'stop'/'length', got {self.finish_reason[:4]}...")
        if len(self.response_text) != n:
            raise ValueError("RolloutBatch.response_text must have one string per row")


def collate(
    prompt_ids: Sequence[Sequence[int]],
    samples: Sequence[Sequence[Sample]],
    prompt_text: Sequence[str],
    pad_token_id: int,
    meta: dict | None = None,
) -> RolloutBatch:
    """Pack per-prompt token lists and per-sample results into a `RolloutBatch`.

    ``samples[i]`` are the G responses to ``prompt_ids[i]``; every group must have the same G.
    """
    b = len(prompt_ids)
    if len(samples) != b or len(prompt_text) != b:
        raise ValueError(f"collate: {b} prompts but {len(samples)} sample groups / {len(prompt_text)} texts")
    g = len(samples[0]) if b else 0
    if any(len(s) != g for s in samples):
        raise ValueError(f"collate: groups of unequal size {[len(s) for s in samples]}")
    n = b * g
    lp_max = max((len(p) for p in prompt_ids), default=0)
    t_max = max((len(s.token_ids) for grp in samples for s in grp), default=0)
    p_ids = torch.full((n, lp_max), pad_token_id, dtype=torch.long)
    p_mask = torch.zeros((n, lp_max), dtype=torch.long)
    r_ids = torch.full((n, t_max), pad_token_id, dtype=torch.long)
    r_mask = torch.zeros((n, t_max), dtype=torch.long)
    logp = torch.zeros((n, t_max), dtype=torch.float32)
    finish, texts = [], []
    for i in range(b):
        p = torch.as_tensor(list(prompt_ids[i]), dtype=torch.long)
        lp = p.numel()
        for j, s in enumerate(samples[i]):
            row = i * g + j
            if lp:
                p_ids[row, lp_max - lp:] = p
                p_mask[row, lp_max - lp:] = 1
            t = len(s.token_ids)
            if len(s.logprobs) != t:
                raise ValueError(f"collate: sample {row} has {t} tokens but {len(s.logprobs)} logprobs")
            if t:
                r_ids[row, :t] = torch.as_tensor(s.token_ids, dtype=torch.long)
                r_mask[row, :t] = 1
                logp[row, :t] = torch.as_tensor(s.logprobs, dtype=torch.float32)
            finish.append(s.finish_reason)
            texts.append(s.text)
    return RolloutBatch(
        prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask, logprobs=logp,
        finish_reason=finish, group_index=torch.arange(b).repeat_interleave(g), response_text=texts,
        prompt_text=list(prompt_text), group_size=g, pad_token_id=pad_token_id, meta=dict(meta or {}),
    )


def select_groups(batches: Sequence[RolloutBatch], picks: Sequence[tuple[int, int]]) -> RolloutBatch:
    """A batch made of whole groups taken from several batches: ``picks`` are (batch, group) pairs in the
    order wanted. Prompts are re-padded on the left and responses on the right to the widest pick; every
    batch must have the same group size and pad id. Used by dynamic sampling to keep the informative
    groups of several sampling rounds."""
    if not batches or not picks:
        raise ValueError("select_groups needs at least one batch and one pick")
    g, pad = batches[0].group_size, batches[0].pad_token_id
    if any(b.group_size != g or b.pad_token_id != pad for b in batches):
        raise ValueError("select_groups: batches differ in group size or pad token id")
    rows = [(batches[k], torch.arange(i * g, (i + 1) * g)) for k, i in picks]
    lp = max(int(b.prompt_mask[r].sum(1).max()) for b, r in rows)
    t = max(int(b.response_mask[r].sum(1).max()) if b.response_mask.shape[1] else 0 for b, r in rows)

    def left(x: torch.Tensor, width: int, fill) -> torch.Tensor:
        x = x[:, max(0, x.shape[1] - width):]
        return torch.cat([torch.full((x.shape[0], width - x.shape[1]), fill, dtype=x.dtype), x], 1)

    def right(x: torch.Tensor, width: int, fill) -> torch.Tensor:
        x = x[:, :width]
        return torch.cat([x, torch.full((x.shape[0], width - x.shape[1]), fill, dtype=x.dtype)], 1)

    out = RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids[r], lp, pad) for b, r in rows]),
        prompt_mask=torch.cat([left(b.prompt_mask[r], lp, 0) for b, r in rows]),
        response_ids=torch.cat([right(b.response_ids[r], t, pad) for b, r in rows]),
        response_mask=torch.cat([right(b.response_mask[r], t, 0) for b, r in rows]),
        logprobs=torch.cat([right(b.logprobs[r], t, 0.0) for b, r in rows]),
        finish_reason=[b.finish_reason[j] for b, r in rows for j in r.tolist()],
        group_index=torch.arange(len(picks)).repeat_interleave(g),
        response_text=[b.response_text[j] for b, r in rows for j in r.tolist()],
        prompt_text=[batches[k].prompt_text[i] for k, i in picks],
        group_size=g, pad_token_id=pad, meta=dict(batches[0].meta),
    )
    return out
