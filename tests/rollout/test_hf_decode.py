"""The hf backend's decode loop: same samples as a per-token reference loop, and few host syncs.

``_reference_chunk`` is the loop the engine ran before its decode state moved to the device (issue 37):
every token it copies the sampled tokens to the host, checks EOS and stop strings in Python and drops
finished rows from the KV cache at once. The engine now keeps the finished-row bookkeeping on the
device and reads it back every ``sync_every`` tokens; on CPU it must give the very same tokens,
logprobs, finish reasons, texts and ``on_row`` calls (in the same order)."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.rollout import SamplingConfig
from mathrl.rollout.hf import HFRolloutEngine, cut_at_stop
from mathrl.rollout.sampling import sample_tokens, sampling_logprobs


@pytest.fixture(scope="module")
def engine(tiny_dir):
    eng = HFRolloutEngine(tiny_dir)
    yield eng
    eng.close()


@torch.inference_mode()
def _reference_chunk(eng, prompt_ids, n, sp, gen, on_row, row0):
    """The per-token loop (the engine's decode loop up to commit 6ac81d6), for comparison."""
    from transformers import DynamicCache

    b = len(prompt_ids)
    lp = max(len(p) for p in prompt_ids)
    ids = torch.full((b, lp), eng.pad_token_id, dtype=torch.long)
    attn = torch.zeros((b, lp), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, lp - len(p):] = torch.as_tensor(p)
        attn[i, lp - len(p):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=eng.model.config)

    def forward(**kw):
        return eng.model(use_cache=True, **{eng._cache_kw: cache}, **kw)

    logits = forward(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=1).logits[:, -1, :]
    next_pos = pos[:, -1] + 1
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits, attn, next_pos = (x.repeat_interleave(n, dim=0) for x in (logits, attn, next_pos))
    rows, t_max = b * n, sp.max_tokens
    tokens = torch.full((rows, t_max), eng.pad_token_id, dtype=torch.long)
    logps = torch.zeros((rows, t_max), dtype=torch.float32)
    lengths, finish, final_text = [0] * rows, ["length"] * rows, [None] * rows
    alive = torch.arange(rows)
    eos = torch.as_tensor(eng.eos_token_ids)
    stops = list(sp.stop)
    window = (max(len(s) for s in stops) + 3) if stops else 0

    def finished(r):
        text = eng.tokenizer.decode(tokens[r, :lengths[r]].tolist(), skip_special_tokens=True)
        final_text[r] = cut_at_stop(text, stops)[0] if stops and finish[r] == "stop" else text
        if on_row is not None:
            on_row(row0 + r, final_text[r], finish[r])

    for t in range(t_max):
        lprobs = sampling_logprobs(logits, sp.temperature, sp.top_k, sp.top_p)
        tok = sample_tokens(lprobs, sp.temperature == 0, gen)
        tokens[alive, t] = tok
        logps[alive, t] = lprobs.gather(-1, tok[:, None]).squeeze(-1).float()
        for r in alive.tolist():
            lengths[r] = t + 1
        done = torch.isin(tok, eos)
        if stops:
            cand = [k for k in range(alive.numel()) if not done[k]]
            if cand:
                lo = max(0, t + 1 - window)
                texts = eng.tokenizer.batch_decode(tokens[alive[cand], lo:t + 1].tolist())
                for k, txt in zip(cand, texts):
                    if any(s in txt for s in stops):
                        done[k] = True
        for k in torch.nonzero(done).flatten().tolist():
            finish[int(alive[k])] = "stop"
            finished(int(alive[k]))
        if t == t_max - 1 or not (~done).any():
            break
        if done.any():
            keep = torch.nonzero(~done).flatten()
            cache.batch_select_indices(keep)
            alive, tok, attn, next_pos = alive[keep], tok[keep], attn[keep], next_pos[keep]
        attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
        logits = forward(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None]).logits[:, -1]
        next_pos = next_pos + 1
    for r in range(rows):
        if final_text[r] is None:
            finished(r)
    return [(tokens[r, :lengths[r]].tolist(), logps[r, :lengths[r]].tolist(), finish[r], final_text[r])
            for r in range(rows)]


