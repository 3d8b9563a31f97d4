"""Automatic step labels (mathrl/prm/labels.py) with the real rollout engine and the real verifier."""

from __future__ import annotations

from pathlib import Path

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


def _verifier(texts, golds, truncated):
    from mathrl.reward import grade_batch

    return [g.correct for g in grade_batch(texts, golds, workers=1, truncated=truncated)]


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


def test_step_ends_by_bisection_match_the_linear_scan(tokenizer):
    """response_steps reads O(log T) prefixes per step; on SmolLM2's tokenizer its ends equal the linear scan
    over every decoded prefix, for realistic responses with multi-byte characters and for random token ids
    (split UTF-8 sequences, special tokens), whose prefix lengths never decrease (the bisection's premise)."""
    import random

    texts = ["So 3 × 4 = 12.\nÉtape: 12 − 5 = 7 ✓\n\n\\boxed{7}", "a\nb\n\n\nc", "\n\nx = 😀 + 1\n",
             "First, 17 + 25 = 42.\nThen 42 * 2 = 84.\nSo the answer is \\boxed{84}."]
    cases = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    rng = random.Random(0)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    for _ in range(40):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 60))]
        for _ in range(3):
            ids.insert(rng.randrange(len(ids) + 1), newline[0])
        cases.append(ids)
    for ids in cases:
        lengths = decoded_prefix_lengths(tokenizer, ids)
        assert all(a <= b for a, b in zip(lengths, lengths[1:])), ids
        text, spans, ends = response_steps(tokenizer, ids)
        linear = []
        for _, c in spans:
            t = linear[-1] if linear else 0
            while t < len(ids) - 1 and lengths[t] < c:
                t += 1
            linear.append(t)
        assert ends == linear, ids
        assert len(ends) == len(spans) >= 1


def test_a_response_without_text_is_one_step_for_the_labels_as_for_the_rl_step(tokenizer):
    """EOS only: the RL step scores it as one step at its last token, so the PRM's labels hold that step too,
    labelled by the response's own verdict (no completion is needed: the engine is not called). Before, the labels
    had no step for it and the PRM never saw the case it is read on."""
    import torch

    from mathrl.prm.labels import label_steps
    from mathrl.train.process import batch_steps

    eos = tokenizer.eos_token_id
    assert response_steps(tokenizer, [eos]) == ("", [(0, 0)], [0])
    assert response_steps(tokenizer, [eos, eos]) == ("", [(0, 0)], [1])
    assert response_steps(tokenizer, []) == ("", [], [])
    out = label_steps(None, tokenizer, [[1, 2], [1, 2]], [[eos], [eos, eos]], ["3", "3"], [False, True], k=2,
                      sampling=SamplingConfig(), grade=None)
    assert [(s.ends, s.hard, s.soft) for s in out] == [([0], [0.0], [0.0]), ([1], [1.0], [1.0])]
    ends, step_mask, lengths = batch_steps(tokenizer, torch.tensor([[eos, eos], [eos, 0]]),
                                           torch.tensor([[1, 1], [1, 0]]))
    assert ends[:, 0].tolist() == [1, 0] and step_mask.tolist() == [[True], [True]] and lengths == [2, 1]


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
    graded = []

    def verifier(texts, golds, truncated):
        graded.extend(texts)
        return _verifier(texts, golds, truncated)

    out = label_steps(engine, tok, [prompt, prompt], rids, ["84", "84"], [True, False], k=4,
                      sampling=SamplingConfig(temperature=0.7, top_p=1.0, max_tokens=48, seed=0), grade=verifier)
    assert [len(s.ends) for s in out] == [3, 3]
    # each completion is graded after its prefix: K texts per earlier step, in order, each starting with the step
    prefixes = [p for t in (right, wrong) for p in ("".join(t.splitlines(True)[:1]), "".join(t.splitlines(True)[:2]))]
    assert len(graded) == 4 * len(prefixes)
    assert all(graded[q * 4 + c].startswith(prefixes[q]) for q in range(len(prefixes)) for c in range(4))
    assert out[0].hard[-1] == out[0].soft[-1] == 1.0 and out[1].hard[-1] == out[1].soft[-1] == 0.0
    for s in out:
        assert all(h >= x and x * 4 == int(x * 4) for h, x in zip(s.hard, s.soft))
    assert out[0].soft[1] > out[1].soft[1]  # "42 * 2 = 84." leads to 84; "32 * 2 = 64." does not


@pytest.mark.slow
def test_label_problems_samples_and_completes_with_the_runs_stops(monkeypatch, embedded_model_path):
    """``mathrl prm label``'s sampler (label_problems) samples the responses and the step completions as a
    training step does: with the prompt template's stop strings (few-shot plain: a new "Question:" ends a
    response), so no sampled text runs on into a question the model invents. The engine is the real hf one;
    the test only records what it is asked and returns."""
    from mathrl.config import load_config
    from mathrl.data.splits import load_training_problems
    from mathrl.prm import pipeline
    from mathrl.rollout.factory import make_engine

    seen = []

    def recording(*args, **kwargs):
        eng = make_engine(*args, **kwargs)
        real = eng.generate

        def generate(prompts, n, sampling, **kw):
            out = real(prompts, n, sampling, **kw)
            seen.append((sampling, out.response_text))
            return out

        eng.generate = generate
        return eng

    monkeypatch.setattr(pipeline, "make_engine", recording)
    cfg = load_config(str(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"), [
        f"model.name={embedded_model_path}", "rollout.backend=hf", "rollout.n=2", "rollout.max_tokens=48",
        "rollout.temperature=1.0", "data.template=fewshot_plain", "data.synthetic_level=3", "reward.rel_tol=0.01"])
    records = pipeline.label_problems(cfg, load_training_problems(cfg)[:3], k=2)
    assert records and len(seen) == 2  # the responses, then every step's completions
    assert {r["rel_tol"] for r in records} == {0.01}  # graded with reward.rel_tol, kept for `mathrl prm eval`
    for sampling, texts in seen:
        assert "\nQuestion:" in sampling.stop and "\n\nQuestion:" in sampling.stop
        assert not any("\nQuestion:" in t for t in texts), [t for t in texts if "Question:" in t]
