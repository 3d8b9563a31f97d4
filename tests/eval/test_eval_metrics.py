"""Estimator tests against hand-worked values and brute-force enumeration."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from itertools import combinations

import pytest

from mathrl.eval import metrics as M
from mathrl.eval.metrics import (
    bootstrap_ci, cluster_answers, maj_at_k, maj_at_k_bruteforce, mean_pass_at_k, paired_bootstrap_diff,
    pass_at_k, wilson_interval,
)


# --------------------------------------------------------------------------- pass@k

@pytest.mark.parametrize("n,c,k,expected", [
    (4, 1, 1, 0.25),          # c / n
    (4, 1, 4, 1.0),           # any 4 of 4 contain the correct one (not 0.684 = 1 - 0.75^4)
    (5, 2, 2, 0.7),           # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 0, 2, 0.0),
    (4, 4, 1, 1.0),
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (16, 1, 4, 0.25),          # 1 - C(15,4)/C(16,4) = 4/16
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def _pass_bruteforce(n: int, c: int, k: int) -> Fraction:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return Fraction(sum(any(outcomes[i] for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_subset_enumeration():
    for n in range(1, 9):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == float(_pass_bruteforce(n, c, k)), (n, c, k)


def test_pass_at_1_is_fraction_correct():
    for n in (1, 3, 16, 64):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)


def test_pass_at_k_product_form_matches_exact(monkeypatch):
    cases = [(n, c, k) for n in (20, 50, 200) for c in (0, 1, 7, n // 2, n - 1) for k in (1, 4, 16)]
    exact = {case: pass_at_k(*case) for case in cases}
    monkeypatch.setattr(M, "EXACT_PASS_N", 0)  # force the product branch
    for case in cases:
        assert pass_at_k(*case) == pytest.approx(exact[case], rel=1e-12, abs=1e-15), case


def test_pass_at_k_large_n_is_finite_and_monotone():
    vals = [pass_at_k(100_000, 10, k) for k in (1, 10, 100, 1000)]
    assert all(0 <= v <= 1 for v in vals) and vals == sorted(vals)
    assert vals[0] == pytest.approx(1e-4)


@pytest.mark.parametrize("args", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5), (0, 0, 1), (4.0, 1, 1)])
def test_pass_at_k_rejects_bad_input(args):
    with pytest.raises((ValueError, TypeError)):
        pass_at_k(*args)


def test_mean_pass_at_k_averages_problems():
    assert mean_pass_at_k([4, 4], [1, 0], 4) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mean_pass_at_k([4], [1, 2], 1)


# --------------------------------------------------------------------------- maj@k

def test_maj_hand_values():
    # answers: A A B (A correct). k=1: 2/3. k=3: A wins. k=2: subsets AA(A), AB(tie 1/2) x2 -> (1+.5+.5)/3
    labels = ["A", "A", "B"]
    assert maj_at_k(labels, {"A"}, 1) == pytest.approx(2 / 3)
    assert maj_at_k(labels, {"A"}, 2) == pytest.approx(2 / 3)
    assert maj_at_k(labels, {"A"}, 3) == 1.0
    # correct answer in the minority: A B B, A correct: k=3 -> B wins -> 0
    assert maj_at_k(["A", "B", "B"], {"A"}, 3) == 0.0
    # three-way tie with one correct: 1/3
    assert maj_at_k(["A", "B", "C"], {"A"}, 3) == pytest.approx(1 / 3)


def test_maj_abstentions_do_not_vote():
    # A None None: with k=3 only A votes -> correct. All-abstain subset scores 0.
    assert maj_at_k(["A", None, None], {"A"}, 3) == 1.0
    assert maj_at_k(["A", None, None], {"A"}, 1) == pytest.approx(1 / 3)
    assert maj_at_k([None, None], {"A"}, 2) == 0.0
    # k=2 of [A, None, B]: {A,N} -> A, {A,B} tie 1/2, {N,B} -> B: (1 + .5 + 0)/3
    assert maj_at_k(["A", None, "B"], {"A"}, 2) == pytest.approx(0.5)


def test_maj_at_1_equals_pass_at_1():
    rng = random.Random(1)
    for _ in range(50):
        n = rng.randint(1, 10)
        labels = [rng.choice([None, 0, 1, 2]) for _ in range(n)]
        c = sum(1 for lab in labels if lab == 0)
        assert maj_at_k(labels, {0}, 1) == pytest.approx(c / n)


def test_maj_exact_matches_bruteforce_random_cases():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        alphabet = list(range(rng.randint(1, 4)))
        labels = [rng.choice(alphabet + [None]) for _ in range(n)]
        correct = set(rng.sample(alphabet, rng.randint(0, min(2, len(alphabet)))))
        for k in range(1, n + 1):
            assert maj_at_k(labels, correct, k) == pytest.approx(maj_at_k_bruteforce(labels, correct, k),
                                                                 abs=1e-12), (labels, correct, k)


def test_maj_resampling_is_seeded_and_close_to_exact():
    labels = [0] * 7 + [1] * 6 + [2] * 3 + [None] * 4
    exact = maj_at_k(labels, {0}, 8)
    a = maj_at_k(labels, {0}, 8, max_exact_subsets=0, resamples=4000, seed=3)
    b = maj_at_k(labels, {0}, 8, max_exact_subsets=0, resamples=4000, seed=3)
    assert a == b
    assert a == pytest.approx(exact, abs=4 * 0.5 / math.sqrt(4000))


def test_maj_rejects_bad_k():
    with pytest.raises(ValueError):
        maj_at_k(["A"], {"A"}, 2)
    with pytest.raises(ValueError):
        maj_at_k(["A"], {"A"}, 0)


def test_cluster_answers_groups_by_equivalence_not_string():
    def equivalent(a, b):  # a toy equivalence: numeric value
        from fractions import Fraction as F
        try:
            return F(a) == F(b)
        except ValueError:
            return a == b

    # gold 1/2: the correct ones (judged by the verifier) vote together whatever their spelling
    answers = ["1/2", "0.5", "3", "3.0", None, "7", "3"]
    verdicts = [True, True, False, False, False, False, False]
    labels, correct = cluster_answers(answers, verdicts, equivalent)
    assert labels[0] == labels[1] == 0 and correct == {0}
    assert labels[2] == labels[3] == labels[6] != labels[5]
    assert labels[4] is None
    # 2 correct vs 3 votes for "3": majority over all 7 picks the wrong class
    assert maj_at_k(labels, correct, 7) == 0.0


def test_cluster_then_vote_with_string_equal_wrong_answers_split():
    # without equivalence 1/2 and 0.5 would split the vote and "3" (2 votes) would win
    answers = ["1/2", "0.5", "3", "3"]
    labels, correct = cluster_answers(answers, [True, True, False, False], lambda a, b: a == b)
    assert maj_at_k(labels, correct, 4) == pytest.approx(0.5)  # 2 vs 2 tie -> 1/2


# --------------------------------------------------------------------------- intervals

def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_bootstrap_ci_contains_mean_and_is_seeded():
    vals = [1.0] * 30 + [0.0] * 70
    lo, hi = bootstrap_ci(vals, seed=1)
    assert lo < 0.3 < hi and (lo, hi) == bootstrap_ci(vals, seed=1)
    # close to the binomial interval for 0/1 scores
    wlo, whi = wilson_interval(30, 100)
    assert lo == pytest.approx(wlo, abs=0.03) and hi == pytest.approx(whi, abs=0.03)
    assert bootstrap_ci([0.5] * 10) == (0.5, 0.5)


def test_paired_bootstrap_detects_consistent_gain():
    before = [0.0] * 50 + [1.0] * 50
    after = [1.0] * 20 + [0.0] * 30 + [1.0] * 50  # 20 problems flipped to correct
    res = paired_bootstrap_diff(before, after, seed=0)
    assert res["diff"] == pytest.approx(0.2)
    assert 0.0 < res["lo"] < 0.2 < res["hi"]
    assert res["p_le_0"] == 0.0
    same = paired_bootstrap_diff(before, before)
    assert same["diff"] == 0 and same["lo"] == same["hi"] == 0
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1.0], [1.0, 0.0])
