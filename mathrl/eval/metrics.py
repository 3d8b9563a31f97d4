"""Evaluation estimators: pass@k, maj@k, greedy accuracy, lengths, confidence intervals, tests.

Every function here is pure (numbers and lists in, numbers out); the runner
(:mod:`mathrl.eval.runner`) feeds them the verifier's verdicts.

Conventions
-----------
* ``n`` samples per problem, ``c`` of them correct, ``k <= n``.
* A benchmark score is the *mean over problems* of the per-problem value.
* Answers for majority voting arrive already grouped into classes of verified
  equivalence (see :func:`cluster_answers`): ``labels[i]`` is the class of
  sample ``i`` or ``None`` when the sample has no extracted answer.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from itertools import combinations
from typing import Callable, Hashable, Sequence

__all__ = [
    "EXACT_PASS_N", "MAJ_EXACT_SUBSETS", "MAJ_RESAMPLES",
    "pass_at_k", "mean_pass_at_k", "maj_at_k", "maj_at_k_bruteforce", "mean",
    "cluster_answers", "wilson_interval", "bootstrap_ci", "paired_bootstrap_diff",
    "EXACT_SIGN_FLIP", "paired_permutation_p", "holm", "min_detectable_diff", "sample_sd",
]

EXACT_PASS_N = 10_000
"""``pass_at_k`` uses exact integer arithmetic up to this ``n`` and the stable product beyond."""

MAJ_EXACT_SUBSETS = 200_000
"""``maj_at_k`` is exact when ``C(n, k)`` is at most this; otherwise it resamples."""

MAJ_RESAMPLES = 2_000
"""Default number of seeded random size-k subsets when ``maj_at_k`` is not exact."""


def _check_nck(n: int, c: int, k: int) -> None:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"pass_at_k: {name}={v!r} must be an integer")
    if n < 1:
        raise ValueError(f"pass_at_k: n={n} must be >= 1")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} must satisfy 0 <= c <= n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must satisfy 1 <= k <= n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct.

    Formula (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code", eq. 1)::

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that a uniformly random size-k subset of the n samples holds
    at least one correct one; its expectation over the sampling of the n samples
    is the true pass@k. It is 1 as soon as ``n - c < k`` (every size-k subset
    contains a correct sample: 1 correct of 4 gives pass@4 = 1), and pass@1 =
    c / n.

    Computation: for ``n <= EXACT_PASS_N`` the ratio is formed exactly from
    integer binomials (``fractions.Fraction``) and rounded once to float; above
    that, the numerically stable product form
    ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (no large binomials, no
    cancellation between huge numbers).

    Raises:
        TypeError / ValueError: non-integers, or not ``0 <= c <= n``, ``1 <= k <= n``.
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    if n <= EXACT_PASS_N:
        return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; ``nan`` for an empty sequence."""
    return float(sum(values) / len(values)) if len(values) else float("nan")


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
    """Benchmark pass@k: the mean over problems of ``pass_at_k(n_i, c_i, k)``."""
    if len(ns) != len(cs):
        raise ValueError(f"mean_pass_at_k: {len(ns)} sample counts but {len(cs)} correct counts")
    return mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)])


# --------------------------------------------------------------------------- majority vote


def _subset_score(counts: dict[Hashable, int], correct: set) -> Fraction:
    """Score of one vote: the winner's correctness, ties shared (expected value of a fair coin)."""
    if not counts:
        return Fraction(0)
    top = max(counts.values())
    tied = [a for a, v in counts.items() if v == top]
    return Fraction(sum(1 for a in tied if a in correct), len(tied))


