"""Warnings for settings that cannot act: a clip bound when every batch makes exactly one on-policy update.

The study's clip-higher row (configs/ablations/wordproblems_cpu.yaml) trained bit for bit like its GRPO
row: one update per step, so the ratio was 1 and clip_high = 0.28 never acted. The first test pins that
fact on the loss itself (with a negative control where the ratio moves), the rest the warning.
"""

from __future__ import annotations

import pytest
import torch

from mathrl.algo.losses import policy_loss
from mathrl.config import load_config
from mathrl.config.rules import inert_settings


def _loss_and_grad(logp0: torch.Tensor, old: torch.Tensor, clip_high: float) -> tuple[float, torch.Tensor]:
    logp = logp0.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=clip_high)
    loss.backward()
    return float(loss.detach()), logp.grad


def test_clip_high_cannot_act_on_policy_but_acts_off_policy():
    torch.manual_seed(0)
    logp = torch.log(torch.rand(2, 3) * 0.5 + 0.1)
    # on-policy (old = current, as train_step uses when it skips the old forward): identical loss and grad
    a = _loss_and_grad(logp, logp.detach(), 0.2)
    b = _loss_and_grad(logp, logp.detach(), 0.28)
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    # negative control: a ratio of 1.25 on the positive-advantage row sits between 1.2 and 1.28
    old = logp.detach() - torch.log(torch.tensor(1.25))
    c = _loss_and_grad(logp, old, 0.2)
    d = _loss_and_grad(logp, old, 0.28)
    assert c[0] != d[0] and not torch.equal(c[1], d[1])


def _cfg(*overrides: str):
    return load_config(None, ["train.batch_size=8", *overrides])


@pytest.mark.parametrize("overrides, named", [
    (["algo.clip_high=0.28"], ["algo.clip_high = 0.28"]),
    (["algo.clip_low=0.1"], ["algo.clip_low = 0.1"]),
    (["algo.dual_clip=3.0"], ["algo.dual_clip = 3.0"]),
    (["algo.clip_high=0.28", "algo.dual_clip=3.0"], ["algo.clip_high = 0.28", "algo.dual_clip = 3.0"]),
    (["algo.clip_high=0.28", "train.mini_batch_size=8"], ["algo.clip_high = 0.28"]),  # 8 of 8: one update
])
def test_non_default_clip_with_one_update_per_batch_is_reported(overrides, named):
    msgs = inert_settings(_cfg(*overrides))
    assert len(msgs) == 1
    for key in named:
        assert key in msgs[0]
    assert "no effect" in msgs[0] and "train.mini_batch_size" in msgs[0] and "algo.ppo_epochs > 1" in msgs[0]
    assert "algo.clip_low = 0.2 " not in msgs[0]  # a default bound is not named


@pytest.mark.parametrize("overrides", [
    [],  # the defaults are harmless either way
    ["algo.clip_high=0.28", "train.mini_batch_size=2"],  # four updates per step: the ratio moves
    ["algo.clip_high=0.28", "train.mini_batch_size=4"],  # two updates
    ["algo.clip_high=0.28", "algo.ppo_epochs=2"],
    ["algo.dual_clip=3.0", "algo.ppo_epochs=2"],
])
def test_nothing_reported_where_the_clip_can_act(overrides):
    assert inert_settings(_cfg(*overrides)) == []
