"""The significance and power functions of mathrl/eval/metrics.py, against hand-computed values.

Sign-flip p-values are counted by hand over the 2^k sign patterns; Holm's adjusted p-values are worked
out from the sorted list; the minimum detectable difference uses z_0.975 = 1.959964, z_0.99375 = 2.497705
and z_0.8 = 0.841621 (normal quantiles from a table)."""

from __future__ import annotations

import math
import random

import pytest

from mathrl.eval.metrics import holm, min_detectable_diff, paired_permutation_p, sample_sd


def test_sign_flip_p_values_counted_by_hand():
    # (1, 2, 3): of the 8 sign patterns only +++ and --- reach |sum| >= 6
    assert paired_permutation_p([1, 2, 3]) == 0.25
    assert paired_permutation_p([-1, -2, -3]) == 0.25           # two-sided
    assert paired_permutation_p([1, 2, 3, 0, 0]) == 0.25        # zero differences carry no sign
    # (2, 1, 1): sums 4, 2, 2, 0, 0, -2, -2, -4 -> 2 of 8 reach 4
    assert paired_permutation_p([2, 1, 1]) == 0.25
    # (3, 1): sums 4, 2, -2, -4 -> 2 of 4
    assert paired_permutation_p([3, 1]) == 0.5
    # (1, -1): observed sum 0, every pattern reaches it
    assert paired_permutation_p([1, -1]) == 1.0
    assert paired_permutation_p([0.0, 0.0]) == 1.0
    assert math.isnan(paired_permutation_p([]))
    # ten problems all +1 (exact: 2 / 1024); the floats of 0.1 sum in another order to the same value
    assert paired_permutation_p([1.0] * 10) == 2 / 1024
    assert paired_permutation_p([0.1] * 10) == 2 / 1024


def test_sign_flip_monte_carlo_beyond_the_exact_limit():
    # 20 differences of +1: exact p = 2 / 2^20; 999 random patterns (seeded) hit none -> (1 + 0) / (1 + 999)
    assert paired_permutation_p([1.0] * 20, resamples=999) == 0.001
    rng = random.Random(3)
    d = [rng.choice([-1.0, -0.5, 0.25, 0.5, 1.0]) for _ in range(18)]
    exact = paired_permutation_p(d, exact_max=18)
    sampled = paired_permutation_p(d, resamples=20_000, exact_max=16)
    assert 0.05 < exact < 0.95 and abs(sampled - exact) < 0.015
    with pytest.raises(ValueError, match="resamples=0"):
        paired_permutation_p([1.0] * 20, resamples=0)


def test_holm_adjusted_p_values_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04)
    got = holm([0.01, 0.04, 0.03, 0.005])
    assert got == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p <= 0.05 for p in got] == [True, False, False, True]
    # step-down keeps the adjusted values monotone: 3 x 0.01, 2 x 0.02, max(0.04, 0.03); Bonferroni would give
    # 0.03, 0.06, 0.09
    assert holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])
    assert holm([0.5, 0.6]) == [1.0, 1.0]                       # capped at 1
    assert holm([0.02]) == [0.02] and holm([]) == []
    for bad in (float("nan"), -0.1, 1.5):
        with pytest.raises(ValueError, match="not in \\[0, 1\\]"):
            holm([0.01, bad])


def test_minimum_detectable_difference_by_hand():
    # (1.959964 + 0.841621) * 0.5 / sqrt(100) = 2.801585 * 0.05
    assert min_detectable_diff(0.5, 100) == pytest.approx(0.1400793, abs=1e-6)
    # Holm's first step over 4 contrasts: alpha 0.0125 -> (2.497705 + 0.841621) * 0.5 / 10
    assert min_detectable_diff(0.5, 100, alpha=0.0125) == pytest.approx(0.1669663, abs=1e-6)
    # 90% power: z_0.9 = 1.281552
    assert min_detectable_diff(1.0, 4, power=0.9) == pytest.approx((1.959964 + 1.281552) / 2, abs=1e-6)
    assert min_detectable_diff(0.0, 50) == 0.0
    assert math.isnan(min_detectable_diff(0.5, 1)) and math.isnan(min_detectable_diff(float("nan"), 10))
    with pytest.raises(ValueError, match="alpha=1.5"):
        min_detectable_diff(0.5, 10, alpha=1.5)
    # sample sd, divisor n - 1: mean 2.5, squares 2.25 + 0.25 + 0.25 + 2.25 = 5, 5 / 3
    assert sample_sd([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3))
    assert math.isnan(sample_sd([1.0]))
