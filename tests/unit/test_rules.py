"""mathrl/config/rules.py: the one module of rules about combinations of settings. Each rule refuses (or
warns) with the key, the value and the fix, and the trainer's start-up, the RL method and the ablation
driver reach these rules through it (a rule written back into setup.py, loop.py or ablate/methods.py would
leave these tests passing but the grep below failing)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mathrl.config import ConfigError, load_config, rules

PKG = Path(__file__).resolve().parents[2] / "mathrl"


def test_training_refuses_a_batch_the_world_cannot_split_and_float16():
    cfg = load_config(None, ["train.batch_size=6", "rollout.n=2"])
    rules.refuse_for_training(cfg, 3)
    with pytest.raises(ConfigError, match=r"train.batch_size = 6 and train.mini_batch_size = 6 must be divisible "
                                          r"by the number of processes \(4\)"):
        rules.refuse_for_training(cfg, 4)
    with pytest.raises(ConfigError, match=r"model.dtype = 'float16': .*use model.dtype=bfloat16"):
        rules.refuse_for_training(load_config(None, ["model.dtype=float16"]), 1)
    rules.refuse_for_training(load_config(None, ["model.dtype=auto"]), 1)  # auto never means float16


def test_an_sft_method_refuses_asynchronous_rollout():
    cfg = load_config(None, ["rollout.staleness=1", "algo.tis_cap=2.0"])
    rules.refuse_for_method(cfg, "grpo", sft=False)
    with pytest.raises(ConfigError, match=r"rollout.staleness = 1 with method rft: .*set rollout.staleness=0"):
        rules.refuse_for_method(cfg, "rft", sft=True)


def test_warnings_for_rl_and_rft():
    stale = load_config(None, ["rollout.staleness=1"])
    [msg] = rules.warnings(stale, rl=True)
    assert msg.startswith("rollout.staleness = 1 without algo.tis_cap") and "algo.tis_cap" in msg
    assert rules.warnings(load_config(None, ["rollout.staleness=1", "algo.tis_cap=2.0"]), rl=True) == []
    inert = load_config(None, ["algo.clip_high=0.28"])  # one update per batch: the clip cannot act
    assert [m.split(" has no effect")[0] for m in rules.warnings(inert, rl=True)] == ["algo.clip_high = 0.28"]
    assert rules.warnings(inert, rl=False) == [] and rules.warnings(stale, rl=False) == []


def test_updates_per_step_is_the_count_the_schedule_and_the_rules_use():
    cfg = load_config(None, ["train.batch_size=8", "train.mini_batch_size=2", "algo.ppo_epochs=3"])
    assert cfg.updates_per_step == 12
    assert rules.inert_settings(load_config(None, ["train.batch_size=8", "train.mini_batch_size=2",
                                                   "algo.clip_high=0.28"])) == []


@pytest.mark.parametrize("rel", ["train/setup.py", "train/loop.py", "ablate/methods.py", "train/preflight.py"])
def test_the_callers_hold_no_rule_of_their_own(rel):
    """The rules these modules used to write out themselves (and their messages) live in config/rules.py."""
    text, home = (PKG / rel).read_text(), (PKG / "config" / "rules.py").read_text()
    for phrase in ("must be divisible", "needs loss scaling", "is a GRPO/PPO option", "without algo.tis_cap",
                   "has no effect in this run"):
        assert phrase in home and phrase not in text, (rel, phrase)
    calls = {n.func.attr for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "rules"}
    expected = {"train/setup.py": {"refuse_for_training"}, "train/loop.py": {"warnings"},
                "ablate/methods.py": {"refuse_for_method"}, "train/preflight.py": set()}[rel]
    assert calls == expected
