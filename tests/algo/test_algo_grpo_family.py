"""The GRPO-family additions against hand-computed values: truncated importance sampling and the
mismatch statistics, GSPO's sequence ratio and clipping, CISPO's clipped weight, and the dynamic
sampling / pass-rate filter bookkeeping. Each loss test has a negative control: the token-level PPO
loss on the same inputs gives a different gradient, so the test would fail if the option silently fell
back to it."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.correction import mismatch_stats, tis_weights
from mathrl.algo.filtering import (PassRateFilter, draw_prompts, group_pass_rates, informative_groups,
                                   select_pooled)
from mathrl.algo.losses import POLICY_LOSSES, cispo_loss, gspo_loss, policy_loss

T = torch.tensor


# --------------------------------------------------------------------------- TIS


def test_tis_token_weights_are_capped_ratios():
    trainer = T([[-1.0, -2.0, 0.0]])
    sampler = T([[-1.5, -1.0, -7.0]])
    mask = T([[1, 1, 0]])
    w, st = tis_weights(trainer, sampler, mask, cap=2.0)
    assert torch.allclose(w, T([[math.exp(0.5), math.exp(-1.0), 1.0]]))  # padding: weight 1
    assert float(st["tis/capped_frac"]) == 0.0
    w, st = tis_weights(trainer, sampler, mask, cap=1.5)
    assert torch.allclose(w, T([[1.5, math.exp(-1.0), 1.0]]))
    assert float(st["tis/capped_frac"]) == 0.5
    assert math.isclose(float(st["tis/weight_mean"]), (1.5 + math.exp(-1.0)) / 2, rel_tol=1e-6)


def test_tis_sequence_weight_is_the_capped_product():
    trainer = T([[-1.0, -2.0], [-1.0, 0.0]])
    sampler = T([[-1.5, -1.0], [-3.0, 0.0]])
    mask = T([[1, 1], [1, 0]])
    w, st = tis_weights(trainer, sampler, mask, cap=3.0, level="sequence")
    # row 0: exp(0.5 - 1.0) on both tokens; row 1: exp(2.0) = 7.39 capped to 3 on its one token
    assert torch.allclose(w, T([[math.exp(-0.5), math.exp(-0.5)], [3.0, 1.0]]))
    assert float(st["tis/capped_frac"]) == 0.5  # one response of two


def test_tis_weights_scale_each_tokens_gradient():
    logp = T([[-1.0, -2.0]], requires_grad=True)
    old = T([[-1.0, -2.0]])
    adv = T([[1.0, 1.0]])
    m = T([[1, 1]])
    w = T([[2.0, 0.5]])
    policy_loss(logp, old, adv, m, weights=w)[0].backward()
    weighted = logp.grad.clone()
    logp.grad = None
    policy_loss(logp, old, adv, m)[0].backward()
    assert torch.allclose(weighted, logp.grad * w)
    assert not torch.allclose(weighted, logp.grad)  # negative control: the weights matter


def test_mismatch_stats():
    trainer = T([[-1.0, -2.0, 0.0]])
    sampler = T([[-1.5, -1.0, -9.0]])
    st = mismatch_stats(trainer, sampler, T([[1, 1, 0]]))
    d = [0.5, -1.0]
    assert math.isclose(st["mismatch/logp_diff_mean"], 0.75)
    assert math.isclose(st["mismatch/logp_diff_max"], 1.0)
    assert math.isclose(st["mismatch/kl"], sum(math.exp(x) - 1 - x for x in d) / 2, rel_tol=1e-9)
    assert math.isclose(st["mismatch/ratio_max"], math.exp(0.5), rel_tol=1e-9)
    same = mismatch_stats(trainer, trainer, T([[1, 1, 0]]))
    assert same["mismatch/kl"] == 0.0 and same["mismatch/logp_diff_max"] == 0.0


def test_tis_rejects_bad_arguments():
    x = T([[0.0]])
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(x, x, T([[1]]), cap=0.0)
    with pytest.raises(ValueError, match="unknown TIS level"):
        tis_weights(x, x, T([[1]]), cap=2.0, level="word")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- GSPO


def _grad(fn, logp0, old, adv, mask, **kw):
    logp = logp0.clone().requires_grad_(True)
    loss, st = fn(logp, old, adv, mask, **kw)
    loss.backward()
    return float(loss.detach()), logp.grad, st


def test_gspo_uses_one_geometric_mean_ratio_per_response():
    logp, old = T([[-1.0, -2.0]]), T([[-1.1, -2.0]])  # token log-ratios 0.1 and 0
    adv, m = T([[1.0, 1.0]]), T([[1, 1]])
    s = math.exp(0.05)  # exp(mean log-ratio)
    loss, g, st = _grad(gspo_loss, logp, old, adv, m, clip_low=0.2, clip_high=0.2)
    assert math.isclose(loss, -s, rel_tol=1e-6)
    assert torch.allclose(g, T([[-s / 2, -s / 2]]), atol=1e-6)  # s_i * A_i / |y_i| on every token
    assert math.isclose(float(st["ratio_max"]), s, rel_tol=1e-6)
    # negative control: the token-level PPO loss weights each token by its own ratio
    _, g_ppo, _ = _grad(policy_loss, logp, old, adv, m, agg="seq-mean-token-mean")
    assert torch.allclose(g_ppo, T([[-math.exp(0.1) / 2, -0.5]]), atol=1e-6)
    assert not torch.allclose(g, g_ppo, atol=1e-4)


def test_gspo_clips_whole_responses():
    logp, old = T([[-1.0, -2.0], [-1.0, -2.0]]), T([[-1.1, -2.0], [-1.0, -2.0]])
    adv, m = T([[1.0, 1.0], [1.0, 1.0]]), T([[1, 1], [1, 1]])
    _, g, st = _grad(gspo_loss, logp, old, adv, m, clip_low=0.01, clip_high=0.01)
    # response 0: s = exp(0.05) > 1.01 with A > 0 -> no gradient on any of its tokens (even the token whose
    # own ratio is 1); response 1: s = 1 -> gradient 1/2 per token, over 2 responses
    assert torch.allclose(g[0], T([0.0, 0.0])) and torch.allclose(g[1], T([-0.25, -0.25]))
    assert float(st["clipfrac"]) == 0.5
    _, g_ppo, _ = _grad(policy_loss, logp, old, adv, m, clip_low=0.01, clip_high=0.01, agg="seq-mean-token-mean")
    assert float(g_ppo[0, 1]) != 0.0  # negative control: PPO keeps the in-range token's gradient


def test_gspo_with_empty_rows_and_padding():
    logp, old = T([[-1.0, 5.0], [3.0, 3.0]]), T([[-1.0, 0.0], [0.0, 0.0]])
    m = T([[1, 0], [0, 0]])
    loss, g, _ = _grad(gspo_loss, logp, old, T([[1.0, 1.0], [1.0, 1.0]]), m)
    assert math.isfinite(loss) and torch.isfinite(g).all()
    assert float(g[0, 1]) == 0.0 and torch.equal(g[1], T([0.0, 0.0]))


# --------------------------------------------------------------------------- CISPO


def test_cispo_keeps_a_bounded_gradient_where_ppo_clips():
    logp, old = T([[-1.0, -2.0]]), T([[-1.5, -2.0]])  # ratios exp(0.5) = 1.65 and 1
    adv, m = T([[1.0, 1.0]]), T([[1, 1]])
    loss, g, st = _grad(cispo_loss, logp, old, adv, m, clip_low=0.2, clip_high=0.2)
    assert torch.allclose(g, T([[-1.2 / 2, -1.0 / 2]]), atol=1e-6)  # weights 1.2 (clipped) and 1, token-mean
    assert math.isclose(loss, -(1.2 * -1.0 + 1.0 * -2.0) / 2, rel_tol=1e-6)
    assert float(st["clipfrac_high"]) == 0.5
    _, g_ppo, _ = _grad(policy_loss, logp, old, adv, m, clip_low=0.2, clip_high=0.2)
    assert float(g_ppo[0, 0]) == 0.0  # negative control: PPO drops the clipped token's gradient
    with pytest.raises(ValueError, match="dual_clip must be None"):
        cispo_loss(logp, old, adv, m, dual_clip=3.0)


def test_cispo_equals_ppo_inside_the_clip_range():
    torch.manual_seed(0)
    logp0 = -torch.rand(3, 4)
    old = logp0 + 0.01 * torch.randn(3, 4)
    adv, m = torch.randn(3, 4), torch.ones(3, 4)
    _, g_c, _ = _grad(cispo_loss, logp0, old, adv, m)
    _, g_p, _ = _grad(policy_loss, logp0, old, adv, m)
    assert torch.allclose(g_c, g_p, atol=1e-6)


def test_policy_loss_registry_shares_one_signature():
    logp, old, adv, m = -torch.rand(2, 3), -torch.rand(2, 3), torch.randn(2, 3), torch.ones(2, 3)
    for name, fn in POLICY_LOSSES.items():
        loss, st = fn(logp, old, adv, m, clip_low=0.2, clip_high=0.28, dual_clip=None, agg="token-mean",
                      norm_tokens=6.0, norm_seqs=2.0, norm_const=None, weights=torch.ones(2, 3))
        assert loss.dim() == 0 and {"clipfrac", "ratio_max", "approx_kl"} <= set(st), name


# --------------------------------------------------------------------------- dynamic sampling


def test_informative_groups():
    scores = T([1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0, 0, 0])
    assert informative_groups(scores, 4).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="groups of 3"):
        informative_groups(scores, 3)


def test_select_pooled_on_one_rank_is_first_come_first_kept_then_fill():
    masks = [[T([True, False, False, True]), T([False, True])]]
    s = select_pooled(masks, 3)
    assert s.assigned == [[(0, 0, 0), (0, 0, 3), (0, 1, 1)]] and (s.informative, s.filled, s.surplus) == (3, 0, 0)
    s = select_pooled(masks, 5)  # the rounds ran out: the earliest uninformative groups fill up
    assert s.assigned == [[(0, 0, 0), (0, 0, 3), (0, 1, 1), (0, 0, 1), (0, 0, 2)]] and s.filled == 2
    s = select_pooled(masks, 1)
    assert s.assigned == [[(0, 0, 0)]] and s.surplus == 2 and s.moved == []


def test_select_pooled_moves_spare_informative_groups_to_a_rank_that_is_short():
    """Rank 0 found 3 informative groups over two rounds, rank 1 one: with 2 per rank, rank 1 receives rank 0's
    third (the per-rank rule padded rank 1 with an uninformative group while rank 0 dropped an informative one)."""
    masks = [[T([True, True]), T([True, False])], [T([False, False]), T([False, True])]]
    s = select_pooled(masks, 2)
    assert s.assigned == [[(0, 0, 0), (0, 0, 1)], [(1, 1, 1), (0, 1, 0)]]
    assert (s.informative, s.filled, s.surplus) == (4, 0, 0) and s.moved == [(0, 1, 0)]


def test_select_pooled_moves_nothing_a_rank_can_fill_itself():
    masks = [[T([True, True]), T([True, True])], [T([True, False]), T([True, False])]]
    s = select_pooled(masks, 2)  # rank 1 has its own two: rank 0's spare stay unused
    assert s.assigned == [[(0, 0, 0), (0, 0, 1)], [(1, 0, 0), (1, 1, 0)]]
    assert (s.informative, s.filled, s.surplus, s.moved) == (4, 0, 2, [])


def test_select_pooled_fills_a_shortfall_with_the_ranks_own_uninformative_groups():
    masks = [[T([False, False]), T([False, False])], [T([True, True]), T([True, False])]]
    s = select_pooled(masks, 2)
    assert s.assigned == [[(1, 1, 0), (0, 0, 0)], [(1, 0, 0), (1, 0, 1)]]
    assert (s.informative, s.filled, s.surplus) == (3, 1, 0)


def test_pass_rate_filter_window():
    f = PassRateFilter(window=2)
    f.record(5, 1.0)
    assert not f.skip(5)  # seen once: not yet
    f.record(5, 1.0)
    assert f.skip(5)  # solved by every sample both times
    f.record(5, 0.5)
    assert not f.skip(5)  # the window holds [1.0, 0.5]
    f.record(7, 0.0)
    f.record(7, 0.0)
    assert f.skip(7) and f.skipped() == 1
    g = PassRateFilter(window=2)
    g.load_state_dict(f.state_dict())
    assert g.skip(7) and not g.skip(5) and g.history == f.history
    off = PassRateFilter(window=0)
    off.record(1, 1.0)
    off.record(1, 1.0)
    assert not off.skip(1) and off.history == {}


def test_draw_prompts_skips_and_never_stalls():
    idx, pos = draw_prompts(lambda p: p % 10, 0, 3, lambda i: i in (1, 2), limit=10)
    assert idx == [0, 3, 4] and pos == 5
    idx, pos = draw_prompts(lambda p: p % 10, 8, 3, lambda i: i in (1, 2), limit=10)
    assert idx == [8, 9, 0] and pos == 11  # across the end of a pass
    idx, pos = draw_prompts(lambda p: p % 10, 0, 2, lambda i: True, limit=5)  # everything filtered
    assert idx == [5, 6] and pos == 7


def test_group_pass_rates():
    assert group_pass_rates([True, False, True, True, False, False], 3) == [2 / 3, 1 / 3]
