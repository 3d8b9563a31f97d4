"""Automatic step labels (mathrl/prm/labels.py) with the real rollout engine and the real verifier."""

from __future__ import annotations

import pytest

from mathrl.prm.labels import label_steps
from mathrl.train.process import decoded_prefix_lengths, response_steps
from mathrl.rollout import SamplingConfig


@pytest.fixture(scope="module")
def engine(embedded_model_path):
    from mathrl.rollout.factory import make_engine

    eng = make_engine("hf", str(embedded_model_path))
    yield eng
    eng.close()


def _verifier(texts, golds):
    from mathrl.reward import grade_batch

    return [g.correct for g in grade_batch(texts, golds, workers=1)]


def test_steps_sit_on_the_responses_own_tokens(engine):
    tok = engine.tokenizer
    text = "First, 17 + 25 = 42.\nThen 42 * 2 = 84.\n\nSo the answer is \\boxed{84}."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decoded, spans, ends = response_steps(tok, ids)
    assert decoded == text and [decoded[a:b] for a, b in spans] == [
        "First, 17 + 25 = 42.\n", "Then 42 * 2 = 84.\n\n", "So the answer is \\boxed{84}."]
    lengths = decoded_prefix_lengths(tok, ids)
    for (_, b), e in zip(spans, ends):  # each step ends at the first token whose prefix covers it
        assert lengths[e] >= b and (e == 0 or lengths[e - 1] < b)
    assert ends[-1] == len(ids) - 1


@pytest.mark.slow
def test_labels_from_completions_of_each_prefix(engine):
    """SmolLM2 completes the prefixes of a right and of a wrong solution (K = 4 each) and the verifier grades
    them: a prefix that already holds the right result is labelled correct more often than one holding a wrong
    result, the last step carries the response's own verdict, and hard >= soft with soft a multiple of 1/K."""
    from mathrl.data import render_prompt
    from mathrl.data.problem import Problem

    tok = engine.tokenizer
    problem = Problem(id="t/0", question="What is 17 + 25, times 2?", gold="84", source="test")
    prompt = tok(render_prompt(problem, tok, "chat_boxed"), add_special_tokens=False)["input_ids"]
    right = "17 + 25 = 42.\n42 * 2 = 84.\nThe answer is \\boxed{84}."
    wrong = "17 + 25 = 32.\n32 * 2 = 64.\nThe answer is \\boxed{64}."
    rids = [tok(t, add_special_tokens=False)["input_ids"] for t in (right, wrong)]
    out = label_steps(engine, tok, [prompt, prompt], rids, ["84", "84"], [True, False], k=4,
                      sampling=SamplingConfig(temperature=0.7, top_p=1.0, max_tokens=48, seed=0), grade=_verifier)
    assert [len(s.ends) for s in out] == [3, 3]
    assert out[0].hard[-1] == out[0].soft[-1] == 1.0 and out[1].hard[-1] == out[1].soft[-1] == 0.0
    for s in out:
        assert all(h >= x and x * 4 == int(x * 4) for h, x in zip(s.hard, s.soft))
    assert out[0].soft[1] > out[1].soft[1]  # "42 * 2 = 84." leads to 84; "32 * 2 = 64." does not
