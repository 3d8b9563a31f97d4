"""Shared-prompt forward == plain forward (values and gradients); micro-batch planning."""

from __future__ import annotations

import torch

from mathrl.train.rows import ForwardBatch
from mathrl.train.forward import plan_micro_batches
from mathrl.train.layouts import Padded


def _batch(vocab: int, B=3, G=4, P=7, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(2, P + 1, (B,), generator=g)
    pids = torch.zeros(B * G, P, dtype=torch.long)
    pmask = torch.zeros(B * G, P, dtype=torch.long)
    for b in range(B):
        ids = torch.randint(3, vocab, (int(plen[b]),), generator=g)
        for j in range(G):
            pids[b * G + j, P - len(ids):] = ids
            pmask[b * G + j, P - len(ids):] = 1
    rlen = torch.randint(1, T + 1, (B * G,), generator=g)
    rids = torch.randint(3, vocab, (B * G, T), generator=g)
    rmask = (torch.arange(T)[None, :] < rlen[:, None]).long()
    rids = rids * rmask
    return pids, pmask, rids, rmask


def test_shared_prompt_forward_matches_plain(tiny_model):
    model = tiny_model.train()
    pids, pmask, rids, rmask = _batch(model.config.vocab_size)
    rows = torch.arange(12)
    results = []
    for gs in (1, 4):
        model.zero_grad()
        layout = Padded(gs)  # gs 1: plain; 4: shared prompt
        mb = layout.micro_batch(ForwardBatch(pids, pmask, rids, rmask.bool()), rows, "cpu")
        logp, ent = layout.policy_forward(model, mb, temperature=0.7, with_entropy=True)
        (logp.sum() + ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent.detach(), grads))
    (lp1, e1, g1), (lp4, e4, g4) = results
    torch.testing.assert_close(lp4, lp1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e4, e1, atol=1e-5, rtol=1e-5)
    assert (lp1[~rmask.bool()] == 0).all()
    assert g1.keys() == g4.keys()
    for k in g1:
        torch.testing.assert_close(g4[k], g1[k], atol=1e-5, rtol=1e-4, msg=k)


def test_plan_respects_budget_and_groups():
    pmask = torch.ones(8, 10, dtype=torch.long)
    rmask = torch.ones(8, 5, dtype=torch.long)
    plain = plan_micro_batches(pmask, rmask, 30)  # 15 tokens per row -> 2 rows per micro-batch
    assert [p.tolist() for p in plain] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    grouped = plan_micro_batches(pmask, rmask, 30, group_size=4)  # 10 + 4*5 = 30 per group
    assert [p.tolist() for p in grouped] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    big = plan_micro_batches(pmask, rmask, 1)  # a row over budget still runs alone
    assert len(big) == 8
    sub = plan_micro_batches(pmask, rmask, 100, rows=torch.tensor([4, 5, 6, 7]), group_size=2)
    assert [p.tolist() for p in sub] == [[4, 5, 6, 7]]


def test_shared_prompt_values_match_plain(tiny_model):
    from mathrl.models.value_head import ValueModel

    critic = ValueModel.from_causal_lm(tiny_model).train()
    # a zero head would hide backbone gradients; its own generator, so the head (and the rounding the tolerances
    # below cover) does not depend on which tests ran before (this test failed twice in a full run, never alone)
    torch.nn.init.normal_(critic.value_head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
    pids, pmask, rids, rmask = _batch(tiny_model.config.vocab_size, seed=1)
    rows = torch.arange(12)
    results = []
    for gs in (1, 4):
        critic.zero_grad()
        layout = Padded(gs)
        mb = layout.micro_batch(ForwardBatch(pids, pmask, rids, rmask.bool()), rows, "cpu")
        v = layout.value_forward(critic, mb)
        (v ** 2).sum().backward()
        grads = {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}
        results.append((v.detach(), grads))
    (v1, g1), (v4, g4) = results
    torch.testing.assert_close(v4, v1, atol=1e-5, rtol=1e-5)
    assert (v1[~rmask.bool()] == 0).all()
    assert g1.keys() == g4.keys() and any("backbone" in k for k in g1)
    for k in g1:
        torch.testing.assert_close(g4[k], g1[k], atol=1e-5, rtol=1e-4, msg=k)
