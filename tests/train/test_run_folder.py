"""A run folder belongs to one run (issue 38, points 1, 3 and 15): a fresh start into a folder holding a
run stops with one line and changes nothing; ``--overwrite`` moves the old run aside; checkpoint rotation
never deletes the checkpoint just written; ``--resume auto`` names a damaged newest checkpoint it passes
over and moves it aside instead of overwriting it; and says so when there is nothing to resume."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _train_tasks import digit_cfg, digit_problems, step_rows

from mathrl.config import ConfigError
from mathrl.procs import without_dist_env
from mathrl.train import checkpoint as ckpt
from mathrl.train import run


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _cfg(model_dir, out, *extra):
    return digit_cfg(model_dir, out, "logging.console=plain", "train.save_every=1", "train.keep_last=2", *extra)


@pytest.fixture()
def finished(digit_model_dir, tmp_path):
    """A finished 4-step run: checkpoints 3 and 4 (keep_last 2), 4 metric lines."""
    out = tmp_path / "run"
    assert run(_cfg(digit_model_dir, out, "train.steps=4"), problems=digit_problems()) == 0
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [3, 4] and len(step_rows(out)) == 4
    return out


def test_a_fresh_start_into_a_run_folder_stops_and_changes_nothing(digit_model_dir, finished):
    before = _snapshot(finished)
    with pytest.raises(ConfigError) as exc:
        run(_cfg(digit_model_dir, finished, "train.steps=1"), problems=digit_problems())
    msg = str(exc.value)
    assert "\n" not in msg and f"train.output_dir={finished} holds another run" in msg
    assert "2 checkpoint(s), newest step_000004" in msg and "4 line(s) of metrics.jsonl" in msg
    assert "--resume auto" in msg and "--overwrite" in msg
    assert _snapshot(finished) == before


def test_overwrite_moves_the_old_run_aside(digit_model_dir, finished, tmp_path, capsys):
    before = _snapshot(finished)
    capsys.readouterr()
    assert run(_cfg(digit_model_dir, finished, "train.steps=1", "train.overwrite=true"), problems=digit_problems()) == 0
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(moved) == 1 and f"moved to {moved[0]}" in capsys.readouterr().out
    assert _snapshot(moved[0]) == before  # the old run, whole
    assert [s for s, _ in ckpt.list_checkpoints(finished)] == [1] and len(step_rows(finished)) == 1


def test_the_cli_flag_sets_train_overwrite():
    proc = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", "--overwrite", "--print-config"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "overwrite: true" in proc.stdout
    plain = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", "--print-config"], capture_output=True,
                           text=True, timeout=300)
    assert "overwrite: false" in plain.stdout


def test_rotation_never_deletes_the_checkpoint_just_written(tmp_path):
    """A folder with steps 4 and 5 (e.g. after resuming from step 2 by path): writing step 3 with keep_last 2
    keeps step 3 and the newest other one. Before the fix step 3 sorted as oldest and was deleted at once."""
    for step in (4, 5, 3):
        tmp = ckpt.begin(tmp_path, step)
        (tmp / "weights.bin").write_bytes(bytes([step]) * 10)
        ckpt.commit(tmp, step, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [3, 5]
    tmp = ckpt.begin(tmp_path, 6)
    (tmp / "weights.bin").write_bytes(b"6")
    ckpt.commit(tmp, 6, keep_last=1)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [6]


@pytest.mark.parametrize("damage", ["truncated", "no_manifest"])
def test_resume_names_and_keeps_a_damaged_newest_checkpoint(digit_model_dir, finished, capsys, damage):
    newest = ckpt.ckpt_root(finished) / "step_000004"
    weights = newest / "policy" / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
        why = "policy/model.safetensors is 1000 bytes, the manifest lists"
    else:
        (newest / ckpt.MANIFEST).unlink()
        why = "no MANIFEST.json"
    damaged = _snapshot(newest)
    capsys.readouterr()
    assert run(_cfg(digit_model_dir, finished, "train.steps=5", "train.resume=auto"), problems=digit_problems()) == 0
    out = capsys.readouterr().out
    assert f"mathrl: warning: resume: skipped {newest} ({why}" in out, out[-2000:]
    moved = [p for p in ckpt.ckpt_root(finished).iterdir() if p.name.startswith("step_000004.damaged-")]
    assert len(moved) == 1 and f"moved it to {moved[0].name}" in out
    assert _snapshot(moved[0]) == damaged  # kept as it was, for inspection
    assert f"resumed from {ckpt.ckpt_root(finished) / 'step_000003'} (step 3)" in out
    assert [s for s, _ in ckpt.list_checkpoints(finished)] == [4, 5]  # steps 4 and 5 trained again
    assert [r["step"] for r in step_rows(finished)] == [1, 2, 3, 4, 5]


def test_resume_auto_with_nothing_to_resume_says_so(digit_model_dir, tmp_path, capsys):
    out = tmp_path / "new"
    assert run(_cfg(digit_model_dir, out, "train.steps=1", "train.resume=auto"), problems=digit_problems()) == 0
    assert f"mathrl: resume: no complete checkpoint in {out / 'checkpoints'}; starting at step 0" in capsys.readouterr().out
    # and a resumed run's own folder is not "another run"
    assert run(_cfg(digit_model_dir, out, "train.steps=2", "train.resume=auto"), problems=digit_problems()) == 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


@pytest.mark.slow
def test_the_log_names_slow_checkpoints_and_not_deepspeeds_build(tiny_model_dir, digit_model_dir, tmp_path,
                                                                   monkeypatch, capsys):
    """Issue 38 point 10: a checkpoint write says in the log that it is running (here every write, the
    threshold set to 0 s; a real run: after 10 s); DeepSpeed's `... built successfully` line, printed at
    every start, is gone from a run's output."""
    import mathrl.progress

    monkeypatch.setattr(mathrl.progress, "LINE_AFTER", 0.0)
    assert run(_cfg(digit_model_dir, tmp_path / "slow", "train.steps=2"), problems=digit_problems()) == 0
    err = capsys.readouterr().err
    for step in (1, 2):
        assert f"mathrl: writing the checkpoint of step {step}: 0s so far" in err, err[-2000:]
        assert f"mathrl: writing the checkpoint of step {step}: done after" in err
    proc = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", f"model.name={tiny_model_dir}",
                           "data.source=synthetic", "rollout.backend=hf", "rollout.max_tokens=4", "rollout.n=2",
                           "train.batch_size=2", "train.steps=1", f"train.output_dir={tmp_path / 'cli'}",
                           "logging.tensorboard=false", "logging.console=plain", "data.eval_limit=1",
                           "eval.n=1", "eval.k=1", "eval.max_tokens=2"],
                          capture_output=True, text=True, timeout=600, env=without_dist_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "built successfully" not in proc.stdout + proc.stderr and "step 1/1" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_killed_mid_run_gives_the_survivor_one_line(tiny_model_dir, tmp_path):
    """Issue 38 point 13: with two ranks, rank 1 SIGKILLed after step 1: rank 0 ended with a raw gloo
    traceback (`Connection closed by peer`); now one line naming the lost rank and how to continue."""
    import os
    import signal
    import time

    from mathrl.dist.collectives import free_port

    out = tmp_path / "two"
    args = [sys.executable, "-m", "mathrl.cli", "train", f"model.name={tiny_model_dir}", "data.source=synthetic",
            "rollout.backend=hf", "rollout.max_tokens=8", "rollout.n=2", "train.batch_size=2", "train.steps=200",
            f"train.output_dir={out}", "logging.tensorboard=false", "logging.console=plain", "data.eval_limit=1",
            "eval.n=1", "eval.k=1", "eval.max_tokens=2", "train.dist_timeout_minutes=2"]
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = dict(without_dist_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not ((out / "metrics.jsonl").is_file() and step_rows(out)):
            assert procs[0].poll() is None, procs[0].communicate()[1][-3000:]
            time.sleep(0.2)
        assert step_rows(out), "rank 0 logged no step"
        os.kill(procs[1].pid, signal.SIGKILL)
        _, err = procs[0].communicate(timeout=240)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("mathrl train: stopped: rank 0 lost rank 1: it stopped"), err[-3000:]
    assert "--resume auto" in last and "Traceback" not in err, err[-3000:]
