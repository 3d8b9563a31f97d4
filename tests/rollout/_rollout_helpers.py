"""Helpers shared by the rollout tests (imported by module name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import torch


def trainer_logprobs(model, prompt_ids, response_ids, temperature: float = 1.0) -> list[torch.Tensor]:
    """What a trainer recomputes: log_softmax(logits / T) of each response token, one sequence
    at a time (no padding), in float32."""
    out = []
    with torch.no_grad():
        for p, r in zip(prompt_ids, response_ids):
            seq = torch.tensor([list(p) + list(r)])
            logits = model(input_ids=seq).logits[0, len(p) - 1:-1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, seq[0, len(p):, None]).squeeze(-1))
    return out


def unpadded(batch, rows):
    """(prompt_ids, response_ids) lists without padding for the given rows of a RolloutBatch."""
    ps = [batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist() for i in rows]
    rs = [batch.response_ids[i][batch.response_mask[i].bool()].tolist() for i in rows]
    return ps, rs


def perturb_(model, scale: float = 0.02, seed: int = 0) -> None:
    """A deliberate weight change, as a stand-in for an optimizer step: w += scale * N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
