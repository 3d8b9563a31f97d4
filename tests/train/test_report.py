"""The run report (mathrl/train/report.py): summary.md's before column and the reward curve after a resume."""

from __future__ import annotations

import json

from mathrl.train.report import write_report


def _log(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _table(out):
    return {line.split(" | ")[0].strip("| "): line.strip("|").split("|")[1:]
            for line in (out / "summary.md").read_text().splitlines()[2:]}


def test_a_resumed_run_takes_its_before_column_from_the_metrics_log(tmp_path):
    # the first process evaluated before training (step 0) and trained to step 2; the resumed process
    # trained steps 3-4 (dynamic sampling's accuracy_sampled only logged from step 3 on) and evaluated after
    steps = [{"step": s, "reward/mean": 0.1 * s, "reward/accuracy": 0.1 * s} for s in (1, 2)]
    steps += [{"step": s, "reward/mean": 0.1 * s, "reward/accuracy": 0.1 * s, "sampling/accuracy_sampled": 0.05}
              for s in (3, 4)]
    _log(tmp_path / "metrics.jsonl", [{"step": 0, "event": "eval", "greedy": 0.01, "pass@1": 0.0475}] + steps
         + [{"step": 4, "event": "eval", "greedy": 0.05, "pass@1": 0.05}])
    write_report(tmp_path, {}, {"greedy": 0.05, "pass@1": 0.05})
    rows = _table(tmp_path)
    assert [c.strip() for c in rows["greedy"]] == ["0.010", "0.050"]
    assert [c.strip() for c in rows["pass@1"]] == ["0.048", "0.050"]
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000


def test_the_before_column_of_this_process_wins(tmp_path):
    _log(tmp_path / "metrics.jsonl", [{"step": 0, "event": "eval", "greedy": 0.9},
                                      {"step": 1, "reward/mean": 0.5, "reward/accuracy": 0.5}])
    write_report(tmp_path, {"greedy": 0.25}, {"greedy": 0.5})
    assert [c.strip() for c in _table(tmp_path)["greedy"]] == ["0.250", "0.500"]


def test_the_trainers_evaluations_are_evaluation_folders(tiny_model_dir, tmp_path, capsys):
    """Issue 38 point 2: the held-out evaluations before and after training are folders that `mathrl eval
    --compare` and `--regrade` read (before, the trainer wrote only samples.jsonl and both refused them:
    'is not an evaluation run folder (no summary.json)')."""
    from mathrl.config import load_config
    from mathrl.eval.cli import main as eval_main
    from mathrl.train import run

    out = tmp_path / "run"
    cfg = load_config(None, [f"model.name={tiny_model_dir}", "data.source=synthetic", "data.synthetic_level=1",
                             "rollout.backend=hf", "rollout.max_tokens=8", "rollout.n=2", "train.batch_size=2",
                             "train.steps=2", "data.eval_limit=5", "eval.n=2", "eval.k=1,2", "eval.max_tokens=8",
                             f"train.output_dir={out}", "logging.tensorboard=false", "logging.console=plain"])
    assert run(cfg) == 0
    before, after = out / "eval" / "step_000000", out / "eval" / "step_000002"
    for folder in (before, after):
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["benchmarks"]["heldout"]["problems"] == 5 and summary["settings"]["n"] == 2
        assert (folder / "report.md").is_file() and (folder / "heldout" / "samples.jsonl.gz").is_file()
    assert "to step 2" in json.loads((after / "summary.json").read_text())["model"]
    capsys.readouterr()
    assert eval_main(["--compare", str(before), str(after), "--out", str(tmp_path / "cmp")]) == 0
    shown = capsys.readouterr().out
    assert "heldout" in shown and "5" in shown
    graded = json.loads((after / "summary.json").read_text())["benchmarks"]["heldout"]["metrics"]
    assert eval_main(["--regrade", str(after)]) == 0  # grades the saved samples again, in place
    regraded = json.loads((after / "summary.json").read_text())
    assert regraded["regraded"] is True and regraded["benchmarks"]["heldout"]["metrics"] == graded
