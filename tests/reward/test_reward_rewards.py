from __future__ import annotations

import pytest

from mathrl.reward import Grade, compute_rewards, get_reward

G = [Grade(True, "1", "ok"), Grade(False, "2", "mismatch"), Grade(False, None, "timeout")]
R = ["so \\boxed{1}", "the answer is 2", "x" * 50]


def test_correctness():
    assert get_reward("correctness")(G, R) == [1.0, 0.0, 0.0]
    assert get_reward("correctness")(G, R, correct=1.0, wrong=-1.0) == [1.0, -1.0, -1.0]


def test_format():
    assert get_reward("format")(G, R, bonus=0.1) == [0.1, 0.0, 0.0]
    assert get_reward("format")(G, R, bonus=0.1, truncated=[True, False, False]) == [0.0, 0.0, 0.0]
    early_box = ["\\boxed{1}" + " more words" * 100]
    assert get_reward("format")(G[:1], early_box) == [0.0]


def test_length_penalty_hand_computed():
    # L = 100, B = 20: n <= 80 -> 0; n = 90 -> -0.5 * 10 / 20 = -0.25; n = 100 -> -0.5; cut -> -0.5
    f = get_reward("length")
    assert f(G * 2, R * 2, lengths=[50, 80, 90, 100, 101, 10], max_length=100, buffer=20,
             truncated=[False, False, False, False, False, True]) == [0.0, 0.0, -0.25, -0.5, -0.5, -0.5]


def test_compute_rewards_sums_terms():
    out = compute_rewards({"correctness": {}, "format": {"bonus": 0.5}}, G, R)
    assert out == [1.5, 0.0, 0.0]
    assert compute_rewards(["correctness"], G, R) == [1.0, 0.0, 0.0]
    with pytest.raises(KeyError, match="allowed"):
        compute_rewards(["nope"], G, R)
