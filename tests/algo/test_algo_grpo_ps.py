"""GRPO with process supervision (issue 41, point 2): the registered ``grpo_ps`` estimator by hand, its
outcome mixing, its equality with GRPO when every response is one step rewarded by its score, and the config
rules around it (model.prm, algo.ps_outcome_weight, the KL's place)."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.advantages import ESTIMATORS, estimate_advantages, estimator_params, grpo, broadcast_to_tokens
from mathrl.algo.process import StepRewards
from mathrl.config import ConfigError, load_config, rules


def _hand_batch():
    """One group of two responses: response 0 has 3 tokens and two steps (rewards 1.0 through token 0, 0.0 through
    token 2), response 1 has 2 tokens and one step (0.5 through token 1). Group step rewards {1, 0, 0.5}: mean
    0.5, unbiased std 0.5, so normalised 1, -1, 0."""
    steps = StepRewards(rewards=torch.tensor([[1.0, 0.0], [0.5, 0.0]]), ends=torch.tensor([[0, 2], [1, 0]]),
                        mask=torch.tensor([[True, True], [True, False]]))
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return steps, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask


def test_grpo_ps_by_hand():
    steps, scores, group, mask = _hand_batch()
    adv, ret = estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 0.0}, steps=steps)
    assert ret is None
    # token 0 of response 0: steps ending at or after it: 1 + (-1) = 0; tokens 1, 2: -1; response 1: 0, 0
    torch.testing.assert_close(adv, torch.tensor([[0.0, -1.0, -1.0], [0.0, 0.0, 0.0]]), atol=1e-5, rtol=0)


def test_grpo_ps_mixes_the_outcome_advantage_by_its_weight():
    steps, scores, group, mask = _hand_batch()
    a = 1 / math.sqrt(2)  # GRPO of scores (1, 0): mean 0.5, unbiased std sqrt(0.5)
    adv, _ = estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 0.5}, steps=steps)
    want = torch.tensor([[0.5 * a, -1 + 0.5 * a, -1 + 0.5 * a], [-0.5 * a, -0.5 * a, 0.0]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_one_step_per_response_rewarded_by_its_score_is_grpo():
    """The outcome-supervision special case: a response is one step whose reward is the verifier's score, credited
    through its last token, so the process advantage is GRPO's, on every token."""
    g = torch.Generator().manual_seed(3)
    N, T = 12, 7
    scores = torch.randint(0, 2, (N,), generator=g).float() + 0.1 * torch.rand(N, generator=g)
    group = torch.arange(N) // 4
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    steps = StepRewards(rewards=scores[:, None], ends=(lengths - 1)[:, None], mask=torch.ones(N, 1, dtype=torch.bool))
    ps, _ = estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 0.0}, steps=steps)
    os_, _ = estimate_advantages("grpo", scores, group, mask, params={"std_normalize": True})
    torch.testing.assert_close(ps, os_, atol=1e-6, rtol=0)
    # the negative control: crediting the step through the first token instead leaves later tokens at 0
    early = StepRewards(rewards=steps.rewards, ends=torch.zeros(N, 1, dtype=torch.long), mask=steps.mask)
    bad, _ = estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 0.0}, steps=early)
    assert not torch.allclose(bad, os_, atol=1e-3)
    # and the weight mixes exactly GRPO's advantage in
    mixed, _ = estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 2.0}, steps=steps)
    torch.testing.assert_close(mixed, ps + 2.0 * broadcast_to_tokens(grpo(scores, group), mask), atol=1e-6, rtol=0)


def test_grpo_ps_needs_steps_and_takes_no_kl_in_the_reward():
    steps, scores, group, mask = _hand_batch()
    with pytest.raises(ValueError, match="needs process rewards"):
        estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 0.0})
    with pytest.raises(ValueError, match="KL in the loss"):
        estimate_advantages("grpo_ps", scores, group, mask, params={"ps_outcome_weight": 0.0}, steps=steps,
                            kl_tokens=torch.ones(2, 3), kl_coef=0.1)
    spec = ESTIMATORS["grpo_ps"]
    assert spec.min_group == 2 and spec.params == ("ps_outcome_weight",)
    assert estimator_params("grpo_ps", load_config().algo) == {"ps_outcome_weight": 0.0}


@pytest.fixture
def prm_dir(tmp_path):
    d = tmp_path / "prm"
    d.mkdir()
    (d / "backbone.safetensors").write_bytes(b"")  # the folder check only; nothing is loaded by config rules
    return d


def test_the_config_rules_around_process_supervision(prm_dir, tmp_path):
    with pytest.raises(ConfigError, match="model.prm is not set; train one"):
        rules.refuse(load_config(None, ["algo.advantage=grpo_ps"]))
    with pytest.raises(ConfigError, match=r"model.prm = .* with algo.advantage resolving to 'grpo': only grpo_ps"):
        rules.refuse(load_config(None, [f"model.prm={prm_dir}"]))
    rules.refuse(load_config(None, ["algo.advantage=grpo_ps", f"model.prm={tmp_path}"]))  # the folder: preflight's
    with pytest.raises(ConfigError, match="algo.kl_in = reward with algo.advantage = 'grpo_ps'"):
        rules.refuse(load_config(None, ["algo.advantage=grpo_ps", f"model.prm={prm_dir}", "algo.kl_in=reward"]))
    with pytest.raises(ConfigError, match="algo.ps_outcome_weight = 0.5 with algo.advantage resolving to 'grpo'"):
        rules.refuse(load_config(None, ["algo.ps_outcome_weight=0.5"]))
    ok = load_config(None, ["algo.advantage=grpo_ps", f"model.prm={prm_dir}", "algo.ps_outcome_weight=0.5"])
    rules.refuse(ok)
    assert ok.kl_in == "loss" and ok.loss_agg == "token-mean"