def maj_at_k(labels: Sequence[Hashable | None], correct_labels: set | frozenset | Sequence[Hashable], k: int, *,
             max_exact_subsets: int = MAJ_EXACT_SUBSETS, resamples: int = MAJ_RESAMPLES,
             seed: int = 0) -> float:
    """Expected majority-vote accuracy of ``k`` samples drawn without replacement from the ``n`` given.

    Definition (self-consistency, Wang et al. 2023, "Self-Consistency Improves
    Chain of Thought Reasoning in Language Models", scored as an expectation
    over subsets in the way pass@k is)::

        maj@k = E_{S ~ uniform size-k subset of the n samples} [ score(S) ]

    where ``score(S)`` takes a vote among the samples of ``S`` that have an
    answer (``labels[i] is not None``; samples without an extracted answer
    abstain), each class of equivalent answers getting one vote per member.

    Ties: when ``t`` classes share the largest vote count, the winner is drawn
    uniformly among them, and the *expected* score ``(#correct among the t) / t``
    is used, so the result does not depend on any ordering of the answers.
    A subset in which every sample abstains scores 0.

    With ``k = 1`` this equals ``c / n`` (pass@1).

    Computation: exact (integer arithmetic over all count vectors, which groups
    the ``C(n, k)`` subsets by how many members of each class they hold) when
    ``C(n, k) <= max_exact_subsets``; otherwise the mean over ``resamples``
    uniform random subsets drawn with ``random.Random(seed)`` (standard error
    at most ``0.5 / sqrt(resamples)``).

    Args:
        labels: the answer class of each sample, ``None`` for no answer.
        correct_labels: the classes whose answer the verifier judged correct.
        k: subset size, ``1 <= k <= n``.
    """
    n = len(labels)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"maj_at_k: k={k!r} must be an integer with 1 <= k <= n={n}")
    correct = set(correct_labels)
    class_sizes: dict[Hashable, int] = {}
    abstain = 0
    for lab in labels:
        if lab is None:
            abstain += 1
        else:
            class_sizes[lab] = class_sizes.get(lab, 0) + 1
    if not any(lab in correct for lab in class_sizes):
        return 0.0
    if math.comb(n, k) <= max_exact_subsets:
        return float(_maj_exact(list(class_sizes.items()), abstain, correct, n, k))
    if resamples < 1:
        raise ValueError(f"maj_at_k: resamples={resamples} must be >= 1")
    rng = random.Random(seed)
    idx = list(range(n))
    total = Fraction(0)
    for _ in range(resamples):
        counts: dict[Hashable, int] = {}
        for i in rng.sample(idx, k):
            lab = labels[i]
            if lab is not None:
                counts[lab] = counts.get(lab, 0) + 1
        total += _subset_score(counts, correct)
    return float(total / resamples)


def _maj_exact(classes: list[tuple[Hashable, int]], abstain: int, correct: set, n: int, k: int) -> Fraction:
    """Sum over count vectors x (sum k) of prod_j C(m_j, x_j) * score(x), divided by C(n, k).

    Dynamic programme over the classes; the state is (samples still to place,
    top vote so far, #classes at the top, #correct classes at the top) and its
    value the number of subsets reaching it. The abstaining samples fill the rest.
    """
    states: dict[tuple[int, int, int, int], int] = {(k, 0, 0, 0): 1}
    for label, size in classes:
        is_correct = label in correct
        nxt: dict[tuple[int, int, int, int], int] = {}
        for (rem, top, ties, cties), ways in states.items():
            for x in range(0, min(size, rem) + 1):
                w = ways * math.comb(size, x)
                if x == 0 or x < top:
                    key = (rem - x, top, ties, cties)
                elif x == top:
                    key = (rem - x, top, ties + 1, cties + int(is_correct))
                else:
                    key = (rem - x, x, 1, int(is_correct))
                nxt[key] = nxt.get(key, 0) + w
        states = nxt
    total = Fraction(0)
    for (rem, top, ties, cties), ways in states.items():
        if rem > abstain:
            continue
        w = ways * math.comb(abstain, rem)
        if w and top > 0 and cties:
            total += Fraction(w * cties, ties)
    return total / math.comb(n, k)


def maj_at_k_bruteforce(labels: Sequence[Hashable | None], correct_labels, k: int) -> float:
    """Reference implementation: enumerate every size-k subset (for tests; exponential)."""
    correct = set(correct_labels)
    n = len(labels)
    total = Fraction(0)
    count = 0
    for subset in combinations(range(n), k):
        counts: dict[Hashable, int] = {}
        for i in subset:
            if labels[i] is not None:
                counts[labels[i]] = counts.get(labels[i], 0) + 1
        total += _subset_score(counts, correct)
        count += 1
    return float(total / count)


