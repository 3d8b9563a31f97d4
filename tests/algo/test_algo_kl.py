"""KL estimators against hand-computed numbers and their properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mathrl.algo.kl import KL_ESTIMATORS, estimate


def test_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.3])
    ref = torch.tensor([-1.5, -1.0, -0.3])
    # d = logp - ref = [0.5, -1.0, 0]
    torch.testing.assert_close(estimate(logp, ref, "k1"), torch.tensor([0.5, -1.0, 0.0]))
    # k2 = d^2 / 2 = [0.125, 0.5, 0]
    torch.testing.assert_close(estimate(logp, ref, "k2"), torch.tensor([0.125, 0.5, 0.0]))
    # k3 with x = ref - logp = [-0.5, 1.0, 0]: e^x - x - 1
    #   e^-0.5 + 0.5 - 1 = 0.6065307 - 0.5 = 0.1065307 ; e^1 - 1 - 1 = 0.7182818 ; 0
    k3 = [math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0]
    torch.testing.assert_close(estimate(logp, ref, "k3"), torch.tensor(k3))


def test_k3_unbiased_for_kl_on_samples():
    # KL(p || q) for p = [0.7, 0.3], q = [0.4, 0.6]:
    #   0.7 ln(0.7/0.4) + 0.3 ln(0.3/0.6) = 0.7*0.5596158 - 0.3*0.6931472 = 0.1837868
    # Exact expectation of each unbiased estimator under p (weights instead of samples):
    p = torch.tensor([0.7, 0.3], dtype=torch.float64)
    q = torch.tensor([0.4, 0.6], dtype=torch.float64)
    for kind in ("k1", "k3"):
        e = (p * estimate(p.log(), q.log(), kind)).sum()
        assert abs(float(e) - 0.1837868) < 1e-6


@settings(max_examples=100, deadline=None)
@given(st.floats(-30, 0, allow_nan=False), st.floats(-30, 0, allow_nan=False))
def test_k3_nonnegative_and_zero_iff_equal(a, b):
    logp, ref = torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)
    k = float(estimate(logp, ref, "k3"))
    assert k >= 0
    assert (k == 0) == (a == b) or abs(a - b) < 1e-7  # e^x-x-1 ~ x^2/2 underflows only at tiny |x|
    assert float(estimate(logp, logp, "k3")) == 0.0


def test_k3_gradient():
    # d k3 / d logp = -e^(ref - logp) + 1 = 1 - pi_ref/pi
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0])
    estimate(logp, ref, "k3").sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([1 - math.exp(-0.5), 1 - math.e]))


def test_mask_zeroes_padding_even_nan_and_no_nan_gradient():
    logp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    ref = torch.tensor([[-1.5, float("-inf")]])
    m = torch.tensor([[1, 0]])
    for kind in KL_ESTIMATORS:
        out = estimate(logp, ref, kind, mask=m)
        assert out[0, 1] == 0 and torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
        logp.grad = None


def test_log_ratio_clip_prevents_overflow():
    logp = torch.tensor([-200.0])
    ref = torch.tensor([-1.0])
    assert torch.isinf(estimate(logp, ref, "k3"))
    out = estimate(logp, ref, "k3", log_ratio_clip=20.0)
    torch.testing.assert_close(out, torch.tensor([math.exp(20) - 20 - 1]))


def test_unknown_kind_and_shapes():
    with pytest.raises(ValueError, match="allowed: k1, k2, k3"):
        estimate(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="shape"):
        estimate(torch.zeros(2), torch.zeros(3), "k1")
