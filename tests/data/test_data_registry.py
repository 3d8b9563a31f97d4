"""The one data registry: ``SOURCES`` drives ``load_problems``, ``mathrl data`` and the benchmarks.

* a source registered in ``SOURCES`` alone is a benchmark too (no second table);
* ``synthetic`` is an ordinary (generated) registry entry;
* ``jsonl`` reads a user's file with field names from ``fields=`` / ``data.fields``;
* ``benchmarks()`` is exactly the table it was before it was derived from the registry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.data import DataError, Problem, load_problems, load_source, source_names
from mathrl.data.cli import main as data_main
from mathrl.data.mappers import map_amc
from mathrl.data.sources import SOURCES, SourceSpec
from mathrl.data.synthetic import generate
from mathrl.eval.benchmarks import Benchmark, benchmarks, load_benchmark, parse_benchmarks

# The benchmark table as it was written out by hand before the benchmarks were derived from SOURCES
# (name, source, split, relpath, description), in its listing order.
BENCHMARK_TABLE = [
    ("gsm8k", "gsm8k", "test", "gsm8k/test.jsonl", "GSM8K test, 1319 grade-school word problems"),
    ("math500", "math500", "test", "math500/test.jsonl",
     "MATH-500 (subset of the MATH test set), with subject and level"),
    ("math", "math", "test", "math/test.jsonl", "full Hendrycks MATH test (5000), when present"),
    ("minerva_math", "minerva_math", "test", "minerva_math/test.jsonl", "Minerva OCW problems (272)"),
    ("aime24", "aime24", "test", "aime24/test.jsonl", "AIME 2024 (30)"),
    ("amc23", "amc23", "test", "amc23/test.jsonl", "AMC 2023 (40)"),
    ("svamp", "svamp", "test", "svamp/test.jsonl", "SVAMP (1000)"),
    ("asdiv", "asdiv", "test", "asdiv/test.jsonl", "ASDiv (2215)"),
    ("synthetic", "synthetic", "test", None, "the embedded synthetic arithmetic task, held-out draw"),
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------- (c) the table is unchanged


def test_benchmarks_unchanged_from_the_hand_written_table() -> None:
    assert [(b.name, b.source, b.split, b.relpath, b.description) for b in benchmarks().values()] == BENCHMARK_TABLE
    assert list(benchmarks()) == [row[0] for row in BENCHMARK_TABLE]
    assert benchmarks()["math500"] == Benchmark(*BENCHMARK_TABLE[1])
    assert "jsonl" not in benchmarks() and "nope" not in benchmarks()  # the generic reader has no eval split
    # every benchmark is a registered source with an eval split, and vice versa
    assert set(benchmarks()) == {n for n, s in SOURCES.items() if s.eval_split is not None}


def test_synthetic_is_an_ordinary_registry_entry() -> None:
    spec = SOURCES["synthetic"]
    assert spec.is_generated and spec.options == ("n", "level", "seed") and spec.hub_name is None
    assert load_problems("synthetic", n=6, level=2, seed=1) == generate(6, 2, 1)
    result = load_source("synthetic", split="test", n=3)
    assert result.origin == "synthetic" and result.split == "test" and result.rows_read == 3
    spec_b = parse_benchmarks("synthetic", limit=5)[0]
    spec_b.synthetic_level, spec_b.seed = 2, 7
    assert load_benchmark(spec_b) == generate(5, 2, 7, split="test")


# --------------------------------------------------------------------------- (a) one registry


@pytest.fixture
def toy_source():
    """A throwaway dataset registered in SOURCES only (and removed afterwards)."""
    spec = SourceSpec(
        name="toy_bench",
        description="a throwaway test dataset",
        fields=("problem", "answer"),
        question_rule="problem",
        gold_rule="answer",
        license="test",
        hub_name=None,
        map_row=map_amc,
        eval_description="toy benchmark (3)",
    )
    assert spec.name not in SOURCES
    SOURCES[spec.name] = spec
    try:
        yield spec
    finally:
        del SOURCES[spec.name]
    assert spec.name not in benchmarks()


def test_adding_a_source_makes_a_benchmark(toy_source: SourceSpec, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"problem": "What is 2+3?", "answer": 5}, {"problem": "What is 7*6?", "answer": "42"},
            {"problem": "Half of 9?", "answer": 4.5}]
    _write_jsonl(tmp_path / "toy_bench" / "test.jsonl", rows)
    b = benchmarks()["toy_bench"]
    assert b == Benchmark("toy_bench", "toy_bench", "test", "toy_bench/test.jsonl", "toy benchmark (3)")
    assert list(benchmarks())[-1] == "toy_bench"  # listed after every earlier source
    [spec] = parse_benchmarks("toy_bench")
    problems = load_benchmark(spec, tmp_path)
    assert [(p.id, p.question, p.gold, p.source) for p in problems] == [
        ("toy_bench/test/0", "What is 2+3?", "5", "toy_bench"),
        ("toy_bench/test/1", "What is 7*6?", "42", "toy_bench"),
        ("toy_bench/test/2", "Half of 9?", "4.5", "toy_bench"),
    ]
    assert load_problems("toy_bench", tmp_path / "toy_bench") == problems
    assert "toy_bench" in source_names()
    assert data_main(["sources"]) == 0
    assert "  toy_bench     a throwaway test dataset" in capsys.readouterr().out


def test_a_generated_source_registers_like_synthetic(tmp_path: Path) -> None:
    def count_up(split: str, n: int = 2, seed: int = 0) -> list[Problem]:
        return [Problem(f"counter/{split}/{i}", f"What is {seed}+{i}?", str(seed + i), "counter") for i in range(n)]

    spec = SourceSpec(name="counter", description="counting", fields=(), question_rule="-", gold_rule="-",
                      license="test", hub_name=None, map_row=None, local_file=None, generate=count_up,
                      options=("n", "seed"))
    SOURCES["counter"] = spec
    try:
        assert benchmarks()["counter"] == Benchmark("counter", "counter", "test", None, "counting")
        assert [p.gold for p in load_problems("counter", n=3, seed=4)] == ["4", "5", "6"]
        with pytest.raises(DataError, match="source 'counter' is generated, it reads no file"):
            load_problems("counter", tmp_path / "x.jsonl")
        bspec = parse_benchmarks("counter", limit=2)[0]
        bspec.seed = 10
        assert [p.id for p in load_benchmark(bspec)] == ["counter/test/0", "counter/test/1"]
    finally:
        del SOURCES["counter"]
    assert "counter" not in benchmarks()


# --------------------------------------------------------------------------- (b) the generic jsonl source


def test_jsonl_source_with_custom_field_names(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", [
        {"problem": "What is 1+1?", "final_answer": "2", "level": 1},
        {"problem": "Simplify 2/4.", "final_answer": " \\frac{1}{2} ", "level": 3},
        {"problem": "How many?", "final_answer": 12.0},
    ])
    fields = {"question": "problem", "answer": "final_answer"}
    problems = load_problems("jsonl", path, fields=fields)
    assert [(p.id, p.question, p.gold, p.source) for p in problems] == [
        ("jsonl/mine/0", "What is 1+1?", "2", "jsonl"),
        ("jsonl/mine/1", "Simplify 2/4.", "\\frac{1}{2}", "jsonl"),  # the answer as written (stripped)
        ("jsonl/mine/2", "How many?", "12", "jsonl"),
    ]
    assert problems[0].meta == {"level": 1, "location": f"{path}:1"}  # other fields kept as metadata
    assert len(load_problems("jsonl", path, "train", fields=fields, limit=2)) == 2
    # the default field names are question / answer
    plain = _write_jsonl(tmp_path / "plain.jsonl", [{"question": "q?", "answer": "7"}])
    assert [p.gold for p in load_problems("jsonl", plain)] == ["7"]
    assert [p.gold for p in load_problems("jsonl", plain, fields=None)] == ["7"]
    assert [p.gold for p in load_problems("jsonl", plain, fields={"answer": "answer"})] == ["7"]


def test_jsonl_missing_field_is_a_one_line_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", [
        {"problem": "What is 1+1?", "final_answer": "2"},
        {"problem": "What is 2+2?", "answer": "4"},
    ])
    with pytest.raises(DataError) as info:
        load_problems("jsonl", path, fields={"question": "problem", "answer": "final_answer"})
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:2: field 'final_answer': missing (fields present: ['answer', 'problem'])")
    assert "data.fields.answer=FIELD" in msg and "data.skip_bad_rows=true" in msg
    with pytest.raises(DataError, match=rf"{path}:1: field 'question': missing .*data\.fields\.question=FIELD"):
        load_problems("jsonl", path)
    result = load_source("jsonl", path, fields={"question": "problem", "answer": "final_answer"},
                         skip_bad_rows=True)
    assert len(result.problems) == 1 and [b.field for b in result.bad_rows] == ["final_answer"]


def test_fields_option_checks(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 3"}])
    assert [p.gold for p in load_problems("gsm8k", path, fields=None)] == ["3"]  # None = not given, any source
    with pytest.raises(DataError, match="source 'gsm8k' takes no options, got \\['fields'\\]"):
        load_problems("gsm8k", path, fields={"question": "q"})
    with pytest.raises(DataError, match=r"unknown role\(s\) \['gold'\]; allowed: question, answer"):
        load_problems("jsonl", path, fields={"gold": "answer"})
    with pytest.raises(DataError, match="unknown option\\(s\\) \\['level'\\] for source 'jsonl'"):
        load_problems("jsonl", path, level=2)
    with pytest.raises(DataError, match="source 'jsonl' has no hub location"):
        load_problems("jsonl")
    assert "jsonl" in source_names() and SOURCES["jsonl"].is_generic


def test_jsonl_parquet_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["What is 3*3?", "What is 5-1?"], "target": ["9", "4"]}), path)
    problems = load_problems("jsonl", path, fields={"question": "prompt", "answer": "target"})
    assert [p.gold for p in problems] == ["9", "4"] and problems[1].meta["location"] == f"{path} row 2"
    assert data_main(["show", "jsonl", "--path", str(path), "--field", "question=prompt",
                      "--field", "answer=target", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert "id:       jsonl/p/0" in out and "gold:     9" in out
    assert data_main(["show", "jsonl", "--path", str(path)]) == 2
    assert f"{path} row 1: field 'question': missing" in capsys.readouterr().err
    assert data_main(["show", "gsm8k", "--path", str(path), "--field", "question=prompt"]) == 2
    assert "--field only applies to the 'jsonl' source" in capsys.readouterr().err
    assert data_main(["sources"]) == 0
    assert "  jsonl " in capsys.readouterr().out


def test_data_fields_config() -> None:
    cfg = load_config(None, ["data.source=jsonl", "data.path=x.jsonl", "data.fields.question=problem",
                             "data.fields.answer=final_answer"])
    assert cfg.data.fields == {"question": "problem", "answer": "final_answer"}
    assert load_config(None, ["data.source=jsonl", "data.fields={question: p}"]).data.fields == {"question": "p"}
    assert load_config().data.fields is None
    with pytest.raises(ConfigError, match=r"data\.fields\.gold \(command line\): .*unknown role"):
        load_config(None, ["data.source=jsonl", "data.fields.gold=x"])
    with pytest.raises(ConfigError, match="only jsonl reads data.fields"):
        load_config(None, ["data.source=gsm8k", "data.fields.question=problem"])