def cluster_answers(answers: Sequence[str | None], verdicts: Sequence[bool],
                    equivalent: Callable[[str, str], bool]) -> tuple[list[int | None], set[int]]:
    """Group extracted answers into classes of verified equivalence for majority voting.

    Rules:

    * samples without an answer get label ``None`` (they abstain);
    * every answer the verifier judged correct against the gold joins class 0
      (they are all equivalent to the gold, hence vote together, even when
      written differently: ``1/2``, ``0.5``, ``\\frac{1}{2}``);
    * the remaining answers are grouped by leader clustering: in sample order,
      an answer joins the first class whose leader (first member) it is
      equivalent to, ``equivalent(answer, leader)``; identical strings are
      equivalent without a call. Otherwise it starts a new class.

    Returns:
        ``(labels, correct_labels)`` for :func:`maj_at_k`; ``correct_labels``
        is ``{0}`` when some sample is correct, else empty.
    """
    if len(answers) != len(verdicts):
        raise ValueError(f"cluster_answers: {len(answers)} answers but {len(verdicts)} verdicts")
    labels: list[int | None] = []
    leaders: list[tuple[int, str]] = []  # (label, leader answer) of the wrong-answer classes
    by_string: dict[str, int] = {}
    any_correct = False
    for ans, ok in zip(answers, verdicts):
        if ans is None or (isinstance(ans, str) and not ans.strip()):
            labels.append(None)
            continue
        if ok:
            labels.append(0)
            any_correct = True
            continue
        key = ans.strip()
        if key in by_string:
            labels.append(by_string[key])
            continue
        found = None
        for lab, leader in leaders:
            if equivalent(key, leader):
                found = lab
                break
        if found is None:
            found = len(leaders) + 1
            leaders.append((found, key))
        by_string[key] = found
        labels.append(found)
    return labels, ({0} if any_correct else set())


# --------------------------------------------------------------------------- uncertainty


def wilson_interval(successes: float, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927).

    ``p = s / t``; centre ``(p + z^2 / 2t) / (1 + z^2 / t)``, half-width
    ``z * sqrt(p (1 - p) / t + z^2 / 4t^2) / (1 + z^2 / t)``. Unlike the normal
    approximation it stays inside [0, 1] and is sensible at p = 0 or 1.
    ``z = 1.96`` gives a 95% interval. ``trials = 0`` gives ``(0, 1)``.
    """
    if trials < 0 or successes < 0 or successes > trials:
        raise ValueError(f"wilson_interval: need 0 <= successes={successes} <= trials={trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    z2 = z * z
    denom = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _percentile(sorted_vals: list[float], q: float) -> float:
    """Linear-interpolation percentile of a sorted list, q in [0, 1]."""
    if not sorted_vals:
        return float("nan")
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    frac = pos - lo
    return sorted_vals[lo] * (1 - frac) + sorted_vals[hi] * frac


def _bootstrap_means(values: Sequence[float], resamples: int, seed: int) -> list[float]:
    """Sorted means of ``resamples`` with-replacement resamples (numpy ``default_rng(seed)``)."""
    import numpy as np

    if resamples < 1:
        raise ValueError(f"bootstrap: resamples={resamples} must be >= 1")
    vals = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, 2_000_000 // max(1, len(vals)))  # bound the index matrix's memory
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        idx = rng.integers(0, len(vals), size=(stop - start, len(vals)))
        means[start:stop] = vals[idx].mean(axis=1)
    return sorted(means.tolist())


def bootstrap_ci(values: Sequence[float], *, resamples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem scores (Efron 1979).

    Draws ``resamples`` sets of ``len(values)`` problems with replacement using
    ``numpy.random.default_rng(seed)``, and returns the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` percentiles of their means. This captures the
    problem-sampling noise of a benchmark score, the one that dominates when
    two checkpoints are compared on a few hundred problems.
    """
    if not 0 < level < 1:
        raise ValueError(f"bootstrap_ci: level={level} must be in (0, 1)")
    m = len(values)
    if m == 0:
        return float("nan"), float("nan")
    means = _bootstrap_means(values, resamples, seed)
    alpha = (1 - level) / 2
    return _percentile(means, alpha), _percentile(means, 1 - alpha)


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], *, resamples: int = 2000, seed: int = 0,
                          level: float = 0.95) -> dict[str, float]:
    """Paired bootstrap of ``mean(b) - mean(a)`` over the same problems (b = after, a = before).

    Resamples problem indices jointly, so the shared per-problem difficulty
    cancels and the interval is much tighter than two independent intervals.
    Returns ``diff``, ``lo``, ``hi`` and ``p_le_0``: the share of resampled
    differences ``<= 0`` (a one-sided bootstrap p-value for "b is better").
    """
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap_diff: {len(a)} vs {len(b)} problems; pair the same problems")
    m = len(a)
    if m == 0:
        return {"diff": float("nan"), "lo": float("nan"), "hi": float("nan"), "p_le_0": float("nan")}
    d = [float(y) - float(x) for x, y in zip(a, b)]
    means = _bootstrap_means(d, resamples, seed)
    alpha = (1 - level) / 2
    return {"diff": sum(d) / m, "lo": _percentile(means, alpha), "hi": _percentile(means, 1 - alpha),
            "p_le_0": sum(1 for x in means if x <= 0) / len(means)}


