"""Automatic step labels (Math-Shepherd, Wang et al. 2023; DeepSeekMath sec. 4.1.3): from the prefix that ends
with each step of a sampled response, a policy samples K completions; the verifier grades each prefix+completion
against the problem's answer; the step's hard label is 1 when some completion is correct, its soft label the
fraction that are.

The steps are :func:`mathrl.algo.process.segment_steps`' (a step ends at a line break), located on the response's
own tokens (:func:`mathrl.algo.process.step_end_tokens`), so a label belongs to a token of the sampled response.
The last step needs no completion: the response itself ends there, and its own verdict labels it (hard = soft).
All prefixes of a batch go to the rollout engine in one ``generate`` call (``n = K``), which samples them as it
samples training groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mathrl.algo.process import step_labels
from mathrl.reward import grade_batch
from mathrl.reward.options import GradeOptions
from mathrl.rollout import RolloutBatch, SamplingConfig
from mathrl.train.process import response_steps

__all__ = ["StepLabels", "label_rollouts", "label_steps", "labelled_record"]


@dataclass
class StepLabels:
    """The labelled steps of one response: ``ends[j]`` is the response token at which step j ends, ``hard[j]``
    and ``soft[j]`` its labels, ``texts[j]`` its text."""

    ends: list[int]
    hard: list[float]
    soft: list[float]
    texts: list[str]


def label_steps(engine, tokenizer, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                golds: Sequence[str], final_correct: Sequence[bool], *, k: int, sampling: SamplingConfig,
                grade: Callable[[list[str], list[str], list[bool]], list[bool]]) -> list[StepLabels]:
    """Label every step of each response (``prompt_ids[i]``, ``response_ids[i]``: token ids without padding;
    ``golds[i]`` the answer; ``final_correct[i]`` the response's own verdict, the label of its last step).

    ``grade(responses, golds, truncated)`` returns a verdict per text (the verifier: ``reward.grade_batch``'s
    ``correct``; ``truncated[i]``: completion i stopped at ``max_tokens``, graded as the trainer grades such a
    response). Each earlier step gets ``k`` completions of ``prompt + response[: end + 1]`` from ``engine``; a
    completion is graded as the response text up to the step followed by the completion."""
    if not (len(prompt_ids) == len(response_ids) == len(golds) == len(final_correct)):
        raise ValueError("label_steps: prompt_ids, response_ids, golds and final_correct differ in length")
    if k < 1:
        raise ValueError(f"label_steps: k={k} completions per step; allowed: k >= 1")
    steps = [response_steps(tokenizer, ids) for ids in response_ids]
    queries: list[tuple[int, int]] = []  # (response, step) that need completions
    prompts: list[list[int]] = []
    prefixes: list[str] = []
    for i, (text, spans, ends) in enumerate(steps):
        for j, end in enumerate(ends[:-1]):
            queries.append((i, j))
            prompts.append(list(prompt_ids[i]) + list(response_ids[i][: end + 1]))
            prefixes.append(tokenizer.decode(list(response_ids[i][: end + 1]), skip_special_tokens=True))
    verdicts: dict[tuple[int, int], list[bool]] = {}
    if queries:
        batch = engine.generate(prompts, k, sampling)
        texts = [prefixes[q] + batch.response_text[q * k + c] for q in range(len(queries)) for c in range(k)]
        ok = grade(texts, [golds[queries[q][0]] for q in range(len(queries)) for _ in range(k)],
                   batch.truncated)
        for q, key in enumerate(queries):
            verdicts[key] = list(ok[q * k:(q + 1) * k])
    out = []
    for i, (text, spans, ends) in enumerate(steps):
        per_step = [verdicts[(i, j)] for j in range(len(ends) - 1)] + ([[bool(final_correct[i])]] if ends else [])
        hard, soft = step_labels(per_step) if per_step else ([], [])
        out.append(StepLabels(ends=list(ends), hard=hard, soft=soft, texts=[text[a:b] for a, b in spans]))
    return out


def labelled_record(problem_id: str, gold: str, prompt_ids: Sequence[int], response_ids: Sequence[int], response: str,
                    answer: str | None, correct: bool, labels: StepLabels, *, model: str, **extra) -> dict:
    """One labelled response as a line of ``mathrl prm label``'s file (what ``mathrl prm train`` reads); ``extra``
    keys are kept (the grading tolerance ``rel_tol`` the verdicts were given with, the iterative round's step)."""
    return {"problem_id": problem_id, "gold": gold, "model": model, "prompt_ids": list(prompt_ids),
            "response_ids": list(response_ids), "response": response, "answer": answer, "correct": bool(correct),
            "ends": labels.ends, "hard": labels.hard, "soft": labels.soft, **extra}


def label_rollouts(engine, tokenizer, batch: RolloutBatch, problem_ids: Sequence[str], golds: Sequence[str],
                   correct: Sequence[bool], answers: Sequence[str | None], *, k: int, sampling: SamplingConfig,
                   options: GradeOptions, model: str, **extra) -> list[dict]:
    """Every step of the sampled responses in ``batch`` labelled (:func:`label_steps`, ``k`` completions per
    step from ``engine`` with ``sampling``, graded by the verifier with the run's ``options``): one
    :func:`labelled_record` per response with at least one token. ``problem_ids[i]``, ``golds[i]``, ``correct[i]``
    (the response's verdict) and ``answers[i]`` (its extracted answer) belong to response i; ``extra`` goes into
    every record. ``mathrl prm label`` and the iterative round both label through it."""
    n = batch.response_ids.shape[0]
    if not (len(problem_ids) == len(golds) == len(correct) == len(answers) == n):
        raise ValueError(f"label_rollouts: {n} responses but {len(problem_ids)} problem ids, {len(golds)} golds, "
                         f"{len(correct)} verdicts and {len(answers)} answers; allowed: one of each per response")
    prompt_ids = [batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist() for i in range(n)]
    response_ids = [batch.response_ids[i][batch.response_mask[i].bool()].tolist() for i in range(n)]
    keep = [i for i, ids in enumerate(response_ids) if ids]
    labels = label_steps(engine, tokenizer, [prompt_ids[i] for i in keep], [response_ids[i] for i in keep],
                         [golds[i] for i in keep], [correct[i] for i in keep], k=k, sampling=sampling,
                         grade=lambda texts, gs, cut: [g.correct for g in grade_batch(texts, gs, options,
                                                                                      truncated=cut)])
    return [labelled_record(problem_ids[i], golds[i], prompt_ids[i], response_ids[i], batch.response_text[i],
                            answers[i], correct[i], lab, model=model, rel_tol=options.rel_tol, **extra)
            for i, lab in zip(keep, labels)]
