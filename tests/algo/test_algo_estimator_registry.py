"""The advantage-estimator registry is the single source of truth: estimate_advantages (the trainer's
one entry point) reproduces the direct calls bitwise, and an estimator registered in one place is
accepted by config validation, follows its own min_group / level rules and is listed by --help."""

from __future__ import annotations

import pytest
import torch

from mathrl.algo import advantages as A
from mathrl.algo.advantages import (
    ESTIMATORS,
    estimate_advantages,
    estimator_params,
    get_estimator_spec,
    register_estimator,
)
from mathrl.algo.process import StepRewards
from mathrl.config import ConfigError, help_text, load_config

N, T = 8, 6


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 2, (N,), generator=g).float() + 0.1 * torch.rand(N, generator=g)
    group = torch.tensor([3, 3, 3, 3, 7, 7, 7, 7])
    lengths = torch.tensor([6, 3, 1, 5, 2, 6, 4, 1])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    kl = torch.rand(N, T, generator=g)
    kl[~mask] = 1e6  # padding must not matter
    values = torch.randn(N, T, generator=g)
    return scores, group, mask, kl, values


def _direct(name, cfg, scores, group, mask, kl, values, reduce):
    """The trainer's if/else chain as it was before the registry (mathrl/train/loop.py compute_advantages),
    calling the estimator functions directly."""
    kl_coef = cfg.algo.kl_coef if cfg.kl_in == "reward" else 0.0
    if name in ("grpo", "dr_grpo", "rloo"):
        if kl is not None and kl_coef:
            scores = A.sequence_kl_scores(scores, kl, mask, kl_coef)
        if name == "grpo":
            seq = A.grpo(scores, group, std_normalize=cfg.algo.std_normalize)
        else:
            seq = {"dr_grpo": A.dr_grpo, "rloo": A.rloo}[name](scores, group)
        return A.broadcast_to_tokens(seq, mask), None
    if name == "reinforce_pp_baseline":  # the score minus its group's mean, then REINFORCE++
        centred = torch.stack([scores[i] - scores[group == group[i]].mean() for i in range(len(scores))])
        rewards = A.token_level_rewards(centred, mask, kl=kl, kl_coef=kl_coef)
        return A.reinforce_pp(rewards, mask, gamma=cfg.algo.gamma, reduce=reduce), None
    rewards = A.token_level_rewards(scores, mask, kl=kl, kl_coef=kl_coef)
    if name == "reinforce_pp":
        return A.reinforce_pp(rewards, mask, gamma=cfg.algo.gamma, reduce=reduce), None
    adv, returns = A.gae(rewards, values, mask, gamma=cfg.algo.gamma, lam=cfg.algo.lam)
    return A.masked_whiten(adv, mask, reduce=reduce), returns


def _sum_of_two_equal_ranks(t: torch.Tensor) -> torch.Tensor:
    return t + t  # what all_reduce(SUM) gives when a second rank holds the same batch


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"])
@pytest.mark.parametrize("extra", [
    [],
    ["algo.kl_in=reward", "algo.kl_coef=0.3"],
    ["algo.kl_in=loss", "algo.kl_coef=0.3"],
    ["algo.kl_in=reward", "algo.kl_coef=0", "algo.std_normalize=false", "algo.gamma=0.9", "algo.lam=0.7"],
])
@pytest.mark.parametrize("reduce", [None, _sum_of_two_equal_ranks])
def test_estimate_advantages_is_bitwise_the_direct_call(name, extra, reduce):
    if name != "grpo":  # only grpo reads algo.std_normalize (another estimator refuses it)
        extra = [e for e in extra if not e.startswith("algo.std_normalize")]
    cfg = load_config(None, [f"algo.advantage={name}", "rollout.n=4", *extra])
    scores, group, mask, kl, values = _batch()
    kl_coef = cfg.algo.kl_coef if cfg.kl_in == "reward" else 0.0
    want_adv, want_ret = _direct(name, cfg, scores, group, mask, kl, values, reduce)
    got_adv, got_ret = estimate_advantages(name, scores, group, mask, params=estimator_params(name, cfg.algo),
                                           kl_tokens=kl, kl_coef=kl_coef, values=values, reduce=reduce)
    assert torch.equal(got_adv, want_adv)
    assert got_adv.dtype == want_adv.dtype
    if want_ret is None:
        assert got_ret is None
    else:
        assert torch.equal(got_ret, want_ret)


