"""Every source's loader on the real files in ../shared/data, and on hand-made .json/.parquet/.jsonl files."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mathrl.data import DataError, Problem, last_boxed, load_problems, load_source, source_names

ROW_COUNTS = [
    ("gsm8k", "gsm8k/train.jsonl", 7473),
    ("gsm8k", "gsm8k/test.jsonl", 1319),
    ("math500", "math500/test.jsonl", 500),
    ("minerva_math", "minerva_math/test.jsonl", 272),
    ("aime24", "aime24/test.jsonl", 30),
    ("amc23", "amc23/test.jsonl", 40),
    ("svamp", "svamp/test.jsonl", 1000),
    ("asdiv", "asdiv/test.jsonl", 2215),
]


@pytest.mark.parametrize(("source", "rel", "rows"), ROW_COUNTS)
def test_row_counts_and_records(data_dir: Path, source: str, rel: str, rows: int) -> None:
    problems = load_problems(source, data_dir / rel)
    assert len(problems) == rows
    assert len({p.id for p in problems}) == rows  # ids unique
    for p in problems:
        assert isinstance(p, Problem) and p.source == source
        assert p.question.strip() == p.question and p.question
        assert p.gold and p.gold.strip() == p.gold
        assert p.meta["location"].startswith(str(data_dir / rel) + ":")


def test_gsm8k_known_rows(data_dir: Path) -> None:
    test = load_problems("gsm8k", data_dir / "gsm8k/test.jsonl")
    assert test[0].id == "gsm8k/test/0"
    assert test[0].question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert test[0].gold == "18"
    assert test[1].gold == "3"
    # line 147 of test.jsonl ends with "#### 2,125": the comma is removed
    assert test[146].gold == "2125"
    assert test[146].meta["location"].endswith("test.jsonl:147")
    assert "#### 2,125" in test[146].meta["solution"]
    train = load_problems("gsm8k", data_dir / "gsm8k", split="train")
    assert train[0].id == "gsm8k/train/0" and train[0].gold == "72"
    assert all(p.gold.lstrip("-").isdigit() for p in train)


def test_math500_known_rows(data_dir: Path) -> None:
    problems = load_problems("math500", data_dir / "math500/test.jsonl")
    p = problems[0]
    assert p.question.startswith("Convert the point $(0,3)$ in rectangular coordinates")
    assert p.gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert p.meta["subject"] == "Precalculus" and p.meta["level"] == 2
    # the answer field equals the last \boxed{} of the solution on every row (8 rows box twice)
    assert all(last_boxed(q.meta["solution"]) == q.gold for q in problems)
    assert sum(q.meta["solution"].count("\\boxed") > 1 for q in problems) == 8


def test_math_source_on_math500_file(data_dir: Path) -> None:
    # the full-MATH mapping reads MATH-500 rows too (same field names)
    problems = load_problems("math", data_dir / "math500/test.jsonl", limit=5)
    assert [p.source for p in problems] == ["math"] * 5
    assert problems[0].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_minerva_known_rows(data_dir: Path) -> None:
    problems = load_problems("minerva_math", data_dir / "minerva_math")
    assert problems[0].gold == "1.6"
    assert problems[0].meta["subject"] == "Introduction to Astronomy (8.282J Spring 2006)"
    # row 12: nested braces inside the box
    assert problems[12].gold == (
        "\\frac{2 \\pi c^{2} R^{2}}{\\lambda^{5}\\left[e^{h c /(\\lambda k T)}-1\\right] d^{2}}"
    )


def test_aime_amc_svamp_asdiv_known_rows(data_dir: Path) -> None:
    aime = load_problems("aime24", data_dir / "aime24/test.jsonl")
    assert aime[0].gold == "204" and aime[0].meta["orig_id"] == 60
    assert aime[7].gold == "25" and aime[7].meta["answer_raw"] == "025"  # leading zero dropped
    amc = load_problems("amc23", data_dir / "amc23/test.jsonl")
    assert amc[0].gold == "27" and amc[3].gold == "3159" and amc[15].gold == "-1"
    assert all("." not in p.gold for p in amc)
    svamp = load_problems("svamp", data_dir / "svamp/test.jsonl")
    assert svamp[0].gold == "145"
    assert svamp[0].question == (
        "There are 87 oranges and 290 bananas in Philip's collection. If the bananas are organized into "
        "2 groups and oranges are organized into 93 groups. How big is each group of bananas?"
    )
    assert svamp[0].meta["orig_id"] == "chal-777"
    asdiv = load_problems("asdiv", data_dir / "asdiv/test.jsonl")
    assert asdiv[0].question == (
        "Seven red apples and two green apples are in the basket. How many apples are in the basket?"
    )
    assert asdiv[0].gold == "9" and asdiv[0].meta["unit"] == "apples"
    assert asdiv[1].gold == "15"
    by_raw = {p.meta["answer_raw"]: p.gold for p in asdiv}
    assert by_raw["3:30 p.m."] == "3:30 p.m." and by_raw["-(1/3)"] == "-(1/3)"
    # a body that ends mid-sentence runs on into its question (821 of 2215 end with a comma), and a quote
    # that closes a sentence is not followed by a second period
    assert not [p.question for p in asdiv if ",." in p.question or '."." ' in p.question]
    runs_on = [p.question for p in asdiv if ", how many" in p.question]
    assert len(runs_on) > 500
    assert any(q.endswith("Greek Mythology: Fast Facts.\" How many days did it take Charles to finish the book?")
               or 'Fast Facts." How many' in q for q in (p.question for p in asdiv))


# ----------------------------------------------------------------------------- local file formats

MATH_ROWS = [
    {"problem": "What is $1+1$?", "solution": "We get $\\boxed{2}$.", "level": "Level 1", "type": "Algebra"},
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 2",
     "type": "Prealgebra"},
    {"problem": "Odd level", "solution": "\\boxed{x^{2}}", "level": "Level ?", "type": "Geometry"},
]


def _check_math(problems: list[Problem]) -> None:
    assert [p.gold for p in problems] == ["2", "\\frac{1}{2}", "x^{2}"]
    assert [p.meta["level"] for p in problems] == [1, 2, None]
    assert problems[2].meta["level_raw"] == "Level ?"
    assert [p.meta["subject"] for p in problems] == ["Algebra", "Prealgebra", "Geometry"]


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(MATH_ROWS, indent=2))
    problems = load_problems("math", path)
    _check_math(problems)
    assert problems[0].id == "math/rows/0"  # a file's stem labels the split
    # each element keeps the line it starts on
    assert problems[1].meta["location"] == f"{path}:{json.dumps(MATH_ROWS, indent=2).splitlines().index('  {', 2) + 1}"


def test_json_data_object_and_jsonl_named_json(tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": 1, "data": MATH_ROWS}))
    _check_math(load_problems("math", wrapped))
    lines = tmp_path / "lines.json"
    lines.write_text("\n".join(json.dumps(r) for r in MATH_ROWS) + "\n")
    _check_math(load_problems("math", lines))


def test_parquet_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(MATH_ROWS), path)
    problems = load_problems("math", path)
    _check_math(problems)
    assert problems[2].meta["location"] == f"{path} row 3"
    # a folder resolves <split>.parquet
    assert [p.gold for p in load_problems("math", tmp_path, split="test")] == [p.gold for p in problems]


def test_gsm8k_parquet_and_json_match_jsonl(data_dir: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (data_dir / "gsm8k/test.jsonl").read_text().splitlines()[:50]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    (tmp_path / "test.json").write_text(json.dumps(rows))
    ref = [(p.question, p.gold) for p in load_problems("gsm8k", data_dir / "gsm8k/test.jsonl", limit=50)]
    assert [(p.question, p.gold) for p in load_problems("gsm8k", tmp_path / "test.parquet")] == ref
    assert [(p.question, p.gold) for p in load_problems("gsm8k", tmp_path / "test.json")] == ref


def test_limit_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    rows = [{"question": f"q{i}", "answer": f"w\n#### {i}"} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[2:]))
    problems = load_problems("gsm8k", path)
    assert [p.gold for p in problems] == ["0", "1", "2", "3", "4"]
    assert problems[2].meta["location"] == f"{path}:4"  # the blank line 3 is passed over
    assert [p.gold for p in load_problems("gsm8k", path, limit=2)] == ["0", "1"]
    assert load_problems("gsm8k", path, limit=0) == []


# ----------------------------------------------------------------------------- bad rows


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"question": "q", "answer": "w\n#### 4"})


@pytest.mark.parametrize(
    ("bad_line", "field", "reason"),
    [
        (json.dumps({"question": "q"}), "answer", "missing"),
        (json.dumps({"answer": "#### 3"}), "question", "missing"),
        (json.dumps({"question": "q", "answer": "the answer is 3"}), "answer", "no '####' marker"),
        (json.dumps({"question": "q", "answer": "work\n####  "}), "answer", "nothing after"),
        (json.dumps({"question": "", "answer": "#### 3"}), "question", "is empty"),
        (json.dumps({"question": 5, "answer": "#### 3"}), "question", "expected text, got int"),
        ('{"question": "q", "answer": ', "<json>", "invalid JSON"),
        ("[1, 2]", "<row>", "expected a JSON object"),
    ],
)
def test_bad_row_names_file_line_and_field(tmp_path: Path, bad_line: str, field: str, reason: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", [GOOD, GOOD, bad_line, GOOD])
    with pytest.raises(DataError) as info:
        load_problems("gsm8k", path)
    msg = str(info.value)
    assert f"{path}:3: field '{field}'" in msg
    assert reason in msg


@pytest.mark.parametrize(
    ("source", "row", "field", "reason"),
    [
        ("math", {"problem": "p", "solution": "no box"}, "solution", "no complete \\boxed"),
        ("math", {"problem": "p", "solution": "\\boxed{}"}, "solution", "is empty"),
        ("math", {"problem": "p", "solution": "truncated \\boxed{\\frac{1}{2}"}, "solution", "no complete"),
        ("math", {"problem": "p"}, "answer", "no 'solution'"),
        ("minerva_math", {"problem": "p", "solution": "x = 3"}, "solution", "no complete \\boxed"),
        ("aime24", {"problem": "p", "answer": ""}, "answer", "empty gold"),
        ("amc23", {"problem": "p", "answer": None}, "answer", "missing"),
        ("amc23", {"problem": "p", "answer": [1]}, "answer", "expected a number or text"),
        ("svamp", {"Body": "b", "Question": "q"}, "Answer", "missing"),
        ("asdiv", {"body": "b", "question": "q", "answer": " (apples)"}, "answer", "only a unit"),
    ],
)
def test_bad_gold_per_source(tmp_path: Path, source: str, row: dict, field: str, reason: str) -> None:
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps(row)])
    with pytest.raises(DataError) as info:
        load_problems(source, path)
    assert f"{path}:1: field '{field}'" in str(info.value)
    assert reason in str(info.value)


def test_skip_bad_rows_counts_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = [GOOD, '{"broken', GOOD, json.dumps({"question": "q", "answer": "no marker"}), GOOD]
    path = _write_lines(tmp_path / "mixed.jsonl", lines)
    with caplog.at_level(logging.WARNING, logger="mathrl.data"):
        result = load_source("gsm8k", path, skip_bad_rows=True)
    assert len(result.problems) == 3 and result.rows_read == 5
    assert [(b.location, b.field) for b in result.bad_rows] == [(f"{path}:2", "<json>"), (f"{path}:4", "answer")]
    assert "skipped 2 bad row(s) of 5" in caplog.text
    # ids stay tied to the row position, so skipping does not renumber
    assert [p.id for p in result.problems] == ["gsm8k/mixed/0", "gsm8k/mixed/2", "gsm8k/mixed/4"]
    assert len(load_problems("gsm8k", path, skip_bad_rows=True)) == 3


@pytest.mark.parametrize("bad_line", [4, 500])
def test_bad_utf8_is_reported_on_its_line_and_can_be_skipped(tmp_path: Path, bad_line: int) -> None:
    """Issue 38 point 6: the reader decoded buffered chunks, so a bad byte on line 500 was reported at
    line 346 (on line 4 at line 1) and --skip-bad-rows could not skip it."""
    good = GOOD.encode()
    lines = [good] * 600
    lines[bad_line - 1] = b'{"question": "caf\xe9", "answer": "#### 1"}'  # Latin-1, not UTF-8
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError) as info:
        load_problems("gsm8k", path)
    assert f"{path}:{bad_line}: " in str(info.value) and "not UTF-8 text: byte 0xe9" in str(info.value)
    result = load_source("gsm8k", path, skip_bad_rows=True)
    assert [(b.location, b.field) for b in result.bad_rows] == [(f"{path}:{bad_line}", "<utf-8>")]
    assert len(result.problems) == 599


def test_bad_utf8_in_a_json_array_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b'[\n {"question": "q", "answer": "#### 1"},\n {"question": "caf\xe9", "answer": "#### 2"}\n]\n')
    with pytest.raises(DataError, match=r"bad\.json:3: not UTF-8 text: byte 0xe9 at column 19"):
        load_problems("gsm8k", path)


def test_json_array_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[\n {"question": "q", "answer": "#### 1"},\n {"question": "q" "answer": 2}\n]\n')
    with pytest.raises(DataError, match=r"bad\.json:3: invalid JSON"):
        load_problems("gsm8k", path)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_problems("gsm8k", tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'; allowed: \.jsonl, \.json, \.parquet"):
        load_problems("gsm8k", tmp_path / "x.csv")
    with pytest.raises(DataError, match="no file for split 'validation'"):
        load_problems("gsm8k", tmp_path, split="validation")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows"):
        load_problems("gsm8k", tmp_path / "empty.jsonl")
    (tmp_path / "open.json").write_text('[{"question": "q", "answer": "#### 1"}')
    with pytest.raises(DataError, match=r"open\.json:1: the JSON array is not closed"):
        load_problems("gsm8k", tmp_path / "open.json")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        load_problems("gsm8k", tmp_path / "bad.parquet")


def test_unknown_source_and_options() -> None:
    with pytest.raises(DataError, match="unknown data source 'gsm9k'; known sources: aime24, amc23, asdiv"):
        load_problems("gsm9k")
    with pytest.raises(DataError, match="takes no options"):
        load_problems("gsm8k", "x.jsonl", level=3)
    with pytest.raises(DataError, match="limit must be"):
        load_problems("gsm8k", "x.jsonl", limit=-1)
    assert {"gsm8k", "math", "math500", "minerva_math", "aime24", "amc23", "svamp", "asdiv", "synthetic",
            "jsonl"} <= set(source_names())


def test_hub_path_fails_with_advice_offline(tmp_path: Path) -> None:
    """The hub code path runs datasets.load_dataset; offline it must end in a DataError with advice."""
    code = (
        "from mathrl.data import load_problems, DataError\n"
        "try:\n    load_problems('aime24')\n"
        "except DataError as e:\n    print('DATAERROR', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert "DATAERROR hub:HuggingFaceH4/aime_2024/train: cannot load" in out.stdout, out.stderr[-2000:]
    assert "--path" in out.stdout
