"""Advantage estimators and masked statistics against hand-computed numbers, plus properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mathrl.algo import advantages as A
from mathrl.algo.advantages import (
    ESTIMATORS,
    broadcast_to_tokens,
    dr_grpo,
    gae,
    get_advantage_estimator,
    grpo,
    masked_mean,
    masked_var,
    masked_whiten,
    reinforce_pp,
    rloo,
    token_level_rewards,
)

t = torch.tensor


def close(a, b, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), rtol=0, atol=atol)


# ----------------------------------------------------------------------------- masked stats


def test_masked_stats_by_hand():
    x = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    m = t([[1, 1, 0], [1, 0, 0]])
    # valid: 1, 2, 4 -> mean = 7/3
    close(masked_mean(x, m), 7 / 3)
    # per row: (1+2)/2 = 1.5 ; 4/1 = 4
    close(masked_mean(x, m, dim=-1), [1.5, 4.0])
    # deviations -4/3, -1/3, 5/3 -> squares 16/9 + 1/9 + 25/9 = 42/9 = 14/3
    # unbiased: 14/3 / (3-1) = 7/3 ; biased: 14/3 / 3 = 14/9
    close(masked_var(x, m), 7 / 3)
    close(masked_var(x, m, unbiased=False), 14 / 9)
    # whiten: (x - 7/3) / sqrt(7/3), 0 at padding
    s = math.sqrt(7 / 3)
    close(masked_whiten(x, m, eps=0.0), [[-4 / 3 / s, -1 / 3 / s, 0], [5 / 3 / s, 0, 0]])
    # shift_mean=False adds the mean back: (x - mean)/std + mean
    close(masked_whiten(x, m, shift_mean=False, eps=0.0),
          [[-4 / 3 / s + 7 / 3, -1 / 3 / s + 7 / 3, 0], [5 / 3 / s + 7 / 3, 0, 0]])


def test_masked_stats_empty_and_single():
    x = t([[1.0, 2.0]])
    close(masked_mean(x, t([[0, 0]])), 0.0)  # nothing valid -> 0, not NaN
    close(masked_var(x, t([[0, 1]])), 0.0)  # one value -> unbiased var defined as 0
    assert torch.isfinite(masked_whiten(x, t([[0, 0]]))).all()


def test_masked_stats_ignore_padding_values_even_nan():
    x = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), -1e30]])
    m = t([[True, True, False], [True, False, False]])
    close(masked_mean(x, m), 7 / 3)
    close(masked_var(x, m), 7 / 3)
    w = masked_whiten(x, m)
    assert torch.isfinite(w).all() and (w[~m] == 0).all()


def test_mask_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="mask shape"):
        masked_mean(torch.zeros(2, 3), torch.ones(2, 2))


# ----------------------------------------------------------------------------- grpo / rloo


def test_grpo_by_hand():
    # group 7: [1, 0, 0, 1] -> mean 0.5, deviations +-0.5, sum sq = 4 * 0.25 = 1,
    #   unbiased var = 1/3, std = 0.5773503 -> A = +-0.5 / 0.5773503 = +-0.8660254
    # group 3: [1, 1] -> std 0 -> A = 0 ; group 9: a single response -> 0
    scores = t([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 5.0])
    group = t([7, 3, 7, 3, 7, 7, 9])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(grpo(scores, group), [a, 0, -a, 0, -a, a, 0])
    # Dr. GRPO: no division: +-0.5
    close(grpo(scores, group, std_normalize=False), [0.5, 0, -0.5, 0, -0.5, 0.5, 0])
    close(dr_grpo(scores, group), [0.5, 0, -0.5, 0, -0.5, 0.5, 0])


def test_grpo_batch_std_by_hand():
    """std_normalize = "batch" (TRL's scale_rewards="batch"): the centred rewards divided by the std of all
    eight rewards of the batch, 0.5175 (by hand: mean 3/8, squared deviations 1.875, / 7), not by each group's."""
    scores, group = t([1.0, 0, 0, 0, 1, 1, 0, 0]), t([0, 0, 0, 0, 1, 1, 1, 1])
    std_b = math.sqrt(1.875 / 7)
    want = [x / (std_b + 1e-6) for x in (0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5)]
    close(grpo(scores, group, std_normalize="batch"), want)
    # the group std (0.5 and 0.5774) is another normaliser: the negative control
    assert not torch.allclose(grpo(scores, group, std_normalize="group"), torch.tensor(want))
    close(grpo(scores, group, std_normalize="group"), grpo(scores, group, std_normalize=True), atol=0)
    # reduce sums over ranks: two ranks holding this batch each are a batch of 16 (std sqrt(3.75 / 15) = 0.5)
    close(grpo(scores, group, std_normalize="batch", reduce=lambda x: x + x),
          [x / (0.5 + 1e-6) for x in (0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5)])
    # an all-equal group stays exactly 0
    assert (grpo(t([1.0, 1, 0, 1]), t([0, 0, 1, 1]), std_normalize="batch")[:2] == 0).all()


def test_reinforce_pp_baseline_by_hand():
    """REINFORCE++-baseline: the scores centred on their group's mean (1, 0 | 1, 1 -> 0.5, -0.5 | 0, 0), each
    response's tokens get its centred score (gamma 1, no KL), whitened over the batch's six tokens (mean 1/12,
    unbiased variance 0.708333 / 5)."""
    scores, group = t([1.0, 0.0, 1.0, 1.0]), t([0, 0, 1, 1])
    m = t([[1, 1], [1, 0], [1, 0], [1, 1]])
    adv, _ = A.estimate_advantages("reinforce_pp_baseline", scores, group, m, params={"gamma": 1.0})
    mean, std = 1 / 12, math.sqrt((0.708333333333 + 1e-12) / 5)
    dev = lambda x: (x - mean) / math.sqrt(std ** 2 + 1e-8)  # noqa: E731
    close(adv, [[dev(0.5), dev(0.5)], [dev(-0.5), 0], [dev(0.0), 0], [dev(0.0), dev(0.0)]], atol=1e-5)
    # plain REINFORCE++ (no group baseline) gives the solved group's responses a positive advantage
    plain, _ = A.estimate_advantages("reinforce_pp", scores, group, m, params={"gamma": 1.0})
    assert plain[3, 0] > 0 > adv[3, 0]


def test_rloo_by_hand():
    # group 0: [1, 0, 0, 1]: for r=1 the others' mean is (0+0+1)/3 = 1/3 -> A = 2/3;
    #          for r=0 the others' mean is (1+0+1)/3 = 2/3 -> A = -2/3
    # group 1: [3, 1, 2]: 3 - (1+2)/2 = 1.5 ; 1 - (3+2)/2 = -1.5 ; 2 - (3+1)/2 = 0
    # group 2: single -> 0
    scores = t([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 4.0])
    group = t([0, 0, 0, 0, 1, 1, 1, 2])
    close(rloo(scores, group), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.5, -1.5, 0.0, 0.0])


