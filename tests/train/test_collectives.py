"""Every tensor collective that mathrl itself issues goes through one helper,
:func:`mathrl.dist.collectives.all_reduce`, which moves the tensor to the engine's device (NCCL refuses CPU
tensors: "No backend type associated with device type cpu"). A wrapper around torch.distributed's
collectives records each call's caller and tensor device during real training runs (GRPO with KL,
PPO with critic and whitening, REINFORCE++, SFT)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
from _train_tasks import FIRST_DIGIT, digit_problems

import mathrl
from mathrl.config import load_config
from mathrl.train import run
from mathrl.dist import collectives

pytestmark = pytest.mark.slow

MATHRL_DIR = str(Path(mathrl.__file__).parent)
HELPER = str(Path(collectives.__file__))
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
               "reduce", "all_to_all_single")


@pytest.fixture
def recorded(monkeypatch):
    calls: list[tuple[str, str, torch.device]] = []
    for name in COLLECTIVES:
        real = getattr(tdist, name)

        # any signature: DeepSpeed's communication backend keeps the functions it finds when it first starts,
        # so a wrapper installed then is still called (with keyword arguments) by later tests in this process
        def wrapper(*args, _real=real, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            tensor = args[0] if args else next(iter(kwargs.values()), None)
            dev = tensor.device if isinstance(tensor, torch.Tensor) else None
            calls.append((_name, caller, dev))
            return _real(*args, **kwargs)

        monkeypatch.setattr(tdist, name, wrapper)
    return calls


def _check(calls) -> int:
    ours = [(n, f, d) for n, f, d in calls if f.startswith(MATHRL_DIR)]
    assert ours, "no collective issued by mathrl was seen: the wrapper did not record anything"
    stray = [(n, f) for n, f, _ in ours if f != HELPER]
    assert not stray, f"collectives issued outside collectives.all_reduce: {stray}"
    assert all(d == collectives.device() for _, _, d in ours)
    return len(ours)


@pytest.mark.parametrize("extra", [
    ["algo.kl_coef=0.04"],                                                      # GRPO, KL in the loss
    ["algo.name=ppo", "rollout.n=2", "train.mini_batch_size=2"],                # critic, GAE, whitening
    ["algo.advantage=reinforce_pp", "algo.kl_coef=0.04"],                       # KL in the reward, whitening
], ids=["grpo", "ppo", "reinforce_pp"])
def test_training_collectives_use_the_helper(digit_model_dir, tmp_path, recorded, extra):
    cfg = load_config(None, [f"model.name={digit_model_dir}", "rollout.backend=hf", "rollout.max_tokens=4",
                             "rollout.n=4", "train.batch_size=4", "train.steps=2", "data.template=chat_boxed",
                             f"train.output_dir={tmp_path / 'r'}", "logging.tensorboard=false",
                             "logging.console=plain", "train.save_every=1", FIRST_DIGIT, *extra])
    assert run(cfg, problems=digit_problems()) == 0
    assert _check(recorded) >= 4


def test_sft_collectives_use_the_helper(digit_model_dir, recorded):
    from mathrl.dist.collectives import init_distributed
    from mathrl.dist.engines import build_engine
    from mathrl.train.rows import ForwardBatch
    from mathrl.train.sft import sft_train_step
    from transformers import AutoModelForCausalLM

    init_distributed()
    model = AutoModelForCausalLM.from_pretrained(str(digit_model_dir))
    engine = build_engine(model, lr=1e-3, weight_decay=0.0, schedule="constant", warmup=0, total_steps=1, stage=2,
                          offload="none", grad_clip=1.0, dtype=torch.float32, world_size=1)
    pids = torch.tensor([[0, 3, 4], [5, 6, 7]])
    pmask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    rids = torch.tensor([[8, 1, 0], [9, 10, 1]])
    rmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    stats = sft_train_step(engine, ForwardBatch(pids, pmask, rids, rmask), [0, 1], token_budget=6)
    assert stats["stepped"] == 1.0
    _check(recorded)
