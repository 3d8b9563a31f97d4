"""ZeRO-Offload (``deepspeed.offload=optimizer|all``) on CPU with the real DeepSpeed.

DeepSpeed refuses ZeRO-Offload with a client ``torch.optim`` optimizer, so with offload mathrl lets
DeepSpeed build ``DeepSpeedCPUAdam`` from an ``"optimizer"`` block filled from ``train.*``. The
checks: the engine really holds DeepSpeed's CPU Adam; a run with offload takes the same steps as the
run without (same AdamW hyper-parameters, same warm-up + cosine schedule on the new optimizer); and a
crash-resume with offload is bitwise exact. The first use JIT-compiles DeepSpeed's cpu_adam op
(~50 s once per machine, cached under ~/.cache/torch_extensions).
"""

from __future__ import annotations

import pytest
import torch
from _train_tasks import crash_copy, FIRST_DIGIT, digit_problems, step_rows as _steps
from safetensors.torch import load_file

from mathrl.config import load_config
from mathrl.train import checkpoint as ckpt
from mathrl.train import run
from mathrl.dist.engines import build_engine
from mathrl.dist.ds_json import ds_config, offloads_optimizer, optimizer_block

pytestmark = pytest.mark.slow

ARGS = ["train.steps=4", "train.save_every=2", "train.keep_last=3", "train.lr_schedule=cosine",
        "train.warmup_steps=1", "train.weight_decay=0.1"]


def _cfg(model_dir, out, *extra):
    return load_config(None, [
        f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=5", "rollout.n=4",
        "train.batch_size=4", "train.lr=1e-2", "algo.kl_coef=0.04", "data.template=chat_boxed",
        f"train.output_dir={out}", "logging.tensorboard=false", FIRST_DIGIT, *ARGS, *extra])



def _weights(out):
    return load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors"))


def test_optimizer_block_fills_auto_and_keeps_users_values():
    assert offloads_optimizer(ds_config(2, "optimizer", micro_batch=1, world_size=1, grad_clip=1.0,
                                        dtype=torch.float32))
    assert offloads_optimizer(ds_config(3, "all", micro_batch=1, world_size=1, grad_clip=1.0, dtype=torch.float32))
    assert not offloads_optimizer(ds_config(3, "none", micro_batch=1, world_size=1, grad_clip=1.0,
                                            dtype=torch.float32))
    block = optimizer_block({}, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.95))
    assert block == {"type": "AdamW", "params": {"lr": 3e-6, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
    user = {"optimizer": {"type": "Adam", "params": {"lr": "auto", "eps": 1e-6}}}
    block = optimizer_block(user, lr=1e-5, weight_decay=0.0, betas=(0.9, 0.999))
    assert block["type"] == "Adam" and block["params"]["lr"] == 1e-5 and block["params"]["eps"] == 1e-6
    assert user["optimizer"]["params"]["lr"] == "auto"  # the user's dict is not modified


@pytest.mark.parametrize("stage,offload", [(2, "optimizer"), (3, "optimizer"), (3, "all")])
def test_offload_engine_is_deepspeed_cpu_adam_and_steps(stage, offload):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from mathrl.dist.collectives import init_distributed

    init_distributed()

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    engine = build_engine(module, lr=1e-2, weight_decay=0.0, schedule="linear", warmup=0, total_steps=4, stage=stage,
                          offload=offload, grad_clip=1.0, dtype=torch.float32, world_size=1)
    assert isinstance(engine.optimizer.optimizer, DeepSpeedCPUAdam)
    before = [p.detach().clone() for p in engine.module.parameters()] if stage < 3 else None
    x = torch.randn(4, 8)
    for _ in range(2):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    assert engine.get_lr()[0] == pytest.approx(1e-2 * (1 - 2 / 4))  # the schedule wraps DeepSpeed's optimizer
    if before is not None:
        assert any(not torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))


def test_offload_runs_take_the_same_steps_and_resume_exactly(digit_model_dir, tmp_path):
    # each offload run against the run of its own ZeRO stage without offload: ZeRO-3 itself differs from
    # ZeRO-2 by float32 rounding that Adam enlarges (tests/train/test_trainer.py: up to 8.1e-5 measured)
    bases = {}
    for stage in (2, 3):
        base = tmp_path / f"base{stage}"
        assert run(_cfg(digit_model_dir, base, f"deepspeed.zero_stage={stage}"), problems=digit_problems()) == 0
        bases[stage] = _steps(base), _weights(base)
        assert any(s["reward/mean"] for s in bases[stage][0])
    for stage, offload in ((2, "optimizer"), (3, "all")):
        base_steps, base_w = bases[stage]
        out = tmp_path / f"z{stage}_{offload}"
        extra = (f"deepspeed.zero_stage={stage}", f"deepspeed.offload={offload}")
        assert run(_cfg(digit_model_dir, out, *extra), problems=digit_problems()) == 0
        steps = _steps(out)
        assert [s["lr"] for s in steps] == pytest.approx([s["lr"] for s in base_steps], rel=1e-9)
        assert [s["loss/policy"] for s in steps] == pytest.approx([s["loss/policy"] for s in base_steps], abs=1e-5)
        w = _weights(out)
        for k in base_w:  # DeepSpeedCPUAdam vs torch AdamW: the same update up to float32 rounding
            torch.testing.assert_close(w[k], base_w[k], atol=2e-5, rtol=0, msg=f"{stage}/{offload}: {k}")
        # a crash after step 2's checkpoint, resumed with offload: bitwise the uninterrupted run
        part = tmp_path / f"part{stage}"
        crash_copy(out, part, keep_step=2)
        assert run(_cfg(digit_model_dir, part, *extra, "train.resume=auto"), problems=digit_problems()) == 0
        got = _weights(part)
        for k in w:
            assert torch.equal(got[k], w[k]), (stage, offload, k)
