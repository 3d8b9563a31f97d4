"""The study driver end to end on the tiny digit task: 2 methods x 2 steps, report files, resume."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from _ablate_tasks import digit_problems, first_digit_grader

from mathrl.ablate import Task, run_study
from mathrl.ablate.study import DONE, TRAINED

pytestmark = pytest.mark.slow  # every test here takes seconds (make test-fast skips them)


def _study(tmp_path, model_dir) -> tuple:
    study = {
        "study": {"name": "tiny", "out": str(tmp_path / "study"), "rft": {"dedup": True}},
        "base": {
            "model": {"name": str(model_dir)},
            "data": {"template": "chat_boxed"},
            "rollout": {"backend": "hf", "n": 4, "max_tokens": 1, "temperature": 1.0},
            "train": {"steps": 2, "batch_size": 4, "lr": 1.0e-2, "seed": 0, "save_every": 1, "keep_last": 3},
            "deepspeed": {"zero_stage": 1},
            "logging": {"tensorboard": False, "console": "plain"},
            "reward": {"workers": 1},
            "eval": {"n": 4, "k": [1, 4], "max_tokens": 1, "greedy": True, "temperature": 1.0, "top_p": 1.0},
        },
        "runs": [{"method": "online_rft"}, {"method": "grpo", "overrides": {"algo.kl_coef": 0.0}}],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(study))
    task = Task(train_problems=digit_problems(32), eval_problems=digit_problems(10, offset=100), eval_name="digits",
                reward_terms={"first_digit": {}}, grader=first_digit_grader)
    return path, task


def test_tiny_grid_writes_report_and_resumes_only_the_stopped_runs(tmp_path, digit_model_dir):
    path, task = _study(tmp_path, digit_model_dir)
    out = tmp_path / "study"
    logs: list[str] = []
    report = run_study(path, task=task, log=logs.append)

    for f in ("report.md", "report.json", "accuracy_curve.png", "maj_pass_at_k.png", "plan.json"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    assert [r["name"] for r in report["runs"]] == ["online_rft", "grpo"]
    assert report["pending"] == []
    for r in report["runs"]:
        assert (out / r["name"] / DONE).is_file()
        assert r["final_step"] == 2
        for side in ("before", "after"):
            assert set(r[side]) >= {"greedy", "pass@1", "pass@2", "pass@4", "maj@2", "maj@4"}
            assert 0.0 <= r[side]["pass@1"] <= r[side]["pass@4"] <= 1.0
        assert r["tokens"] == 2 * 4 * 4  # 2 steps x B=4 x G=4 one-token responses
        assert r["wall_train_s"] > 0
        assert [len(r["train_curve"]), r["curve"][0]["step"], r["curve"][-1]["step"]] == [2, 0, 2]
    # the task is not degenerate: the initial model is right sometimes, and training changed the policy
    assert 0.0 < report["runs"][0]["before"]["pass@4"] < 1.0
    assert all(r["after"] != r["before"] for r in report["runs"])
    # both runs share one baseline evaluation ("before")
    assert len(list(out.glob("baseline-*"))) == 1
    assert report["runs"][0]["before"] == report["runs"][1]["before"]
    md = (out / "report.md").read_text()
    assert "| online_rft | online_rft | 2 |" in md and "| grpo | grpo | 2 |" in md
    assert json.loads((out / "report.json").read_text())["runs"][1]["method"] == "grpo"
    rft_metrics = [json.loads(line) for line in (out / "online_rft" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rft_metrics] == [1, 2] and all("sft/loss" in m and "rft/kept" in m for m in rft_metrics)
    assert all(m["sys/rss_mb"] > 0 for m in rft_metrics)  # the report's RSS column for the RFT methods too
    assert all(r["rss_gb_max"] > 0 for r in report["runs"])

    # a second invocation redoes nothing
    grpo_done = (out / "grpo" / DONE).stat().st_mtime_ns
    logs.clear()
    run_study(path, task=task, log=logs.append)
    assert sum("skipped" in line for line in logs) == 2 and not any("training (" in line for line in logs)

    # simulate two stops: online_rft after its step-1 checkpoint, grpo before its first checkpoint
    for name in ("online_rft", "grpo"):
        (out / name / DONE).unlink()
        (out / name / TRAINED).unlink()
    import shutil

    shutil.rmtree(out / "online_rft" / "checkpoints" / "step_000002")
    first = json.loads((out / "online_rft" / "attempts.json").read_text())
    first[-1]["end"] = None                                            # a killed attempt records no end
    (out / "online_rft" / "attempts.json").write_text(json.dumps(first))
    shutil.rmtree(out / "grpo" / "checkpoints")
    (out / "grpo" / "stale.txt").write_text("left by the stopped run")
    logs.clear()
    report2 = run_study(path, task=task, log=logs.append)
    assert any("online_rft: " in line and "resuming from its checkpoint of step 1" in line for line in logs)
    assert any("grpo: " in line and "without a checkpoint; redoing it from step 0" in line for line in logs)
    assert not (out / "grpo" / "stale.txt").exists()
    assert all((out / name / DONE).is_file() for name in ("online_rft", "grpo"))
    rft_steps = [json.loads(line)["step"] for line in (out / "online_rft" / "metrics.jsonl").read_text().splitlines()]
    assert rft_steps == [1, 2]                                         # step 1 kept, step 2 redone once
    attempts = json.loads((out / "online_rft" / "attempts.json").read_text())
    assert len(attempts) == 2 and attempts[0]["stopped"] and attempts[1]["end"] >= attempts[1]["start"]
    assert report2["runs"][0]["wall_train_s"] >= attempts[1]["end"] - attempts[1]["start"]
    assert [r["name"] for r in report2["runs"]] == ["online_rft", "grpo"]
    # deterministic: the resumed and the redone run reproduce their first results exactly
    assert report2["runs"][0]["after"] == report["runs"][0]["after"]
    assert report2["runs"][1]["after"] == report["runs"][1]["after"]

    # editing the study after a run finished: the run is kept, with a warning naming its folder;
    # keys that cannot change the result (checkpointing, logging) give no warning
    edited = yaml.safe_load(path.read_text())
    edited["base"]["train"]["keep_last"] = 5
    edited["base"]["logging"]["console"] = "rich"
    path.write_text(yaml.safe_dump(edited))
    logs.clear()
    run_study(path, task=task, log=logs.append)
    assert not any("warning" in line for line in logs)
    edited["runs"][1]["overrides"]["train.lr"] = 0.5
    path.write_text(yaml.safe_dump(edited))
    logs.clear()
    run_study(path, task=task, log=logs.append)
    assert any("grpo: warning: the study now gives this run another config" in line and "(train.lr)" in line
               for line in logs)
    assert not any("online_rft: warning" in line for line in logs)
    path.write_text(yaml.safe_dump({**edited, "runs": [{"method": "online_rft"},
                                                       {"method": "grpo", "overrides": {"algo.kl_coef": 0.0}}]}))

    # --report-only trains nothing and rebuilds the same table
    logs.clear()
    report3 = run_study(path, task=task, report_only=True, log=logs.append)
    assert not any("training (" in line or "evaluating" in line for line in logs)
    assert [r["after"] for r in report3["runs"]] == [r["after"] for r in report2["runs"]]

    # scripts/ablate_estimate.py extrapolates from a finished (probe) study: here to 10 steps, 20 problems
    import importlib.util
    from pathlib import Path

    from mathrl.ablate.study import load_study, run_config

    spec = importlib.util.spec_from_file_location(
        "ablate_estimate", Path(__file__).resolve().parents[2] / "scripts" / "ablate_estimate.py")
    est = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(est)
    probe = load_study(path)
    full = load_study(path)
    for r in full.runs:
        r.overrides = r.overrides + [("train.steps", 10, "test"), ("data.eval_limit", 20, "test")]
    rows, total = est.estimate(full, probe, {r.name: run_config(full, r) for r in full.runs}, eval_limit=10)
    assert [r["run"] for r in rows] == ["online_rft", "grpo"] and all(r["steps"] == 10 for r in rows)
    assert total == pytest.approx(sum(r["train_s"] + r["eval_s"] for r in rows), abs=2)
