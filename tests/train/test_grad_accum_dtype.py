"""A bf16 run sums the micro-batch gradients of an optimizer step in fp32 (issue 37, point 4).

DeepSpeed's default accumulation dtype is the model's, so under bf16 the token-budgeted micro-batches of one
step were summed in bf16 and a micro-batch gradient below half a bf16 ulp of the running sum was lost."""

from __future__ import annotations

import json

import pytest
import torch

from mathrl.config import ConfigError
from mathrl.dist.ds_json import ds_config


def _cfg(stage, offload="none", dtype=torch.bfloat16, config_path=None):
    return ds_config(stage, offload, micro_batch=1, world_size=2, grad_clip=1.0, dtype=dtype, config_path=config_path)


@pytest.mark.parametrize("stage, offload", [(1, "none"), (2, "none"), (3, "none"), (2, "optimizer"), (3, "optimizer"),
                                            (3, "all")])
def test_bf16_runs_accumulate_in_fp32(stage, offload):
    cfg = _cfg(stage, offload)
    assert cfg["bf16"]["enabled"] is True and cfg["zero_optimization"]["stage"] == stage
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"}


def test_fp32_runs_and_zero0_keep_deepspeed_default():
    assert "data_types" not in _cfg(2, dtype=torch.float32)
    assert "data_types" not in _cfg(0)  # DeepSpeed 0.19 refuses bf16 weights with fp32 accumulation at stage 0


def test_user_json(tmp_path):
    base = {"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(base))
    assert _cfg(2, config_path=str(p))["data_types"] == {"grad_accum_dtype": "fp32"}  # absent: mathrl's default
    p.write_text(json.dumps({**base, "data_types": {"grad_accum_dtype": "bf16"}}))
    assert _cfg(2, config_path=str(p))["data_types"] == {"grad_accum_dtype": "bf16"}  # the user's choice is kept
    p.write_text(json.dumps({**base, "zero_optimization": {"stage": 0}, "data_types": {"grad_accum_dtype": "fp32"}}))
    with pytest.raises(ConfigError, match=r"ds\.json: data_types\.grad_accum_dtype = 'fp32' with bf16 and "
                                          r"zero_optimization\.stage 0.*deepspeed\.zero_stage >= 1"):
        _cfg(0, config_path=str(p))


# one micro-batch gradient of 1.0, then 15 of 2^-9: in bf16 each 2^-9 is below half an ulp of 1.0 and vanishes
GRADS = [1.0] + [2.0 ** -9] * 15
FP32_SUM = sum(GRADS)  # 1.029296875


class _Dot(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(64))

    def forward(self, x):
        return (self.w * x).sum()  # d/dw = x


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_sixteen_bf16_micro_batches_sum_in_fp32(stage):
    """The engine mathrl builds for a bf16 run (engines.build_engine) sums 16 caller-owned micro-batches to the fp32
    sum (DeepSpeed casts the sum to bf16 once for the reduction over ranks), where bf16 accumulation gives 1.0."""
    from deepspeed.utils import safe_get_full_fp32_param

    from mathrl.dist.collectives import init_distributed
    from mathrl.dist.engines import build_engine

    init_distributed()
    engine = build_engine(_Dot(), lr=1.0, weight_decay=0.0, schedule="constant", warmup=0, total_steps=1, stage=stage,
                          offload="none", grad_clip=0.0, dtype=torch.bfloat16, world_size=1)
    for group in engine.optimizer.param_groups:
        group["eps"] = 1.0  # Adam's first step is then lr * g / (|g| + 1): invertible, so g can be read back
    for g in GRADS:
        engine.backward(engine(torch.full((64,), g, dtype=torch.bfloat16, device=engine.device)))
    engine.step()
    w = safe_get_full_fp32_param(engine.module.w)
    u = -float(w[0])
    got = u / (1.0 - u)
    bf16_once = float(torch.tensor(FP32_SUM).to(torch.bfloat16))  # 1.03125
    assert got == pytest.approx(FP32_SUM, rel=1e-6) or got == pytest.approx(bf16_once, rel=1e-6), got
    assert got > 1.02  # bf16 accumulation: 1.0
