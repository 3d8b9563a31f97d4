"""The `RolloutEngine` interface that the hf and vllm backends implement."""

from __future__ import annotations

import abc
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import torch

from mathrl.rollout.batch import RolloutBatch, SamplingConfig

Prompts = Sequence[str] | Sequence[Sequence[int]]
OnRow = Callable[[int, str, str], None]  # (row, response text, finish reason): a response has finished


class RolloutEngine(abc.ABC):
    """Samples G responses for each of B prompts and keeps its weights in sync with the trainer.

    Prompts are either rendered strings (the chat template already applied by the data stage;
    they are tokenized without adding special tokens unless the engine was built with
    ``add_special_tokens=True``) or lists of token ids, used as given.
    """

    tokenizer: Any
    pad_token_id: int
    add_special_tokens: bool = False

    @abc.abstractmethod
    def generate(self, prompts: Prompts, n: int, sampling: SamplingConfig,
                 on_row: OnRow | None = None) -> RolloutBatch:
        """Return a `RolloutBatch` of ``len(prompts) * n`` rows, prompt-major.

        ``on_row(row, text, finish_reason)``, when given, is called for each row as soon as the engine
        has finished it (the trainer grades it then, while the other rows are still decoding), with
        the row's final ``response_text`` and ``finish_reason``; an engine that cannot tell may call it
        for all rows at the end. It runs on the generating thread and must return quickly."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the trainer's parameters (Hugging Face names, e.g. from ``model.named_parameters()``)
        into the engine. Tensors are consumed one at a time, so the caller may gather ZeRO-3
        shards lazily (see `mathrl.rollout.sync.iter_full_parameters`). After this call every
        later `generate` uses the new weights (cached prompt KV is dropped). Returns the number
        of tensors loaded. If it raises, the engine's weights are undefined (partly updated)
        until a complete push succeeds."""

    @abc.abstractmethod
    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[torch.Tensor]:
        """The engine's logprobs ``log_softmax(logits / temperature)`` of each given response token
        under its current weights: one FloatTensor[len(response_ids[i])] per row. Used to check
        weight sync against the trainer on a fixed sequence."""

    def submit(self, prompts: Prompts, n: int, sampling: SamplingConfig) -> "PendingBatch":
        """Start `generate` in the background and return at once (asynchronous rollout,
        ``rollout.staleness = 1``): the engine samples with the weights it holds now while the
        caller trains. Until ``result()`` has returned, the caller must not call the engine again
        (no `update_weights`, `generate` or `score`): the weights must not change under a running
        generation. This default runs `generate` in one background thread, which suits both an
        in-process engine (torch and vLLM release the GIL in their kernels) and the vLLM worker
        process (the thread waits on its socket). An hf engine that shares the trainer's own
        module must not be used this way (the update would change the weights mid-sample)."""
        return PendingBatch(lambda: self.generate(prompts, n, sampling))

    def close(self) -> None:
        """Release the engine (processes, memory). Safe to call twice."""

    # ---- helpers shared by the backends -----------------------------------------------------
    def encode_prompts(self, prompts: Prompts) -> tuple[list[list[int]], list[str]]:
        """Token ids and texts of the prompts; raises a ValueError naming the bad prompt."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list of strings or of token-id lists, got {type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError("prompts is empty")
        ids: list[list[int]] = []
        texts: list[str] = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                enc = self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"]
                ids.append(list(enc))
                texts.append(p)
            elif isinstance(p, torch.Tensor) or (isinstance(p, Sequence) and all(isinstance(t, int) for t in p)):
                lst = [int(t) for t in (p.tolist() if isinstance(p, torch.Tensor) else p)]
                ids.append(lst)
                texts.append(self.tokenizer.decode(lst, skip_special_tokens=False))
            else:
                raise TypeError(f"prompts[{i}] is {type(p).__name__}: expected a string or a list of token ids")
            if not ids[-1]:
                raise ValueError(f"prompts[{i}] encodes to zero tokens")
        return ids, texts

    def __enter__(self) -> "RolloutEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_n(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: the number of samples per prompt must be an integer >= 1")


class PendingBatch:
    """A generation running in a background thread (:meth:`RolloutEngine.submit`).

    ``result()`` waits for it and returns the `RolloutBatch` (or raises what `generate` raised);
    ``seconds`` is then the generation's own wall time, from its start to its end, whether or not
    the caller was waiting for it."""

    def __init__(self, work: Callable[[], RolloutBatch]) -> None:
        self.seconds = 0.0
        self._batch: RolloutBatch | None = None
        self._error: BaseException | None = None

        def target() -> None:
            t0 = time.perf_counter()
            try:
                self._batch = work()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by result()
                self._error = exc
            finally:
                self.seconds = time.perf_counter() - t0

        self._thread = threading.Thread(target=target, name="mathrl-rollout", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> RolloutBatch:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._batch is not None
        return self._batch