def test_every_registered_estimator_runs_through_the_entry_point():
    scores, group, mask, kl, values = _batch(1)
    cfg = load_config(None, ["rollout.n=4"])
    last = mask.long().cumsum(1).argmax(1)  # one step per response, its reward the score
    steps = StepRewards(rewards=scores[:, None], ends=last[:, None], mask=torch.ones(N, 1, dtype=torch.bool))
    for name, spec in ESTIMATORS.items():
        step = spec.level == "step"  # the process estimator takes the KL in the loss
        adv, ret = estimate_advantages(name, scores, group, mask, params=estimator_params(name, cfg.algo),
                                       kl_tokens=None if step else kl, kl_coef=0.1, values=values,
                                       steps=steps if step else None)
        assert adv.shape == (N, T) and torch.isfinite(adv).all(), name
        assert (adv[~mask] == 0).all(), name
        assert (ret is not None) == spec.needs_critic, name
        assert set(estimator_params(name, cfg.algo)) == set(spec.params)
        assert spec.doc and spec.min_group >= 1
        assert spec.level in ("sequence", "token", "step")
        assert A.get_advantage_estimator(name) is spec.fn


def test_a_critic_estimator_without_values_is_refused():
    scores, group, mask, _, _ = _batch()
    critic = next(n for n, s in ESTIMATORS.items() if s.needs_critic)
    with pytest.raises(ValueError, match="needs a critic"):
        estimate_advantages(critic, scores, group, mask, params=estimator_params(critic, load_config().algo))
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'; allowed:"):
        estimate_advantages("nope", scores, group, mask, params={})


# ----------------------------------------------------------------------------- adding an estimator


@pytest.fixture
def toy_estimators():
    """Two throwaway estimators registered for one test and removed afterwards."""

    @register_estimator("toy_trio", level="sequence", min_group=3, params=("gamma",))
    def toy_trio(scores, group_index, *, gamma):
        """Toy: the score times algo.gamma."""
        return scores * gamma

    @register_estimator("toy_tokens", level="token")
    def toy_tokens(token_rewards, mask, *, reduce=None):
        """Toy: the per-token rewards themselves."""
        return token_rewards

    yield
    for name in ("toy_trio", "toy_tokens"):
        ESTIMATORS.pop(name, None)


def test_a_registered_estimator_is_usable_from_the_config(toy_estimators, tmp_path):
    # config validation accepts it (YAML and command line) and reads its params from algo.*
    f = tmp_path / "toy.yaml"
    f.write_text("algo:\n  advantage: toy_trio\n  gamma: 0.5\nrollout:\n  n: 3\n")
    cfg = load_config(f)
    assert cfg.advantage == "toy_trio" and estimator_params("toy_trio", cfg.algo) == {"gamma": 0.5}
    scores, group, mask, kl, _ = _batch()
    adv, ret = estimate_advantages("toy_trio", scores, group, mask, params={"gamma": 0.5})
    assert ret is None and torch.equal(adv, A.broadcast_to_tokens(scores * 0.5, mask))
    # the G >= min_group rule follows the estimator's own min_group (3 here, not the usual 2)
    with pytest.raises(ConfigError, match=r"rollout.n = 2: the 'toy_trio' advantage .* rollout.n >= 3") as info:
        load_config(None, ["algo.advantage=toy_trio", "rollout.n=2"])
    assert "\n" not in str(info.value)
    # kl_in=auto follows the level: loss for a sequence-level one, reward for a token-level one
    assert cfg.kl_in == "loss" and cfg.kl_estimator == "k3"
    tok = load_config(None, ["algo.advantage=toy_tokens", "rollout.n=1"])
    assert tok.kl_in == "reward" and tok.kl_estimator == "k1"
    adv, _ = estimate_advantages("toy_tokens", scores, group, mask, params={}, kl_tokens=kl, kl_coef=0.2)
    assert torch.equal(adv, A.token_level_rewards(scores, mask, kl=kl, kl_coef=0.2))
    # --help lists it, in the field's allowed values and in the estimator list with its doc line
    text = help_text()
    assert "'toy_trio'" in text and "Toy: the score times algo.gamma." in text
    from mathrl.cli import train_parser

    assert "toy_tokens" in train_parser().format_help()


def test_an_unregistered_name_is_refused_with_the_allowed_values(toy_estimators):
    ESTIMATORS.pop("toy_trio")
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algo.advantage=toy_trio"])
    msg = str(info.value)
    assert "algo.advantage = 'toy_trio' (command line)" in msg and "\n" not in msg
    for name in ESTIMATORS:
        assert repr(name) in msg


def test_estimator_params_must_be_algo_fields(toy_estimators):
    register_estimator("toy_badparam", level="sequence", params=("no_such_field",))(lambda s, g, **kw: s)
    try:
        with pytest.raises(ConfigError, match="no_such_field"):
            load_config(None, ["algo.advantage=toy_badparam"])
    finally:
        ESTIMATORS.pop("toy_badparam")


def test_registration_rules():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator(next(iter(ESTIMATORS)), level="sequence")
    with pytest.raises(ValueError, match="must be token level"):
        register_estimator("toy_x", level="sequence", needs_critic=True)
    with pytest.raises(ValueError, match="level must be"):
        register_estimator("toy_x", level="episode")
    assert "toy_x" not in ESTIMATORS
    with pytest.raises(ValueError, match="allowed"):
        get_estimator_spec("toy_x")
