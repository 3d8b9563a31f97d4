"""The GPU check (scripts/gpu_check.sh, gpu_check.py, gpu_wheelhouse.sh), on CPU.

* both shell scripts parse (``bash -n``); the wheelhouse builder downloads, so it is not run here;
* gpu_check.sh without a wheelhouse, on a Python that lacks DeepSpeed (a shim on PYTHONPATH whose
  import fails), stops with exit 3 and a message naming the package and the fix (fast-ish: imports);
* a step past its wall-clock limit is killed and recorded as a failure; a step that does not fit in
  the budget is recorded as ``skipped: budget`` without running (fast);
* gpu_check.sh --device cpu end to end: every step (the deepspeed and torchrun launchers on gloo, the
  NaN skip, the kill and bitwise resume, LoRA under ZeRO-3, the memory guard, the ballast run, bf16 vs
  fp32 accumulation, mathrl eval, bench_gpu --smoke, offload) has one ok line in gpu_check.jsonl, the
  markdown table has a row for each, and ``--report-only`` rebuilds it from a JSONL cut short (slow).
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
sys.path.insert(0, str(SCRIPTS))
import gpu_check  # noqa: E402


def _env(**extra) -> dict:
    env = without_dist_env()
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu",
               PYTHON=sys.executable, **extra)
    return env


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheelhouse.sh"])
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
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
    assert not (tmp_path / "o" / "gpu_check.jsonl").exists()  # stopped before any step


def test_step_past_its_limit_is_killed_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ctx = gpu_check.Ctx("cpu", tmp_path)
    (ctx.work / "logs").mkdir(parents=True)
    before = set(gpu_check.child_pids())  # earlier tests in this process may keep children (a grading pool)
    rec = gpu_check.run_step(gpu_check.BY_NAME["env"], ctx, limit=1.0)  # importing torch alone takes longer
    assert rec["name"] == "env" and rec["ok"] is False and rec["seconds"] < 30
    assert rec["details"]["summary"] == "timed out after 1 s (its limit)"
    assert not set(gpu_check.child_pids()) - before  # nothing of the step left running


def test_budget_skip_is_recorded_not_run(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--device", "cpu", "--out-dir", str(out),
                           "--only", "algo,model", "--budget-s", "5"], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(x) for x in (out / "gpu_check.jsonl").read_text().splitlines()]
    assert [r["name"] for r in recs] == ["algo", "model"]
    assert recs[0]["skipped"] == "budget" and recs[0]["ok"] is None and recs[0]["seconds"] == 0
    assert "skipped: budget (needs ~8 s, 5 s left of --budget-s 5)" in recs[0]["details"]["summary"]
    assert "[1/2] algo: skipped: budget" in proc.stdout
    md = (out / "gpu_check.md").read_text()
    assert "| algo | mathrl.algo on the device vs CPU (float64) | skipped: budget |" in md
    assert "overall: PASS (2 skipped: budget: algo, model)" in md


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_gpu_check_cpu_mode_end_to_end(tmp_path):
    out = tmp_path / "gc"
    env = _env(WHEELHOUSE=str(tmp_path / "empty_wheelhouse"))
    proc = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), "--device", "cpu", "--out-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=2300)
    log = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, log
    recs = [json.loads(x) for x in (out / "gpu_check.jsonl").read_text().splitlines()]
    assert [r["name"] for r in recs] == [s.name for s in gpu_check.STEPS], log
    for r in recs:
        assert r["ok"] is True and not r.get("skipped") and r["seconds"] > 0, r
        assert f"gpu_check: [{recs.index(r) + 1}/{len(recs)}] {r['name']}: budget " in proc.stdout
    d = {r["name"]: r["details"] for r in recs}
    assert d["env"]["versions"]["deepspeed"] and "math-verify" in d["env"]["imported_distributions"]
    assert d["algo"]["functions"] >= 10 and d["algo"]["max_abs_diff"] < 1e-10
    z = d["zero3_deepspeed"]
    assert z["nan_step_skipped"] and z["later_steps_trained"] and z["weights_changed"] and z["gradient_checkpointing"]
    assert [m["bad_step"] for m in z["metrics"]] == [0.0, 1.0, 0.0]
    k = d["kill_resume"]
    assert k["kill_rc"] == -9 and k["checkpoints_at_kill"][-1] == 2 and k["resume_rc"] == 0
    assert k["weights_equal"] and k["weights_max_abs_diff"] == 0 and k["metrics_equal"]
    assert d["lora_zero3"]["lora_B_trained"] and d["lora_zero3"]["steps_logged"] == 2
    assert len(d["memory"]["shapes"]) == 3 and all(s["estimate_mib"] > 0 for s in d["memory"]["shapes"])
    assert d["ballast"]["rc"] == 0 and d["ballast"]["fitted_micro_batch_tokens"] > 0 and not d["ballast"]["oom"]
    g = d["grad_accum"]
    assert g["micro_batches"] == 16 and 0 <= g["fp32"]["rel_l2"] <= g["bf16"]["rel_l2"]
    assert d["eval"]["rc"] == 0 and d["eval"]["summary_written"]
    assert "DeepSpeed ZeRO-2" in d["bench"]["optimizer"] and d["bench"]["update_tok_s"] > 0
    assert d["bench"]["gen_tok_s"] > 0 and d["bench"]["raw_gen_tok_s"] > 0
    assert "DeepSpeed ZeRO-3" in d["bench"]["zero3_optimizer"]  # the ZeRO-3 memory figure's run (None on CPU)
    assert d["varlen"]["layout"] == "varlen" and d["varlen"]["update_tok_s"] > 0
    assert d["offload"]["steps_logged"] == 2
    md = (out / "gpu_check.md").read_text()
    for s in gpu_check.STEPS:
        assert f"| {s.name} | {s.title} | ok |" in md, s.name
    assert md.rstrip().endswith("overall: PASS") and "gpu_check.sh: exit 0" in proc.stdout
    assert not (out / "work").exists()  # models, checkpoints and logs go once everything passed

    # a run cut off after three steps: --report-only rebuilds the table from what the JSONL holds
    lines = (out / "gpu_check.jsonl").read_text().splitlines()
    (out / "gpu_check.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # the 4th line cut mid-write
    rep = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--report-only", "--out-dir", str(out)],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert rep.returncode == 1, rep.stdout + rep.stderr
    md = (out / "gpu_check.md").read_text()
    assert "| model | " in md and "| memory | " not in md
    assert "| (not reached) | memory, grad_accum, eval," in md and md.rstrip().endswith("overall: FAIL")
