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


def test_one_data_folder_rule_in_every_command(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 38 point 4: `mathrl data show` and the training data ignored $MATHRL_DATA (only evaluation read
    it), and a suite's built-in data_dir won over it. Now every command reads $MATHRL_DATA/<source>/<split>.jsonl
    when no file is given; an explicit file still comes first."""
    from mathrl.config import load_config
    from mathrl.data.splits import load_training_problems
    from mathrl.cli import main as mathrl_main

    root = tmp_path / "data"
    for split, n in (("train", 3), ("test", 2)):
        (root / "gsm8k").mkdir(parents=True, exist_ok=True)
        (root / "gsm8k" / f"{split}.jsonl").write_text("".join(
            json.dumps({"question": f"{split} question {i}?", "answer": f"w\n#### {i + 40}"}) + "\n" for i in range(n)))
    monkeypatch.setenv("MATHRL_DATA", str(root))
    assert main(["show", "gsm8k", "--n", "5"]) == 0
    out = capsys.readouterr().out
    assert f"from {root / 'gsm8k' / 'test.jsonl'}: showing 2" in out and "test question 1?" in out
    problems = load_training_problems(load_config(None, ["data.source=gsm8k"]))
    assert [p.question for p in problems] == ["train question 0?", "train question 1?", "train question 2?"]
    explicit = tmp_path / "mine.jsonl"
    explicit.write_text(json.dumps({"question": "mine?", "answer": "w\n#### 1"}) + "\n")
    assert [p.question for p in load_training_problems(load_config(None, ["data.source=gsm8k",
                                                                         f"data.path={explicit}"]))] == ["mine?"]
    # a suite's own data_dir (smoke: ../shared/data) comes after $MATHRL_DATA: without gsm8k/test.jsonl here the
    # suite stops naming this folder, before any model work
    (root / "gsm8k" / "test.jsonl").unlink()
    assert mathrl_main(["eval", "--suite", "smoke", "--model", "embedded", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'gsm8k' / 'test.jsonl'} does not exist (data dir {root})" in err, err[-2000:]
