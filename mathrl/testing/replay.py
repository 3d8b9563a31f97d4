"""A rollout engine that replays recorded groups: tests that must feed the product's training step a fixed
batch (the same responses on one rank and on two, under any split) put it where the trainer builds its
engine (``mathrl.train.trainer.make_rollout``) and run the step unchanged."""

from __future__ import annotations

from mathrl.rollout import RolloutEngine
from mathrl.rollout.batch import RolloutBatch, select_groups

__all__ = ["ReplayEngine"]


class ReplayEngine(RolloutEngine):
    """``generate`` answers with the groups of ``recorded`` (one group per prompt of ``prompts``, in that
    order) for the prompts asked for. Weight pushes and scoring go to ``real`` (the engine that sampled the
    recording) when given; without it a push is consumed and dropped (under ZeRO-3 every rank still gathers
    each tensor) and scoring is refused."""

    def __init__(self, recorded: RolloutBatch, prompts: list[str], tokenizer, real: RolloutEngine | None = None):
        self.recorded, self.real = recorded, real
        self.index = {p: i for i, p in enumerate(prompts)}
        self.tokenizer, self.pad_token_id = tokenizer, recorded.pad_token_id

    def generate(self, prompts, n, sampling, on_row=None):
        if n != self.recorded.group_size:
            raise ValueError(f"replay: asked for {n} samples per prompt, the recording has {self.recorded.group_size}")
        batch = select_groups([self.recorded], [(0, self.index[p]) for p in prompts])
        if on_row is not None:
            for row, (text, reason) in enumerate(zip(batch.response_text, batch.finish_reason)):
                on_row(row, text, reason)
        return batch

    def update_weights(self, named_tensors):
        if self.real is not None:
            return self.real.update_weights(named_tensors)
        return sum(1 for _ in named_tensors)

    def score(self, prompt_ids, response_ids, temperature=1.0):
        if self.real is None:
            raise NotImplementedError("the replayed rollout has no model to score with")
        return self.real.score(prompt_ids, response_ids, temperature)

    def close(self):
        if self.real is not None:
            self.real.close()
