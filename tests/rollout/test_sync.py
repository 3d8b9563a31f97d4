"""`iter_full_parameters` with a real DeepSpeed ZeRO-3 engine (CPU, gloo, world size 1): every
parameter is partitioned (``numel() == 0`` locally), is gathered one at a time, and the pushed
weights make the hf engine equal to the trainer. Runs in a subprocess so the process group does not
leak into other tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mathrl_testenv import require_import

pytestmark = pytest.mark.slow  # every test here takes seconds (make test-fast skips them)

SCRIPT = textwrap.dedent("""
    import os, socket, torch
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed
    from mathrl.models import load_tokenizer
    from mathrl.testing.tiny import build_tiny_model
    from mathrl.rollout import SamplingConfig, iter_full_parameters
    from mathrl.rollout.hf import HFRolloutEngine

    deepspeed.init_distributed(dist_backend="gloo")
    tok = load_tokenizer("embedded")
    engine = HFRolloutEngine(model=build_tiny_model(tok, seed=0), tokenizer=tok)
    policy = build_tiny_model(tok, seed=1)  # different weights from the engine's
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    ds, _, _, _ = deepspeed.initialize(model=policy, model_parameters=policy.parameters(), config=cfg)
    params = list(ds.module.parameters())
    assert all(hasattr(p, "ds_id") and p.numel() == 0 for p in params), "expected ZeRO-3 partitioned params"
    # reference: the full weights, gathered all at once
    with deepspeed.zero.GatheredParameters(params):
        ref = {n: p.detach().clone() for n, p in ds.module.named_parameters()}
    got = list(iter_full_parameters(ds.module))
    assert [n for n, _ in got] == list(ref), "names differ"
    for n, t in got:
        assert torch.equal(t, ref[n]), n
    assert all(p.numel() == 0 for p in params), "a parameter stayed gathered"
    assert engine.update_weights(iter_full_parameters(ds.module)) == len(ref)
    for n, p in engine.model.named_parameters():
        assert torch.equal(p, ref[n]), n
    print("ZERO3-SYNC-OK", len(ref))
""")


def test_zero3_gather_and_push():
    require_import("deepspeed")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, env=env, cwd=root)
    assert p.returncode == 0 and "ZERO3-SYNC-OK" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]