def _reference(eng, prompts, n, sp, calls):
    prompt_ids, _ = eng.encode_prompts(prompts)
    gen = torch.Generator().manual_seed(sp.seed)
    per_chunk = max(1, eng.max_batch_rows // n)
    out = []
    with torch.inference_mode():
        for start in range(0, len(prompt_ids), per_chunk):
            out += _reference_chunk(eng, prompt_ids[start:start + per_chunk], n, sp, gen,
                                    lambda r, text, why: calls.append((r, text, why)), start * n)
    return out


def _engine_rows(eng, prompts, n, sp, calls):
    b = eng.generate(prompts, n, sp, on_row=lambda r, text, why: calls.append((r, text, why)))
    b.validate()
    rows = []
    for i in range(len(b)):
        L = int(b.response_mask[i].sum())
        rows.append((b.response_ids[i, :L].tolist(), b.logprobs[i, :L].tolist(), b.finish_reason[i],
                     b.response_text[i]))
    return rows


CASES = [
    # (n, SamplingConfig, max_batch_rows, EOS logit bias): sampled with top-k/top-p, greedy, stop strings,
    # several chunks (max_batch_rows 4: 3 chunks of 2 x 2 rows); the bias makes rows end at different steps
    (4, SamplingConfig(temperature=1.0, top_p=0.95, top_k=50, max_tokens=40, seed=3), 256, 1.0),
    (3, SamplingConfig(temperature=0.0, max_tokens=17, seed=0), 256, 1.0),
    (4, SamplingConfig(temperature=1.0, max_tokens=30, stop=("e", "at"), seed=1), 256, 0.0),
    (2, SamplingConfig(temperature=1.3, top_k=4, max_tokens=33, seed=5), 4, 1.0),
]


@pytest.mark.parametrize("case,sync_every", [(0, 1), (0, 3), (0, None), (1, 3), (2, None), (3, 1), (3, 3)])
def test_decode_matches_the_per_token_loop(engine, chat_prompts, case, sync_every):
    """Tokens, finish reasons, texts and the ``on_row`` sequence equal the per-token loop's whatever the
    sync interval (None: the engine's default); so do the logprobs, bitwise when the batch shrinks at the
    same steps (``sync_every=1``, or stop strings), else to 1e-5: a finished row that stays in the batch
    until the next sync changes the batch size of the forward, and CPU matmuls round a row's result
    differently for different batch sizes (measured: 2.4e-7)."""
    n, sp, mbr, bias = CASES[case]
    eng = HFRolloutEngine(model=engine.model, tokenizer=engine.tokenizer, max_batch_rows=mbr, sync_every=sync_every)
    # bias EOS up so that rows end at different steps (and the batch shrinks): the finished-row
    # bookkeeping is what the device loop changes (the tiny model's lm_head has no bias of its own)
    eos = eng.eos_token_ids[0]
    head = eng.model.get_output_embeddings()
    had_bias = head.bias
    head.bias = torch.nn.Parameter(torch.zeros(head.out_features))
    head.bias.data[eos] = bias
    try:
        ref_calls, calls = [], []
        ref = _reference(eng, chat_prompts, n, sp, ref_calls)
        got = _engine_rows(eng, chat_prompts, n, sp, calls)
    finally:
        head.bias = had_bias
    lengths = [len(r[0]) for r in ref]
    assert len(set(lengths)) > 2 and any(r[2] == "stop" for r in ref), lengths  # rows end at different steps
    assert [(r[0], r[2], r[3]) for r in got] == [(r[0], r[2], r[3]) for r in ref]
    assert calls == ref_calls
    if sync_every == 1 or sp.stop:
        assert [r[1] for r in got] == [r[1] for r in ref]
    else:
        diff = max(abs(a - b) for g, r in zip(got, ref) for a, b in zip(g[1], r[1]))
        assert diff <= 1e-5, diff


SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def test_host_syncs_only_every_k_tokens(engine, chat_prompts, monkeypatch):
    """Between two sync points the decode loop reads nothing back from the device: every call of a
    method that waits for the device (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``nonzero``...)
    made by the engine's own code (mathrl/rollout/*.py; the model's internals are the same for
    ``model.generate``) happens at one of the ``ceil(T / k)`` sync steps, counted in forward passes."""
    import mathrl.rollout.hf as hf_mod
    import mathrl.rollout.sampling as sampling_mod

    own = {hf_mod.__file__, sampling_mod.__file__}
    forwards = [0]
    at: set[int] = set()
    n_calls = [0]

    def wrap(name):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, **kw):
            import sys

            if sys._getframe(1).f_code.co_filename in own:
                at.add(forwards[0])
                n_calls[0] += 1
            return orig(self, *a, **kw)
        return counted

    for name in SYNC_METHODS:
        monkeypatch.setattr(torch.Tensor, name, wrap(name))
    for k, T in ((8, 40), (5, 23), (1, 12)):
        eng = HFRolloutEngine(model=engine.model, tokenizer=engine.tokenizer, sync_every=k)
        hook = eng.model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        forwards[0], n_calls[0] = 0, 0
        at.clear()
        try:
            b = eng.generate(chat_prompts, 4, SamplingConfig(temperature=1.0, max_tokens=T, seed=0))
        finally:
            hook.remove()
        decode_steps = {s for s in at if s >= 1}
        # a sync after tokens t0..t (forward t + 1 has run, the next one not yet)
        assert len(decode_steps) <= math.ceil(T / k), (k, sorted(decode_steps))
        assert all(s % k == 0 or s == forwards[0] for s in decode_steps), (k, sorted(decode_steps))
        assert eng.host_syncs <= math.ceil(T / k), (k, eng.host_syncs)
        assert int(b.response_mask.sum()) > 0


def test_sync_every_is_checked(engine):
    with pytest.raises(ValueError, match="sync_every"):
        HFRolloutEngine(model=engine.model, tokenizer=engine.tokenizer, sync_every=0)


def test_decode_builds_no_autograd_graph(engine, chat_prompts):
    """The decode loop runs without autograd although the trainer's policy has parameters that require
    gradients: with a graph, every decoded token's activations stay alive until the chunk ends (a real-model
    rollout of 32 rows x 64 tokens grew by ~13 GB and ran out of memory in tests/train/test_memory.py)."""
    eng = HFRolloutEngine(model=engine.model, tokenizer=engine.tokenizer, sync_every=4)
    assert any(p.requires_grad for p in eng.model.parameters())
    modes: list[tuple[bool, bool]] = []
    hook = eng.model.register_forward_hook(
        lambda _m, _a, out: modes.append((torch.is_grad_enabled(), out.logits.requires_grad)))
    try:
        assert torch.is_grad_enabled()  # called as the trainer calls it: outside any no_grad region
        b = eng.generate(chat_prompts, 2, SamplingConfig(temperature=1.0, max_tokens=9, seed=0))
    finally:
        hook.remove()
    assert len(modes) > 2 and modes == [(False, False)] * len(modes), modes
    assert not b.logprobs.requires_grad
