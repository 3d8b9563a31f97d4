from __future__ import annotations

import pytest

from mathrl.reward import Grade, compute_rewards, get_reward
from mathrl.reward.rewards import REWARDS, RewardContext, needs_grades, register_reward

G = [Grade(True, "1", "ok"), Grade(False, "2", "mismatch"), Grade(False, None, "timeout")]
R = ["so \\boxed{1}", "the answer is 2", "x" * 50]
CTX = RewardContext(responses=R, grades=G)


def test_correctness():
    assert get_reward("correctness")(CTX) == [1.0, 0.0, 0.0]
    assert get_reward("correctness")(CTX, correct=1.0, wrong=-1.0) == [1.0, -1.0, -1.0]


def test_format():
    assert get_reward("format")(CTX, bonus=0.1) == [0.1, 0.0, 0.0]
    cut = RewardContext(responses=R, grades=G, truncated=[True, False, False])
    assert get_reward("format")(cut, bonus=0.1) == [0.0, 0.0, 0.0]
    early_box = RewardContext(responses=["\\boxed{1}" + " more words" * 100], grades=G[:1])
    assert get_reward("format")(early_box) == [0.0]


def test_length_penalty_hand_computed():
    # L = 100, B = 20: n <= 80 -> 0; n = 90 -> -0.5 * 10 / 20 = -0.25; n = 100 -> -0.5; cut -> -0.5
    ctx = RewardContext(responses=R * 2, grades=G * 2, lengths=[50, 80, 90, 100, 101, 10], max_length=100,
                        truncated=[False, False, False, False, False, True])
    assert get_reward("length")(ctx, buffer=20) == [0.0, 0.0, -0.25, -0.5, -0.5, -0.5]


def test_compute_rewards_sums_terms():
    out = compute_rewards({"correctness": {}, "format": {"bonus": 0.5}}, CTX)
    assert out == [1.5, 0.0, 0.0]
    assert compute_rewards(["correctness"], CTX) == [1.0, 0.0, 0.0]
    with pytest.raises(KeyError, match="allowed"):
        compute_rewards(["nope"], CTX)


def test_terms_take_one_context_record():
    """One call form: term(ctx, **params). The grades/responses positional form is refused, so a caller
    cannot silently pass arguments a term ignores."""
    with pytest.raises(TypeError):
        get_reward("correctness")(G, R)
    with pytest.raises(TypeError, match="RewardContext"):
        get_reward("correctness")(G)
    with pytest.raises(TypeError, match="RewardContext"):
        compute_rewards(["correctness"], G)


def test_a_custom_term_without_grades():
    """A custom task's reward registers with needs_grades=False: it scores a context without grades, and
    needs_grades() tells the loop to skip the verifier only when no configured term reads grades."""
    name = "test_starts_with_gold"
    if name not in REWARDS:
        register_reward(name, needs_grades=False)(
            lambda ctx: [float(r.startswith(g)) for r, g in zip(ctx.responses, ctx.golds)])
    ctx = RewardContext(responses=["7 apples", "8", "x7"], grades=None, golds=["7", "7", "7"])
    assert compute_rewards({name: {"weight": 2.0}}, ctx) == [2.0, 0.0, 0.0]
    assert needs_grades({name: {}}) is False
    assert needs_grades({name: {}, "correctness": {}}) is True
    assert needs_grades(["format"]) is True
    # a term that reads grades refuses a context without them (no silent zero rewards)
    with pytest.raises(ValueError, match="needs the verifier"):
        compute_rewards({name: {}, "correctness": {}}, ctx)
