"""The gradient points the right way: GRPO learns a digit-copy task; the sign-flipped loss unlearns it."""

from __future__ import annotations

import pytest

from mathrl.config import load_config
from mathrl.train import run
from mathrl.train.metrics import read_metrics

from _train_tasks import FIRST_DIGIT, digit_problems


def _run(model_dir, out, loss_sign):
    cfg = load_config(None, [
        f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=5", "rollout.n=8",
        "train.batch_size=8", "train.steps=40", "train.lr=1e-2", "algo.kl_coef=0", "data.template=chat_boxed",
        f"train.output_dir={out}", "logging.tensorboard=false", "deepspeed.zero_stage=1", FIRST_DIGIT,
    ])
    assert run(cfg, problems=digit_problems(), loss_sign=loss_sign) == 0
    rewards = [m["reward/mean"] for m in read_metrics(out / "metrics.jsonl") if "event" not in m]
    return sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4


@pytest.mark.slow
def test_grpo_learns_and_flipped_sign_unlearns(digit_model_dir, tmp_path):
    start, end = _run(digit_model_dir, tmp_path / "up", 1.0)
    assert end > start + 0.4, (start, end)
    start_f, end_f = _run(digit_model_dir, tmp_path / "down", -1.0)
    assert end_f < start_f, (start_f, end_f)
    assert end_f < 0.05
