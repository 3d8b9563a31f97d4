"""Settings follow the chosen method's paper (issue 41, point 4): ``algo.clip_low``, ``algo.clip_high`` and
``algo.loss_agg`` default to ``auto``, which resolves to the policy loss's (and Dr. GRPO's) published values;
an explicit value wins and one that differs from the paper in a way that changes the update is warned about;
``algo.std_normalize`` with an estimator that ignores it is refused; the staleness warning says what the clip
can and cannot correct. Each resolution is checked against the numbers printed in the papers."""

from __future__ import annotations

import inspect

import pytest

from mathrl.ablate.driver import config_differences
from mathrl.algo import losses as L
from mathrl.config import ConfigError, auto, load_config, rules
from mathrl.registry import POLICY_LOSSES


@pytest.mark.parametrize("overrides, clip_low, clip_high, agg", [
    ([], 0.2, 0.2, "token-mean"),                                                      # PPO / DAPO token-mean
    (["algo.policy_loss=gspo"], 3e-4, 4e-4, "seq-mean-token-mean"),                    # GSPO sec. 5.1
    (["algo.policy_loss=cispo"], 1.0, 0.28, "token-mean"),                             # MiniMax-M1: no lower bound
    (["algo.advantage=dr_grpo"], 0.2, 0.2, "seq-mean-token-sum-norm"),                 # Dr. GRPO
    (["algo.advantage=dr_grpo", "algo.policy_loss=gspo"], 3e-4, 4e-4, "seq-mean-token-sum-norm"),
    (["algo.policy_loss=gspo", "algo.clip_low=0.001", "algo.loss_agg=token-mean"], 0.001, 4e-4, "token-mean"),
    (["algo.policy_loss=cispo", "algo.clip_low=0.5"], 0.5, 0.28, "token-mean"),
])
def test_auto_resolves_to_the_papers_values_and_an_explicit_value_wins(overrides, clip_low, clip_high, agg):
    cfg = load_config(None, overrides)
    assert (cfg.clip_low, cfg.clip_high, cfg.loss_agg) == (clip_low, clip_high, agg)
    r = auto.resolve(cfg, auto.Machine(cuda=False, native_bf16=False))
    assert (r.clip_low, r.clip_high, r.loss_agg) == (clip_low, clip_high, agg)
    decided = r.changed(cfg)  # what the trainer prints and the run folder records as given -> used
    for key, value in (("algo.clip_low", clip_low), ("algo.clip_high", clip_high), ("algo.loss_agg", agg)):
        assert (decided.get(key) == value) == (getattr(cfg.algo, key.split(".")[1]) == "auto"), key


def test_the_registered_settings_are_the_loss_functions_own_defaults():
    for name, fn in POLICY_LOSSES.items():
        params = inspect.signature(fn).parameters
        got = {k: params[k if k != "loss_agg" else "agg"].default for k in ("clip_low", "clip_high", "loss_agg")}
        assert got == POLICY_LOSSES.meta(name)["settings"], name


def test_cispo_without_a_lower_bound_keeps_every_small_ratio():
    """clip_low = 1.0 (CISPO's auto) lets the importance weight fall to 0: a ratio of 0.1 keeps its weight 0.1
    (PPO's 0.8 floor would lift it to 0.8), and the lower clip fraction is 0."""
    import torch

    logp = torch.log(torch.tensor([[0.1, 1.5]], dtype=torch.float64)).requires_grad_()
    old = torch.zeros_like(logp)
    adv, m = torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.ones_like(logp)
    loss, st = L.cispo_loss(logp, old, adv, m)  # the defaults: clip_low 1.0, clip_high 0.28
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.1 / 2, -1.28 / 2]], dtype=torch.float64))
    assert float(st["clipfrac_low"]) == 0 and float(st["clipfrac_high"]) == 0.5
    logp.grad = None
    L.cispo_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.28)[0].backward()  # the old default floor
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.8 / 2, -1.28 / 2]], dtype=torch.float64))


@pytest.mark.parametrize("overrides, fragment", [
    (["algo.policy_loss=gspo", "algo.clip_low=0.2", "algo.clip_high=0.2"], "almost never binds"),
    (["algo.policy_loss=gspo", "algo.loss_agg=token-mean"], "weights responses by their length"),
    (["algo.advantage=dr_grpo", "algo.loss_agg=token-mean"], "aggregates with seq-mean-token-sum-norm"),
])
def test_settings_off_the_paper_are_warned_about(overrides, fragment):
    msgs = rules.off_paper_settings(load_config(None, overrides))
    assert len(msgs) == 1 and fragment in msgs[0] and "auto" in msgs[0], msgs
    assert any(fragment in m for m in rules.warnings(load_config(None, overrides), rl=True))


@pytest.mark.parametrize("overrides", [
    [], ["algo.policy_loss=gspo"], ["algo.policy_loss=cispo"], ["algo.advantage=dr_grpo"],
    ["algo.policy_loss=gspo", "algo.clip_low=0.0003", "algo.clip_high=0.0004", "algo.loss_agg=seq-mean-token-mean"],
    ["algo.advantage=dr_grpo", "algo.loss_agg=seq-mean-token-sum-norm"],
])
def test_the_papers_settings_are_not_warned_about(overrides):
    assert rules.off_paper_settings(load_config(None, overrides)) == []


@pytest.mark.parametrize("advantage", ["rloo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline"])
@pytest.mark.parametrize("value", ["false", "batch", "group"])
def test_std_normalize_with_an_estimator_that_ignores_it_is_refused(advantage, value):
    with pytest.raises(ConfigError, match=rf"algo.std_normalize = .* with algo.advantage resolving to '{advantage}': "
                                          r"only grpo reads"):
        load_config(None, [f"algo.advantage={advantage}", f"algo.std_normalize={value}"])


@pytest.mark.parametrize("value, want", [("true", True), ("false", False), ("group", "group"), ("batch", "batch")])
def test_std_normalize_takes_group_and_batch(value, want):
    assert load_config(None, [f"algo.std_normalize={value}"]).algo.std_normalize == want
    with pytest.raises(ConfigError, match="algo.std_normalize"):
        load_config(None, ["algo.std_normalize=global"])


def test_the_staleness_warning_says_the_clip_cannot_correct_it():
    msgs = rules.warnings(load_config(None, ["rollout.staleness=1"]), rl=True)
    (msg,) = [m for m in msgs if m.startswith("rollout.staleness")]
    assert "exactly 1" in msg and "never sees the staleness" in msg and "algo.tis_cap" in msg
    assert "beyond the PPO clip" not in msg
    assert not [m for m in rules.warnings(load_config(None, ["rollout.staleness=1", "algo.tis_cap=2"]), rl=True)
                if m.startswith("rollout.staleness")]


def test_a_finished_run_recorded_with_the_value_auto_now_gives_is_the_same_run():
    """The ablation driver compares a finished run's recorded config with the study's: a PPO run recorded with
    clip 0.2 and token-mean (the old defaults) is the same run as auto; a GSPO run recorded with 0.2 is not."""
    recorded = load_config(None, ["algo.clip_low=0.2", "algo.clip_high=0.2", "algo.loss_agg=token-mean"]).to_dict()
    assert config_differences(recorded, load_config(None, [])) == []
    gspo_rec = load_config(None, ["algo.policy_loss=gspo", "algo.clip_low=0.2", "algo.clip_high=0.2",
                                  "algo.loss_agg=token-mean"]).to_dict()
    assert config_differences(gspo_rec, load_config(None, ["algo.policy_loss=gspo"])) == [
        "algo.clip_high", "algo.clip_low", "algo.loss_agg"]
