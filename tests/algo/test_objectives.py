"""mathrl.algo.objectives against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.objectives import policy_objective, sft_loss


def test_policy_objective_adds_kl_and_subtracts_entropy_by_hand():
    # one response of two tokens, on-policy (ratio 1): the PPO term is -mean(adv) over the tokens
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    adv = torch.tensor([[0.5, 0.5]])
    ent = torch.tensor([[0.3, 0.7]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    obj = policy_objective(logp, logp, adv, mask, ref_logp=ref, kl_coef=0.1, kl_estimator="k1", entropy=ent,
                           entropy_coef=0.01, norm_tokens=2.0)
    assert float(obj.pg_loss) == pytest.approx(-0.5)
    kl = ((-1.0 + 1.5) + (-2.0 + 1.0)) / 2  # k1 = logp - ref, token mean
    assert float(obj.kl_loss) == pytest.approx(kl)
    assert float(obj.loss) == pytest.approx(-0.5 + 0.1 * kl - 0.01 * 0.5)
    # k3 = exp(ref - logp) - (ref - logp) - 1
    k3 = sum(math.exp(d) - d - 1 for d in (-0.5, 1.0)) / 2
    assert float(policy_objective(logp, logp, adv, mask, ref_logp=ref, kl_coef=1.0, norm_tokens=2.0).kl_loss) == \
        pytest.approx(k3)
    # without a reference there is no KL term; the global normaliser halves a micro-batch's share
    half = policy_objective(logp, logp, adv, mask, norm_tokens=4.0)
    assert half.kl_loss is None and float(half.loss) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="entropy"):
        policy_objective(logp, logp, adv, mask, entropy_coef=0.1)


def test_sft_loss_is_the_masked_mean_nll():
    logp = torch.tensor([[-1.0, -3.0, float("-inf")]])
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    assert float(sft_loss(logp, mask)) == pytest.approx(2.0)
    assert float(sft_loss(logp, mask, norm_tokens=4.0)) == pytest.approx(1.0)