def test_integer_scores_are_accepted():
    out = grpo(t([1, 0]), t([0, 0]))
    assert out.dtype == torch.float32
    close(out, [0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=6),
    st.floats(-100, 100, allow_nan=False),
    st.floats(-5, 5, allow_nan=False),
)
def test_group_properties(vals, shift, const):
    scores = torch.tensor(vals + [const] * 3, dtype=torch.float64)
    group = torch.tensor([0] * len(vals) + [1] * 3)
    for fn in (grpo, dr_grpo, rloo):
        a = fn(scores, group)
        # a constant-reward group has advantage 0
        assert (a[-3:] == 0).all()
        # shifting all rewards of a group by a constant changes nothing
        shifted = scores.clone()
        shifted[: len(vals)] += shift
        torch.testing.assert_close(fn(shifted, group), a, rtol=0, atol=1e-7)
        # advantages of a group sum to 0
        assert abs(float(a[: len(vals)].sum())) < 1e-7


def test_group_index_validation():
    with pytest.raises(ValueError, match="group_index shape"):
        grpo(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        grpo(torch.zeros(3), torch.zeros(3))


# ----------------------------------------------------------------------------- reinforce++


def test_reinforce_pp_by_hand():
    # gamma = 0.5. row 0 rewards [0, 0, 1] -> returns G2 = 1, G1 = 0 + .5*1 = .5, G0 = .25
    #              row 1 rewards [0, 2, pad] -> G1 = 2, G0 = 0 + .5*2 = 1
    # valid returns .25 .5 1 1 2: mean = 4.75/5 = .95; deviations -.7 -.45 .05 .05 1.05,
    # squares .49 .2025 .0025 .0025 1.1025 = 1.8 -> unbiased var 1.8/4 = .45
    r = t([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    m = t([[1, 1, 1], [1, 1, 0]])
    s = math.sqrt(0.45 + 1e-8)
    close(reinforce_pp(r, m, gamma=0.5), [[-0.7 / s, -0.45 / s, 0.05 / s], [0.05 / s, 1.05 / s, 0.0]])


def test_reinforce_pp_skips_holes_in_mask():
    # mask hole at t=1: its reward 100 is ignored; G0 = r0 + gamma * G2 = 0 + 1*1 = 1, G2 = 1
    r = t([[0.0, 100.0, 1.0], [0.0, 0.0, 3.0]])
    m = t([[1, 0, 1], [1, 1, 1]])
    out = reinforce_pp(r, m, gamma=1.0)
    # returns: row0 [1, -, 1], row1 [3, 3, 3]: mean 11/5, whitened
    g = torch.tensor([1.0, 1.0, 3.0, 3.0, 3.0])
    w = (g - g.mean()) / torch.sqrt(g.var() + 1e-8)
    close(out[m.bool()], w)
    assert out[0, 1] == 0


# ----------------------------------------------------------------------------- gae


def test_gae_by_hand():
    # gamma = .9, lam = .8, r = [0, 0, 1], V = [.5, .6, .7], V after the last token = 0
    # t=2: delta = 1 + .9*0 - .7 = .3                 A2 = .3
    # t=1: delta = 0 + .9*.7 - .6 = .03                A1 = .03 + .72*.3 = .246
    # t=0: delta = 0 + .9*.6 - .5 = .04                A0 = .04 + .72*.246 = .21712
    # returns = A + V = [.71712, .846, 1.0]
    r = t([[0.0, 0.0, 1.0]])
    v = t([[0.5, 0.6, 0.7]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8)
    close(adv, [[0.21712, 0.246, 0.3]])
    close(ret, [[0.71712, 0.846, 1.0]])


def test_gae_bootstraps_zero_after_last_valid_token_not_padded_end():
    # Same response padded with two positions holding garbage values/rewards: result
    # must be identical (V = 0 after the last *valid* token).
    r = t([[0.0, 0.0, 1.0, 5.0, -3.0]])
    v = t([[0.5, 0.6, 0.7, 9.0, 9.0]])
    m = t([[1, 1, 1, 0, 0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    close(adv, [[0.21712, 0.246, 0.3, 0, 0]])
    close(ret, [[0.71712, 0.846, 1.0, 0, 0]])


def test_gae_lambda_one_is_reward_to_go_minus_value():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(4, 6, generator=g, dtype=torch.float64)
    v = torch.randn(4, 6, generator=g, dtype=torch.float64)
    m = torch.ones(4, 6)
    m[1, 4:] = 0
    m[3, 1:] = 0
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    rm = r * m
    rtg = rm.flip(-1).cumsum(-1).flip(-1)  # sum_{k>=t} r_k over valid tokens
    torch.testing.assert_close(adv, (rtg - v) * m)
    torch.testing.assert_close(ret, rtg * m)


def test_gae_does_not_backprop_into_values():
    v = torch.zeros(1, 2, requires_grad=True)
    adv, ret = gae(torch.ones(1, 2), v, torch.ones(1, 2), gamma=1.0, lam=1.0)
    assert not adv.requires_grad and not ret.requires_grad


# ----------------------------------------------------------------------------- padding invariance


def test_padding_never_changes_token_level_outputs():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(3, 5, generator=g)
    v = torch.randn(3, 5, generator=g)
    m = t([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 1, 1, 0]])
    pad = m == 0
    r2, v2 = r.clone(), v.clone()
    r2[pad] = float("nan")
    v2[pad] = 1e6
    for fn in (lambda r, v: reinforce_pp(r, m, gamma=0.9), lambda r, v: gae(r, v, m, gamma=0.9, lam=0.7)[0],
               lambda r, v: gae(r, v, m, gamma=0.9, lam=0.7)[1], lambda r, v: masked_whiten(r, m)):
        a, b = fn(r, v), fn(r2, v2)
        torch.testing.assert_close(a, b)
        assert (a[pad] == 0).all()


# ----------------------------------------------------------------------------- trainer glue


def test_token_level_rewards_by_hand():
    # row 0: mask [1,1,0]: -0.5*[.1, .2] + score 1 at t=1 -> [-.05, -.1 + 1 = .9, 0]
    # row 1: mask [1,1,1]: -0.5*[.3, 0, .4] + score .5 at t=2 -> [-.15, 0, -.2 + .5 = .3]
    scores = t([1.0, 0.5])
    m = t([[1, 1, 0], [1, 1, 1]])
    kl = t([[0.1, 0.2, 9.0], [0.3, 0.0, 0.4]])
    close(token_level_rewards(scores, m, kl=kl, kl_coef=0.5), [[-0.05, 0.9, 0.0], [-0.15, 0.0, 0.3]])
    close(token_level_rewards(scores, m), [[0, 1.0, 0], [0, 0, 0.5]])
    # last valid token with a hole before the end: mask [1,1,0,1,0] -> t=3
    close(token_level_rewards(t([2.0]), t([[1, 1, 0, 1, 0]])), [[0, 0, 0, 2.0, 0]])


def test_token_level_rewards_rejects_empty_response():
    with pytest.raises(ValueError, match=r"responses \[1\] have no valid token"):
        token_level_rewards(t([1.0, 1.0]), t([[1, 0], [0, 0]]))


def test_broadcast_to_tokens():
    close(broadcast_to_tokens(t([2.0, -1.0]), t([[1, 1, 0], [1, 0, 0]])), [[2, 2, 0], [-1, 0, 0]])


def test_reinforce_pp_with_outcome_reward():
    # With reward only at the end and gamma=1, every token of a response gets its score
    # as return; REINFORCE++ whitening is then a batch-level affine map of the score.
    scores = t([1.0, 0.0, 1.0])
    m = t([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    a = reinforce_pp(token_level_rewards(scores, m), m)
    assert (a[0, :2] > 0).all() and (a[1] < 0).all() and a[2, 0] > 0
    torch.testing.assert_close(a[0, 0], a[2, 0])


# ----------------------------------------------------------------------------- registry


def test_registry():
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "grpo_ps"}
    assert {n for n, s in ESTIMATORS.items() if s.level in ("sequence", "token")} == set(ESTIMATORS) - {"grpo_ps"}
    assert ESTIMATORS["grpo_ps"].level == "step"
    assert get_advantage_estimator("rloo") is rloo
    with pytest.raises(ValueError, match="allowed: dr_grpo, gae, grpo, grpo_ps, reinforce_pp, reinforce_pp_baseline, rloo"):
        get_advantage_estimator("ppo")


def test_sequence_kl_scores_fold_the_kl_before_the_group_baseline():
    from mathrl.algo.advantages import rloo, sequence_kl_scores

    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    kl = torch.tensor([[0.5, 0.5, 9.0], [0.1, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0]]).bool()  # 9.0 sits at padding
    out = sequence_kl_scores(scores, kl, m, 0.1)
    torch.testing.assert_close(out, torch.tensor([1.0 - 0.1, 0.0 - 0.01, 1.0, 0.0 - 0.3]))
    group = torch.tensor([0, 0, 0, 0])
    assert not torch.equal(rloo(out, group), rloo(scores, group))
