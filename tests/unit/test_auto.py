"""mathrl/config/auto.py: every ``auto`` setting decided in one place, by hand-checked rules on a given
machine, and the product's users of those settings (DeepSpeed dtype, autocast, rollout engine dtype)
decide through it."""

from __future__ import annotations

import pytest
import torch

from mathrl.config import auto, load_config

GPU, AVX2, AMX = auto.Machine(True, False), auto.Machine(False, False), auto.Machine(False, True)


@pytest.mark.parametrize("machine,dtype,autocast", [(GPU, "bfloat16", "bfloat16"), (AVX2, "float32", "off"),
                                                    (AMX, "float32", "bfloat16")])
def test_auto_by_machine(machine, dtype, autocast):
    cfg = load_config(None, ["model.dtype=auto", "model.autocast=auto", "rollout.dtype=auto"])
    r = auto.resolve(cfg, machine)
    assert (r.model_dtype, r.autocast, r.rollout_dtype) == (dtype, autocast, dtype)
    assert r.changed(cfg) == {"model.dtype": dtype, "model.autocast": autocast, "rollout.dtype": dtype,
                              "algo.advantage": "grpo", "algo.kl_in": "loss", "algo.kl_estimator": "k3",
                              "algo.clip_low": 0.2, "algo.clip_high": 0.2, "algo.loss_agg": "token-mean"}


def test_set_values_are_kept_and_the_rollout_follows_the_model():
    cfg = load_config(None, ["model.dtype=bfloat16", "model.autocast=off", "algo.name=ppo"])
    r = auto.resolve(cfg, AVX2)
    assert (r.model_dtype, r.autocast, r.rollout_dtype) == ("bfloat16", "off", "bfloat16")
    assert (r.advantage, r.kl_in, r.kl_estimator) == ("gae", "reward", "k1")
    assert auto.rollout_dtype(load_config(None, ["rollout.dtype=float32", "model.dtype=bfloat16"]), GPU) == "float32"
    assert r.changed(cfg) == {"rollout.dtype": "bfloat16", "algo.advantage": "gae", "algo.kl_in": "reward",
                              "algo.kl_estimator": "k1", "algo.clip_low": 0.2, "algo.clip_high": 0.2,
                              "algo.loss_agg": "token-mean"}


def test_the_users_of_auto_decide_through_it(monkeypatch):
    """DeepSpeed's dtype, the rollout engine's dtype and autocast follow a changed rule in config/auto.py."""
    from mathrl.dist.engines import resolve_dtype
    from mathrl.models.precision import resolve_autocast
    from mathrl.rollout.options import engine_dtype

    cfg = load_config(None, ["model.dtype=auto", "rollout.dtype=auto"])
    here = "bfloat16" if torch.cuda.is_available() else "float32"
    assert (str(resolve_dtype("auto")), engine_dtype(cfg)) == (f"torch.{here}", here)
    monkeypatch.setattr(auto, "model_dtype", lambda name, machine=None: "bfloat16" if name == "auto" else name)
    monkeypatch.setattr(auto, "autocast", lambda name, machine=None: "bfloat16" if name == "auto" else name)
    assert (resolve_dtype("auto"), engine_dtype(cfg)) == (torch.bfloat16, "bfloat16")
    assert resolve_autocast("auto", cuda=False, native=False) == "bfloat16"
    assert resolve_dtype("float32") == torch.float32
