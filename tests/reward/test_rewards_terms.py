"""Reward-term registry: terms take one RewardContext, compute_rewards sums weighted terms, the config's
reward.terms is checked against the registry, and the old shorthands give bitwise the same rewards."""

from __future__ import annotations

import json

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.reward import Grade
from mathrl.reward.rewards import (
    REWARDS,
    RewardContext,
    check_reward_terms,
    compute_rewards,
    get_reward,
    register_reward,
    reward_terms,
)

G = [Grade(True, "1", "ok"), Grade(False, "2", "mismatch"), Grade(False, None, "timeout"), Grade(True, "4", "ok")]
R = ["so \\boxed{1}", "the answer is \\boxed{2}", "x" * 50, "\\boxed{4}"]
CTX = RewardContext(responses=R, grades=G, truncated=[False, False, False, True], lengths=[10, 85, 100, 120],
                    max_length=100, golds=["1", "3", "5", "4"])


def test_terms_hand_computed_on_a_context():
    assert get_reward("correctness")(CTX) == [1.0, 0.0, 0.0, 1.0]
    assert get_reward("correctness")(CTX, correct=2.0, wrong=-1.0) == [2.0, -1.0, -1.0, 2.0]
    # boxed and not truncated: responses 0 and 1 (3 is boxed but was cut)
    assert get_reward("format")(CTX, bonus=0.25) == [0.25, 0.25, 0.0, 0.0]
    # L = 100, B = 20: n = 10 -> 0; n = 85 -> -0.4 * 5 / 20 = -0.1; n = 100 -> -0.4; cut / n > L -> -0.4
    assert get_reward("length")(CTX, coef=0.4, buffer=20) == [0.0, -0.4 * 5 / 20, -0.4, -0.4]
    # default buffer = L // 4 = 25: n = 85 -> -0.5 * 10 / 25
    assert get_reward("length")(CTX) == [0.0, -0.5 * 10 / 25, -0.5, -0.5]


def test_compute_rewards_weights_and_sums():
    out = compute_rewards({"correctness": {"weight": 2.0}, "format": {"bonus": 0.5, "weight": -1.0},
                           "length": {"coef": 0.4, "buffer": 20}}, CTX)
    assert out == [2.0 - 0.5, 0.0 - 0.5 - 0.1, 0.0 - 0.4, 2.0 - 0.4]
    assert compute_rewards(["correctness"], CTX) == [1.0, 0.0, 0.0, 1.0]
    assert compute_rewards({"correctness": None}, CTX) == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(KeyError, match="allowed"):
        compute_rewards({"nope": {}}, CTX)
    with pytest.raises(TypeError):
        compute_rewards({"correctness": {}}, CTX, R)


def test_length_needs_lengths_and_limit():
    with pytest.raises(ValueError, match="lengths and max_length"):
        get_reward("length")(RewardContext(responses=R, grades=G))


# ----------------------------------------------------------------------------- config shorthands


@pytest.mark.parametrize("overrides, expected", [
    ([], {"correctness": {}}),
    (["reward.function=correctness_format", "reward.format_bonus=0.2"],
     {"correctness": {}, "format": {"bonus": 0.2}}),
    (["reward.overlong_penalty=0.3"], {"correctness": {}, "length": {"coef": 0.3, "buffer": None}}),
    (["reward.function=correctness_format", "reward.format_bonus=0.1", "reward.overlong_penalty=0.7",
      "reward.overlong_buffer=16"],
     {"correctness": {}, "format": {"bonus": 0.1}, "length": {"coef": 0.7, "buffer": 16}}),
])
def test_shorthands_give_the_terms_and_rewards_of_before(overrides, expected):
    cfg = load_config(None, ["rollout.max_tokens=100", *overrides])
    terms = reward_terms(cfg)
    assert terms == expected
    # bitwise the same as summing the terms by hand
    ctx = RewardContext(responses=R, grades=G, truncated=CTX.truncated, lengths=CTX.lengths,
                        max_length=cfg.rollout.max_tokens, golds=CTX.golds)
    by_hand = [0.0] * len(R)
    for name, params in expected.items():
        by_hand = [a + b for a, b in zip(by_hand, get_reward(name)(ctx, **params))]
    before = compute_rewards(terms, ctx)
    assert before == by_hand
    # and the same as the explicit reward.terms mapping
    explicit = load_config(None, ["rollout.max_tokens=100", f"reward.terms={json.dumps(expected)}"])
    assert compute_rewards(reward_terms(explicit), ctx) == before


