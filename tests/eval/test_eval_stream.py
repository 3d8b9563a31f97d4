"""`mathrl eval` grades each response while the engine is still generating the others (the verifier's
processes use the cores the engine leaves idle), with the verdicts the after-the-fact grading gives."""

from __future__ import annotations

import copy
import threading

import pytest

import mathrl.reward.api as reward_api
from mathrl.data import Problem
from mathrl.eval.runner import EvalSettings, evaluate_benchmark, grade_records
from mathrl.rollout.batch import Sample, collate

ANSWERS = {"p0": ["\\boxed{3}", "so \\boxed{4}", "\\boxed{3.0}"], "p1": ["\\boxed{12}", "no answer", "\\boxed{1/2}"],
           "p2": ["\\boxed{7}", "\\boxed{\\frac{14}{2}}", "\\boxed{8}"]}
GOLDS = {"p0": "3", "p1": "12", "p2": "7"}


class StreamingEngine:
    """Answers with fixed responses, announcing each through ``on_row`` and then waiting (up to a few
    seconds) until the verifier has graded those responses: ``overlapped`` says whether grading happened
    while the engine call was still running."""

    def __init__(self, tokenizer, graded: set[str], seen: threading.Condition):
        self.tokenizer, self.pad_token_id = tokenizer, tokenizer.pad_token_id or 0
        self.graded, self.seen = graded, seen
        self.overlapped: list[bool] = []

    def generate(self, prompts, n, sampling, on_row=None):
        texts = []
        for prompt in prompts:
            pid = next(k for k in ANSWERS if f"question {k}" in prompt)
            texts.append((ANSWERS[pid] * n)[:n] if n > 1 else [ANSWERS[pid][0] + " greedy"])
        flat = [t for group in texts for t in group]
        for row, text in enumerate(flat):
            if on_row is not None:
                on_row(row, text, "stop")
        with self.seen:
            self.overlapped.append(self.seen.wait_for(lambda: set(flat) <= self.graded, timeout=5.0))
        ids = [self.tokenizer(p)["input_ids"] for p in prompts]
        samples = [[Sample(self.tokenizer(t)["input_ids"] or [1], [0.0] * max(1, len(self.tokenizer(t)["input_ids"])),
                           "stop", t) for t in group] for group in texts]
        return collate(ids, samples, list(prompts), self.pad_token_id, meta={"backend": "test"})


@pytest.fixture()
def spy(monkeypatch):
    graded: set[str] = set()
    seen = threading.Condition()
    real = reward_api.grade_batch

    def grade_batch(responses, golds, *args, **kwargs):
        out = real(responses, golds, *args, **kwargs)
        with seen:
            graded.update(responses)
            seen.notify_all()
        return out

    monkeypatch.setattr(reward_api, "grade_batch", grade_batch)
    return graded, seen


def test_grades_stream_beside_generation_with_the_same_verdicts(spy, embedded_model_path):
    from mathrl.models import load_tokenizer

    graded, seen = spy
    engine = StreamingEngine(load_tokenizer(str(embedded_model_path)), graded, seen)
    problems = [Problem(id=k, source="t", question=f"question {k}: what is it?", gold=g) for k, g in GOLDS.items()]
    settings = EvalSettings(n=3, ks=(1, 3), greedy=True, timeout=10.0, template="chat_boxed")
    res = evaluate_benchmark(engine, problems, settings, name="t", log=lambda m: None)
    assert engine.overlapped == [True, True]  # the sampled call and the greedy call were graded while running
    by_id = {r["id"]: r for r in res.records}
    assert [s["correct"] for s in by_id["p0"]["samples"]] == [True, False, True]
    assert [s["correct"] for s in by_id["p2"]["samples"]] == [True, True, False]
    assert by_id["p1"]["greedy"]["correct"] is True
    # the same records graded after the fact (the path without streaming) give the same verdicts and classes
    again = copy.deepcopy(res.records)
    for rec in again:
        for row in rec["samples"] + [rec["greedy"]]:
            for key in ("extracted", "correct", "reason"):
                row.pop(key)
    grade_records(again, settings)
    assert again == res.records
