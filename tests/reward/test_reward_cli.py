from __future__ import annotations

import json

from mathrl.reward.cli import main


def test_single(capsys):
    assert main(["--gold", "\\frac{1}{2}", "--response", "The answer is 0.5."]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CORRECT") and "reason=ok" in out
    assert main(["--gold", "3", "--response", "4 * 3 = 12 and", "--truncated"]) == 0
    assert "no_answer" in capsys.readouterr().out


def test_file_report(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    rows = [{"gold": "3", "response": "\\boxed{3}", "equivalent": True},
            {"gold": "3", "response": "\\boxed{4}", "equivalent": False},
            {"gold": "\\frac{1}{3}", "response": "\\boxed{0.33}", "equivalent": True}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["--file", str(p)]) == 0
    out = capsys.readouterr().out
    assert "accuracy: 66.67% (2/3)" in out
    assert "line 3: label=True verdict=False" in out
    assert "not equivalent" in out


def test_bad_lines_name_file_and_line(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"gold": "1", "response": "1"}\n{"gold": [1], "response": "x"}\n')
    assert main(["--file", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mathrl verify: error: ") and f"{p}:2" in err
    assert "'gold' must be a string or a number, got list" in err
    p.write_text('{"gold": "1", "response": "1"}\n{"gold": " ", "response": "x"}\n')
    assert main(["--file", str(p)]) == 2
    assert f"{p}:2: key 'gold' is empty" in capsys.readouterr().err
    p.write_text('{"gold": "1", "response": "1"}\nnot json\n')
    assert main(["--file", str(p)]) == 2
    assert f"{p}:2: not valid JSON" in capsys.readouterr().err
    p.write_text('{"gold": "1"}\n')
    assert main(["--file", str(p)]) == 2
    assert "missing key 'response'" in capsys.readouterr().err
    assert main(["--gold", "1"]) == 2


def test_numeric_gold_and_empty_gold(tmp_path, capsys):
    """Issue 38 point 9: a numeric gold in a case file was refused (`key 'gold' must be a string, got int`);
    an empty --gold printed `WRONG reason=error` with exit 0."""
    p = tmp_path / "n.jsonl"
    p.write_text('{"gold": 72, "response": "so \\\\boxed{72}", "equivalent": true}\n'
                 '{"gold": 0.5, "response": "The answer is 1/2.", "equivalent": true}\n')
    assert main(["--file", str(p)]) == 0
    assert "accuracy: 100.00% (2/2)" in capsys.readouterr().out
    assert main(["--gold", "", "--response", "42"]) == 2
    assert capsys.readouterr().err.strip() == "mathrl verify: error: --gold is empty; give the reference answer"
