"""The packed update (mathrl/train/packing.py) gives the padded update's loss and gradients on the
real model, with responses of very different lengths, and computes far fewer padding tokens.

SmolLM2-135M-Instruct in float32, two groups of four responses (3 to 120 tokens) after prompts of
different lengths, the trainer's PPO-clip loss with old logprobs that differ from the current ones
(so clipping engages), token-mean over the batch. The padded side is the shared-prompt layout the
trainer used before packing. The negative control packs the same rows with a plain causal mask (a
response sees the responses packed before it) and must be rejected by the same comparison.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from mathrl.algo.losses import policy_loss
from mathrl.train.rows import ForwardBatch
from mathrl.train.layouts import Packed, Padded

os.environ.setdefault("OMP_NUM_THREADS", "2")

G = 4
RLENS = (3, 17, 64, 9, 120, 4, 33, 71)
PROMPTS = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?",
           "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
           "How much did she earn? Think step by step and put the final answer after ####.")
TEXT = ("Natalia sold 48/2 = 24 clips in May. Natalia sold 48 + 24 = 72 clips altogether in April and May. "
        "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10. ") * 6


@pytest.fixture(scope="module")
def setup(embedded_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path))
    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_path), dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    text = tok(TEXT)["input_ids"]
    assert len(text) > max(RLENS) + 40
    n, pw, tw = len(RLENS), max(map(len, prompts)), max(RLENS)
    pids = torch.full((n, pw), tok.pad_token_id or 0)
    pmask = torch.zeros(n, pw, dtype=torch.long)
    rids = torch.full((n, tw), tok.pad_token_id or 0)
    rmask = torch.zeros(n, tw, dtype=torch.bool)
    for i, t in enumerate(RLENS):
        p = prompts[i // G]
        pids[i, pw - len(p):] = torch.tensor(p)
        pmask[i, pw - len(p):] = 1
        start = 7 * i  # a different stretch of real text for each response
        rids[i, :t] = torch.tensor(text[start:start + t])
        rmask[i, :t] = True
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(n, generator=g)[:, None].expand(n, tw).contiguous()
    noise = 0.3 * torch.randn(n, tw, generator=g)
    return model, (pids, pmask, rids, rmask), adv, noise


def _loss_and_grads(model, tensors, adv, noise, layout):
    pids, pmask, rids, rmask = tensors
    rows = torch.arange(len(RLENS))
    mb = layout.micro_batch(ForwardBatch(pids, pmask, rids, rmask), rows, "cpu")
    model.zero_grad(set_to_none=True)
    logp, ent = layout.policy_forward(model, mb, temperature=0.7, with_entropy=True)
    m = mb.response_mask
    old = (logp.detach() + noise[:, : mb.T]) * m  # old logprobs differ: the ratio is clipped on some tokens
    loss, st = policy_loss(logp, old, adv[:, : mb.T], m, clip_low=0.2, clip_high=0.28,
                           norm_tokens=float(rmask.sum()))
    loss = loss - 0.01 * (ent * m).sum() / m.sum()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return float(loss), float(st["clip_frac"]) if "clip_frac" in st else None, grads, mb


def _max_rel(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)) for k in b)


@pytest.mark.slow  # the real model, two forward/backward passes
def test_packed_update_equals_padded_on_the_real_model(setup):
    model, tensors, adv, noise = setup
    loss_pad, clip_pad, g_pad, mb_pad = _loss_and_grads(model, tensors, adv, noise, Padded(G))
    loss_pk, _, g_pk, mb_pk = _loss_and_grads(model, tensors, adv, noise, Packed(G))
    real = int(tensors[3].sum())
    # what each layout computes: shared prompt once per group + G x max response, vs packed rows
    pad_slots = (len(RLENS) // G) * mb_pad.P + len(RLENS) * mb_pad.T
    print(f"[packing] loss padded {loss_pad:.8f} packed {loss_pk:.8f}; grad max rel diff {_max_rel(g_pk, g_pad):.2e}; "
          f"padded-token fraction {1 - (real + 2 * mb_pad.P) / pad_slots:.3f} -> "
          f"{1 - mb_pk.real_tokens / mb_pk.slot_tokens:.3f}")
    assert abs(loss_pk - loss_pad) <= 1e-5 * max(1.0, abs(loss_pad))
    assert g_pk.keys() == g_pad.keys() and len(g_pad) > 10
    for k in g_pad:
        torch.testing.assert_close(g_pk[k], g_pad[k], atol=1e-5, rtol=1e-4, msg=lambda m: f"{k}: {m}")
    assert mb_pk.slot_tokens < 0.7 * pad_slots  # the point of packing: far fewer computed tokens


@pytest.mark.slow
def test_negative_control_responses_that_see_each_other_are_rejected(setup):
    model, tensors, adv, noise = setup

    class Leaky(Packed):
        def micro_batch(self, *args, **kw):
            mb = super().micro_batch(*args, **kw)
            mask = mb.attention_mask.clone()
            mask[..., mb.P:] |= torch.ones(mb.W, mb.W, dtype=torch.bool).tril()
            return dataclasses.replace(mb, attention_mask=mask)

    loss_pad, _, g_pad, _ = _loss_and_grads(model, tensors, adv, noise, Padded(G))
    loss_bad, _, g_bad, _ = _loss_and_grads(model, tensors, adv, noise, Leaky(G))
    assert abs(loss_bad - loss_pad) > 1e-3 * max(1.0, abs(loss_pad)) or _max_rel(g_bad, g_pad) > 1e-2
    with pytest.raises(AssertionError):
        for k in g_pad:
            torch.testing.assert_close(g_bad[k], g_pad[k], atol=1e-5, rtol=1e-4)



def test_bins_first_fit_by_hand():
    from mathrl.train.packing import bins_first_fit

    # longest first: 128 fills a bin; 40 + 30 + 20 + 15 + 12 + 11 = 128 fill the second exactly; 9 opens a third
    assert bins_first_fit([128, 12, 20, 9, 30, 15, 40, 11], 128) == [[0], [6, 4, 2, 5, 1, 7], [3]]
    assert bins_first_fit([5, 5, 5], 5) == [[0], [1], [2]]  # equal lengths: one response per bin
    assert bins_first_fit([7, 3], 5) == [[0], [1]]          # longer than the width: a bin of its own
    assert bins_first_fit([], 4) == []
