"""scripts/summarize_run.py: the window means of a run's metrics log, checked against hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "summarize_run.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("_summarize_run", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    return m


def _write(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_windows_resume_duplicates_and_eval_rows(mod, tmp_path, capsys):
    rows = [{"step": 0, "event": "eval", "greedy": 0.01, "pass@1": 0.05}]
    # steps 1-5, accuracy 0.1 .. 0.5, 10 s each; step 5 is logged twice (a resume): the second row counts
    rows += [{"step": s, "reward/accuracy": s / 10, "time/step": 10.0, "response/length_mean": 20.0 + s}
             for s in range(1, 6)]
    rows += [{"step": 5, "reward/accuracy": 0.9, "time/step": 30.0, "response/length_mean": 40.0,
              "sampling/accuracy_sampled": 0.25}]
    rows += [{"step": 5, "event": "eval", "greedy": 0.2, "pass@1": 0.3}]
    _write(tmp_path / "run", rows)
    assert mod.main([str(tmp_path / "run"), "--window", "2", "--out", str(tmp_path / "t.md")]) == 0
    text = capsys.readouterr().out
    assert (tmp_path / "t.md").read_text() == text
    lines = text.splitlines()
    # (0.1 + 0.2) / 2, lengths 21, 22; (0.3 + 0.4) / 2; step 5: the later row (0.9, 30 s, 40 tokens)
    assert lines[2] == "| 1-2 | 0.150 | - | - | 21.5 | - | - | - | 10 |"
    assert lines[3] == "| 3-4 | 0.350 | - | - | 23.5 | - | - | - | 10 |"
    assert lines[4] == "| 5-5 | 0.900 | 0.250 | - | 40.0 | - | - | - | 30 |"
    assert "5 steps; sum of time/step 70 s (0.02 h)" in text
    assert "| 0 | 0.010 | 0.050 |" in text and "| 5 | 0.200 | 0.300 |" in text


def test_errors_name_the_file_and_line(mod, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": oops}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"metrics.jsonl:2: invalid JSON"):
        mod.main([str(run)])
    (run / "metrics.jsonl").write_text('{"loss": 1}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"metrics.jsonl:1: a metrics row needs an integer 'step'"):
        mod.main([str(run)])
    with pytest.raises(SystemExit, match=r"no such file"):
        mod.main([str(tmp_path / "nothing")])
    with pytest.raises(SystemExit, match=r"--window 0"):
        mod.main([str(run), "--window", "0"])
