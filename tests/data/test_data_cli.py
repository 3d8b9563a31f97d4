"""``mathrl data show|stats|sources`` through mathrl.data.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mathrl.data.cli import main


def test_show_gsm8k(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "gsm8k", "--path", str(data_dir / "gsm8k/test.jsonl"), "--n", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("\nid:       gsm8k/test/") == 3
    assert "gold:     18" in out and "Janet\u2019s ducks" in out
    assert "location: " in out and "solution: " in out


def test_stats_asdiv(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "asdiv", "--path", str(data_dir / "asdiv")]) == 0
    out = capsys.readouterr().out
    assert "problems:  2215" in out and "bad rows:  0" in out
    assert "gold kinds: integer 2023" in out


def test_stats_counts_bad_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{oops\n")
    assert main(["stats", "gsm8k", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    assert "problems:  1" in out and "bad rows:  1" in out and f"{path}:2: field '<json>'" in out
    # show stops at the bad row unless asked to skip
    assert main(["show", "gsm8k", "--path", str(path), "--n", "5"]) == 2
    assert f"{path}:2: field '<json>'" in capsys.readouterr().err
    assert main(["show", "gsm8k", "--path", str(path), "--n", "5", "--skip-bad-rows"]) == 0
    assert "bad rows skipped: 1 of 2" in capsys.readouterr().out


def test_synthetic_show_with_plain_template(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "synthetic", "--level", "1", "--seed", "4", "--n", "2", "--template", "fewshot_plain"]) == 0
    out = capsys.readouterr().out
    assert out.count("id:       synthetic/train/L1/s4/") == 2 and "expression: " in out
    assert "--- prompt (fewshot_plain) ---" in out
    assert main(["stats", "synthetic", "--level", "5", "--size", "40"]) == 0
    out = capsys.readouterr().out
    assert "problems:  40" in out and "gold kinds: integer 40" in out and "level: 5 40" in out


def test_errors_and_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "nope", "--path", "x.jsonl"]) == 2
    assert "unknown data source 'nope'" in capsys.readouterr().err
    assert main(["show", "gsm8k", "--path", "x.jsonl", "--level", "2"]) == 2
    assert "only apply to the 'synthetic' source" in capsys.readouterr().err
    assert main(["show", "synthetic", "--template", "chat_boxed"]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert main(["sources"]) == 0
    out = capsys.readouterr().out
    for name in ("gsm8k", "math", "math500", "minerva_math", "aime24", "amc23", "svamp", "asdiv", "synthetic"):
        assert f"  {name} " in out
    assert "openai/gsm8k" in out and "EleutherAI/hendrycks_math" in out