def test_terms_from_yaml(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("reward:\n  terms:\n    correctness:\n    format: {bonus: 0.3, weight: 2}\n")
    cfg = load_config(f)
    assert reward_terms(cfg) == {"correctness": {}, "format": {"bonus": 0.3, "weight": 2}}
    assert compute_rewards(reward_terms(cfg), CTX) == [1.6, 0.6, 0.0, 1.0]
    f.write_text("reward:\n  terms:\n    correctness: {}\n    fromat: {bonus: 0.3}\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    msg = str(info.value)
    assert "reward.terms.fromat" in msg and "r.yaml:2" in msg and "unknown reward term" in msg
    assert "allowed:" in msg and "\n" not in msg
    f.write_text("reward:\n  terms:\n    format: {bonsu: 0.3}\n")
    with pytest.raises(ConfigError, match=r"reward.terms.format.bonsu \(.*r.yaml:2\): unknown parameter of "
                                          r"reward term 'format'; allowed: weight, bonus"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"reward.terms.length.weight \(command line\): weight 'heavy'"):
        load_config(None, ["reward.terms={length: {weight: heavy}}"])
    with pytest.raises(ConfigError, match=r"reward.terms.length.buffer \(command line\): 'None' is not an "
                                          r"integer or null"):
        load_config(None, ["reward.terms={'length': {'buffer': 'None'}}"])


def test_terms_and_shorthands_do_not_mix():
    with pytest.raises(ConfigError, match="reward.terms is set together with the shorthand reward.function"):
        load_config(None, ["reward.terms={correctness: {}}", "reward.function=correctness_format"])


# ----------------------------------------------------------------------------- adding a term


@pytest.fixture
def toy_term():
    @register_reward("toy_golds")
    def toy_golds(ctx: RewardContext, *, per_char: float = 1.0) -> list[float]:
        """Toy: per_char times the gold answer's length."""
        return [per_char * len(g) for g in ctx.golds]

    yield toy_golds
    REWARDS.pop("toy_golds")


def test_a_registered_term_is_usable_from_yaml(toy_term, tmp_path):
    f = tmp_path / "toy.yaml"
    f.write_text("reward:\n  terms:\n    correctness: {}\n    toy_golds: {per_char: 0.5, weight: 2.0}\n")
    cfg = load_config(f)
    ctx = RewardContext(responses=["a", "b"], grades=G[:2], golds=["12", "3456"])
    assert compute_rewards(reward_terms(cfg), ctx) == [1.0 + 2.0, 0.0 + 4.0]
    from mathrl.config import help_text

    assert "toy_golds" in help_text() and "per_char" in help_text()
    with pytest.raises(ConfigError, match="toy_golds.per_word.*allowed: weight, per_char"):
        load_config(None, ["reward.terms={toy_golds: {per_word: 1}}"])


def test_check_reward_terms_errors_name_the_key():
    with pytest.raises(ValueError) as info:
        check_reward_terms({"correctness": {"correct": 1}, "length": {"cof": 1}})
    assert info.value.key == "length.cof"
    with pytest.raises(ValueError, match="must be a mapping"):
        check_reward_terms({"correctness": 3})
    with pytest.raises(ValueError, match="already registered"):
        register_reward("correctness")(lambda ctx: [])
