"""Process rewards in the RL step (GRPO with process supervision, DeepSeekMath sec. 4.1.3): where the steps of a
sampled response end on its tokens, and the process reward model's score of each step.

* :func:`response_steps` -- a response's decoded text, its steps (:func:`mathrl.algo.process.segment_steps`'
  rule: a step ends at a line break) and the token at which each ends (the same function labels the PRM's
  training data in :mod:`mathrl.prm.labels`, so the PRM is read where it was trained);
* :func:`step_logits`, :func:`prm_scores` -- the PRM (:class:`mathrl.models.value_head.ValueModel`, a decoder with
  a scalar head) read at the last token of each step, ``P + end`` in the ``[prompt | response]`` row;
* :func:`process_rewards` -- a batch's :class:`~mathrl.algo.process.StepRewards` for the ``grpo_ps`` estimator.

Credit: the PRM scores a step at the token where its text ends, and the last step's reward is credited through
the response's last token (the EOS token, which decodes to no text, and any trailing token carry the last step's
reward, so every token of the response has an advantage). A response whose text has no step (EOS only) is one
step ending at its last token, in the RL step and in the PRM's training labels alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mathrl.algo.process import StepRewards, segment_steps, step_end_tokens
from mathrl.dist.collectives import global_sum
from mathrl.train.forward import MicroBatch
from mathrl.train.layouts import Padded
from mathrl.train.rows import ForwardBatch

__all__ = ["decoded_prefix_lengths", "response_steps", "step_logits", "prm_scores", "batch_steps",
           "process_rewards", "process_metrics"]


def decoded_prefix_lengths(tokenizer, ids: Sequence[int]) -> list[int]:
    """``[len(decode(ids[:t + 1])) for t]``: where each token's text ends in the decoded response."""
    return [len(tokenizer.decode(list(ids[: t + 1]), skip_special_tokens=True)) for t in range(len(ids))]


class _PrefixLengths(Sequence[int]):
    """:func:`decoded_prefix_lengths` decoded lazily: a prefix is decoded when its index is read (once)."""

    def __init__(self, tokenizer, ids: Sequence[int]) -> None:
        self.tokenizer, self.ids, self.known = tokenizer, list(ids), {}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, t):  # an int index (step_end_tokens reads no slices)
        if t not in self.known:
            self.known[t] = len(self.tokenizer.decode(self.ids[: t + 1], skip_special_tokens=True))
        return self.known[t]


def response_steps(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]], list[int]]:
    """The decoded text of a response, its step spans and the token at which each step ends (the first token
    whose decoded prefix covers the step's text; O(steps x log tokens) prefix decodes). A response with tokens but
    no step in its text (EOS only, or only whitespace) is one step, the whole text, ending at its last token; a
    response without tokens has none. The RL step and the PRM's labels both segment by this function."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    spans = segment_steps(text)
    if ids and not spans:
        return text, [(0, len(text))], [len(ids) - 1]
    return text, spans, step_end_tokens(_PrefixLengths(tokenizer, ids), spans)


def step_logits(prm, mb: MicroBatch, ends: Tensor) -> Tensor:
    """``[n, S]``: the PRM's logit at the last token of each step of ``mb``'s rows (``ends``: ``[n, S]`` token
    indices into the responses; padding steps may hold any index within the response, their logits are
    ignored by the caller)."""
    v = prm(mb.input_ids, mb.attention_mask, mb.position_ids)  # [n, P + T], one per position
    idx = (mb.P + ends.clamp(0, max(mb.T - 1, 0))).to(v.device)
    return v.gather(1, idx)


@torch.no_grad()
def prm_scores(prm, tokens: ForwardBatch, ends: Tensor, step_mask: Tensor, *, token_budget: int, device) -> Tensor:
    """``[N, S]`` probabilities that each step leads to a correct answer (sigmoid of :func:`step_logits`), 0 at
    padding steps; in eval mode, micro-batched like the trainer's forwards."""
    layout = Padded()
    module = getattr(prm, "module", prm)
    was = module.training
    module.eval()
    out = torch.zeros(step_mask.shape, dtype=torch.float32)
    try:
        for rows in layout.plan(tokens, token_budget):
            mb = layout.micro_batch(tokens, rows, device)
            z = step_logits(prm, mb, ends[rows])
            out[rows] = torch.sigmoid(z.float()).cpu()
    finally:
        module.train(was)
    return torch.where(step_mask.bool(), out, torch.zeros_like(out))


def batch_steps(tokenizer, response_ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, list[int]]:
    """The steps of each response of a batch (``response_ids``, ``mask``: ``[N, T]``, right-padded): ``ends``
    ``[N, S]`` (the token at which each step's text ends, where the PRM reads it), ``step_mask`` ``[N, S]`` and
    each response's token count (the steps of :func:`response_steps`)."""
    lengths = mask.sum(1).tolist()
    per: list[list[int]] = []
    for i, n in enumerate(lengths):
        ids = response_ids[i, :n].tolist()
        per.append(response_steps(tokenizer, ids)[2])
    S = max(1, max(map(len, per)))
    ends_t = torch.zeros(len(per), S, dtype=torch.long)
    step_mask = torch.zeros(len(per), S, dtype=torch.bool)
    for i, e in enumerate(per):
        ends_t[i, :len(e)] = torch.tensor(e, dtype=torch.long)
        step_mask[i, :len(e)] = True
    return ends_t, step_mask, [int(n) for n in lengths]


def process_rewards(prm, tokenizer, tokens: ForwardBatch, *, token_budget: int, device) -> StepRewards:
    """The PRM's reward of every step of ``tokens``' responses, with the steps' credit ends for
    :func:`mathrl.algo.process.process_advantages` (the last step's end moved to the response's last token;
    see the module docstring)."""
    ends, step_mask, lengths = batch_steps(tokenizer, tokens.response_ids, tokens.response_mask)
    rewards = prm_scores(prm, tokens, ends, step_mask, token_budget=token_budget, device=device)
    credit = ends.clone()
    for i, n in enumerate(lengths):
        k = int(step_mask[i].sum())
        if k:
            credit[i, k - 1] = n - 1
    return StepRewards(rewards=rewards, ends=credit, mask=step_mask)


def process_metrics(steps: StepRewards) -> dict[str, float]:
    """``ps/steps_per_response`` and ``ps/step_reward_mean`` (the PRM's mean step score) over all ranks."""
    sm = steps.mask.bool()
    n, k, total = global_sum(torch.tensor([float(sm.any(1).sum()), float(sm.sum()),
                                           float(steps.rewards[sm].double().sum())], dtype=torch.float64)).tolist()
    return {"ps/steps_per_response": k / max(n, 1.0), "ps/step_reward_mean": total / max(k, 1.0)}
