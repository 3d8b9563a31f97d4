"""DPO's pure functions against hand-computed values (mathrl/algo/preference.py), each with a negative control."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.preference import dpo_loss, dpo_pairs, sequence_logprobs

T = torch.tensor


def test_dpo_pairs_by_hand():
    assert dpo_pairs([0, 0, 0, 1, 1], [False, True, False, True, True]) == [(1, 0)]
    assert dpo_pairs([0, 0, 0, 1, 1], [False, True, False, True, True], per_group=2) == [(1, 0)]
    # the k-th right with the k-th wrong, groups in order of their first row
    g, c = [5, 5, 5, 5, 2, 2], [True, False, True, False, False, True]
    assert dpo_pairs(g, c, per_group=2) == [(0, 1), (2, 3), (5, 4)]
    assert dpo_pairs(g, c) == [(0, 1), (5, 4)]
    assert dpo_pairs([0, 0], [True, True]) == [] and dpo_pairs([0, 0], [False, False]) == []
    with pytest.raises(ValueError, match="per_group"):
        dpo_pairs([0], [True], per_group=0)
    with pytest.raises(ValueError, match="differ in length"):
        dpo_pairs([0, 0], [True])


def test_sequence_logprobs_ignore_padding_even_minus_inf():
    logp = T([[-1.0, -2.0, -float("inf")], [-0.5, -float("inf"), -float("inf")]])
    m = T([[1, 1, 0], [1, 0, 0]])
    assert sequence_logprobs(logp, m).tolist() == [-3.0, -0.5]


def test_dpo_loss_by_hand():
    """Two pairs. Pair 1: policy chosen -1, rejected -3; reference -2, -2: h = 0.5 * ((-1 + 2) - (-3 + 2)) = 1.
    Pair 2: h = 0.5 * ((-4 + 3) - (-1 + 1)) = -0.5. L = (softplus(-1) + softplus(0.5)) / 2."""
    chosen = T([-1.0, -4.0], dtype=torch.float64, requires_grad=True)
    rejected = T([-3.0, -1.0], dtype=torch.float64, requires_grad=True)
    ref_c, ref_r = T([-2.0, -3.0], dtype=torch.float64), T([-2.0, -1.0], dtype=torch.float64)
    loss, st = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731  softplus
    assert float(loss) == pytest.approx((sp(-1.0) + sp(0.5)) / 2, abs=1e-12)
    loss.backward()
    # dL/dchosen_i = -beta * sigmoid(-h_i) / P; dL/drejected_i = +beta * sigmoid(-h_i) / P
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = [-0.5 * sig(-1.0) / 2, -0.5 * sig(0.5) / 2]
    assert chosen.grad.tolist() == pytest.approx(want, abs=1e-12)
    assert rejected.grad.tolist() == pytest.approx([-w for w in want], abs=1e-12)
    assert float(st["margin"]) == pytest.approx(0.25) and float(st["accuracy"]) == 0.5
    assert float(st["reward_chosen"]) == pytest.approx((0.5 + -0.5) / 2)
    assert float(st["reward_rejected"]) == pytest.approx((-0.5 + 0.0) / 2)
    # the global pair count of the step divides the sum: two halves with norm_pairs=2 add up to the whole
    half = [dpo_loss(chosen[i:i + 1], rejected[i:i + 1], ref_c[i:i + 1], ref_r[i:i + 1], beta=0.5, norm_pairs=2)[0]
            for i in range(2)]
    assert float(sum(half)) == pytest.approx(float(loss), abs=1e-12)
    # negative control: swapping chosen and rejected changes the loss (the preference has a direction)
    swapped, _ = dpo_loss(rejected, chosen, ref_r, ref_c, beta=0.5)
    assert float(swapped) == pytest.approx((sp(1.0) + sp(-0.5)) / 2, abs=1e-12) and float(swapped) != float(loss)


def test_dpo_label_smoothing_and_reference_is_constant():
    c, r = T([0.0], requires_grad=True), T([0.0], requires_grad=True)
    ref_c = T([0.0], requires_grad=True)
    loss, _ = dpo_loss(c, r, ref_c, T([2.0]), beta=1.0, label_smoothing=0.1)  # h = 2
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert float(loss) == pytest.approx(0.9 * sp(-2.0) + 0.1 * sp(2.0), abs=1e-6)
    loss.backward()
    assert ref_c.grad is None  # the reference's logprobs are constants
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(c, r, ref_c, T([0.0]), beta=0.0)
    with pytest.raises(ValueError, match="one shape"):
        dpo_loss(c, T([0.0, 1.0]), ref_c, T([0.0]))
