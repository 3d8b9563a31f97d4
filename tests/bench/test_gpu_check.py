"""The GPU check (scripts/gpu_check.sh, gpu_check.py, gpu_wheelhouse.sh), on CPU.

* both shell scripts parse (``bash -n``); the wheelhouse builder downloads, so it is not run here;
* gpu_check.sh without a wheelhouse, on a Python that lacks DeepSpeed (a shim on PYTHONPATH whose
  import fails), stops with exit 3 and a message naming the package and the fix (fast-ish: imports);
* gpu_check.sh --device cpu end to end (tiny shapes, gloo, ZeRO 0/2/3, GRPO and PPO, save and
  resume, bench_gpu --smoke): the JSON and markdown hold every expected row (slow: ~1 min).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mathrl.procs import without_dist_env

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def _env(**extra) -> dict:
    env = without_dist_env()
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu",
               PYTHON=sys.executable, **extra)
    return env


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheelhouse.sh"])
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_missing_wheelhouse_and_deepspeed_fails_clearly(tmp_path):
    shim = tmp_path / "shim" / "deepspeed"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('deepspeed is not installed (test shim)')\n")
    env = _env(WHEELHOUSE=str(tmp_path / "no_wheels"), PYTHONPATH=str(tmp_path / "shim"))
    proc = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), "--device", "cpu", "--out-dir", str(tmp_path / "o")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "no wheelhouse" in proc.stdout
    assert "deepspeed (pip: deepspeed)" in proc.stderr and "test shim" in proc.stderr
    assert "gpu_wheelhouse.sh" in proc.stderr and "wheelhouse" in proc.stderr and "missing" in proc.stderr
    assert not (tmp_path / "o" / "gpu_check.json").exists()  # stopped before any training


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_gpu_check_cpu_mode_end_to_end(tmp_path):
    out = tmp_path / "gc"
    env = _env(WHEELHOUSE=str(tmp_path / "empty_wheelhouse"))
    proc = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), "--device", "cpu", "--out-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["ok"] is True and res["device"] == "cpu"
    assert res["algo"]["ok"] and res["algo"]["functions"] >= 10
    rows = {(r["algo"], r["zero_stage"]): r for r in res["runs"]}
    assert set(rows) == {(a, z) for a in ("grpo", "ppo") for z in (0, 2, 3)}, sorted(rows)
    for (algo, _z), r in rows.items():
        assert r["ok"] and not r.get("skipped") and r["shape"] == "tiny", r
        assert len(r["metrics"]) == (3 if algo == "grpo" else 2) == r["checkpoint"]  # saved at the last step
        assert ("loss/value" in r["metrics"][-1]) == (algo == "ppo")
    rs = res["resume"]
    assert not list((out / "work").glob("tiny-*"))  # run folders (large on a GPU) are deleted once recorded
    assert rs["ok"] and rs["weights_equal"] and rs["metrics_equal"] and rs["weights_max_abs_diff"] == 0
    assert (rs["resumed_from_step"], rs["to_step"]) == (2, 3)
    b = res["bench"]
    assert b["ok"] and "DeepSpeed ZeRO-2" in b["optimizer"]
    assert b["update_tok_s"] > 0 and b["gen_tok_s"] > 0 and b["raw_gen_tok_s"] > 0
    assert "deepspeed" in res["imported_distributions"] and "math-verify" in res["imported_distributions"]
    md = (out / "gpu_check.md").read_text()
    for z in (0, 2, 3):
        assert f"| GRPO 3 steps, ZeRO-{z}, tiny | ok |" in md and f"| PPO 2 steps, ZeRO-{z}, tiny | ok |" in md
    assert "| save + resume (step 2 -> 3, GRPO ZeRO-2, tiny) | ok | weights equal: True" in md
    assert "| bench: GRPO update tokens/s (DeepSpeed ZeRO-2) | ok |" in md and "| bench: MFU |" in md
    assert "| bench: generation tokens/s, mathrl hf | ok |" in md and "overall: PASS" in md
    assert "gpu_check.sh: exit 0" in proc.stdout