# --------------------------------------------------------------------------- significance, power

EXACT_SIGN_FLIP = 16
"""``paired_permutation_p`` enumerates every sign pattern up to this many non-zero differences."""


def paired_permutation_p(diffs: Sequence[float], *, resamples: int = 10_000, seed: int = 0,
                         exact_max: int = EXACT_SIGN_FLIP) -> float:
    """Two-sided p-value of "mean difference = 0" by the paired sign-flip permutation test.

    ``diffs`` are per-problem paired differences (b - a on the same problem). Under the null hypothesis
    that a and b are exchangeable on every problem, each difference is as likely to have the opposite
    sign; the p-value is the share of sign assignments whose ``|sum|`` is at least the observed
    ``|sum|`` (Fisher 1935; Good, "Permutation Tests", 2000). Zero differences carry no sign and are
    dropped. With at most ``exact_max`` non-zero differences every one of the ``2^k`` assignments is
    enumerated (an exact p-value); beyond, ``resamples`` random assignments from
    ``numpy.random.default_rng(seed)`` give ``(1 + hits) / (1 + resamples)`` (Phipson and Smyth 2010: never
    0, valid at any number of resamples). ``nan`` for no differences; 1.0 when all are zero.
    """
    import numpy as np

    if len(diffs) == 0:
        return float("nan")
    d = np.asarray([float(x) for x in diffs if float(x) != 0.0], dtype=np.float64)
    if len(d) == 0:
        return 1.0
    observed = abs(float(d.sum()))
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # float sums of the same terms in another order
    k = len(d)
    if k <= exact_max:
        signs = 1 - 2 * ((np.arange(2 ** k)[:, None] >> np.arange(k)[None, :]) & 1)
        return float(np.mean(np.abs(signs @ d) >= observed - tol))
    if resamples < 1:
        raise ValueError(f"paired_permutation_p: resamples={resamples} must be >= 1")
    rng = np.random.default_rng(seed)
    hits = 0
    step = max(1, 2_000_000 // k)
    for start in range(0, resamples, step):
        n = min(resamples, start + step) - start
        signs = rng.integers(0, 2, size=(n, k)) * 2 - 1
        hits += int(np.sum(np.abs(signs @ d) >= observed - tol))
    return (1 + hits) / (1 + resamples)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given.

    With the ``m`` p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of the j-th is
    ``max_{i <= j} min(1, (m - i + 1) p_(i))``; a hypothesis is rejected at family-wise error rate
    ``alpha`` when its adjusted value is ``<= alpha``. This controls the family-wise error rate under any
    dependence between the tests and rejects everything Bonferroni rejects (and sometimes more).
    A p-value that could not be computed is passed as 1.0 by the caller (it keeps its place in ``m``).
    """
    ps = [float(p) for p in pvalues]
    for p in ps:
        if not 0.0 <= p <= 1.0:  # also refuses nan
            raise ValueError(f"holm: p-value {p!r} is not in [0, 1]")
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def sample_sd(values: Sequence[float]) -> float:
    """Sample standard deviation (divisor ``n - 1``); ``nan`` below two values."""
    n = len(values)
    if n < 2:
        return float("nan")
    mu = sum(values) / n
    return math.sqrt(sum((float(v) - mu) ** 2 for v in values) / (n - 1))


def min_detectable_diff(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired test at level ``alpha`` detects with probability
    ``power``, given the per-problem paired differences' standard deviation ``sd`` over ``n`` problems:

        MDE = (z_{1 - alpha/2} + z_{power}) * sd / sqrt(n)

    (normal approximation of the paired test's statistic, e.g. Cohen 1988, ch. 2). ``alpha`` = 0.05 and
    ``power`` = 0.8 give ``2.8016 * sd / sqrt(n)``. A test that finds nothing rules out, at that power,
    differences larger than this. ``nan`` when ``n < 2`` or ``sd`` is nan.
    """
    from statistics import NormalDist

    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"min_detectable_diff: alpha={alpha} and power={power} must be in (0, 1)")
    if n < 2 or sd != sd:
        return float("nan")
    if sd < 0:
        raise ValueError(f"min_detectable_diff: sd={sd} must be >= 0")
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd / math.sqrt(n)
