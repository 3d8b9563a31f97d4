"""`mathrl eval` end to end with a tiny model and the real engine, verifier and data files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mathrl.cli import main as mathrl_main
from mathrl.config import ConfigError, load_config
from mathrl.eval.records import read_records

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, embedded_model_path):
    from mathrl.models import load_tokenizer
    from mathrl.testing.tiny import save_tiny_model

    d = tmp_path_factory.mktemp("tiny") / "model"
    save_tiny_model(d, load_tokenizer(str(embedded_model_path)), seed=0)
    return d


@pytest.mark.slow
def test_gsm8k_20_problems_end_to_end(tiny_dir, shared_data, tmp_path, capsys):
    out = tmp_path / "run"
    rc = mathrl_main(["eval", "--model", str(tiny_dir), "--benchmarks", "gsm8k", "--data-dir", str(shared_data),
                      "--limit", "20", "--n", "4", "--max-tokens", "6", "--backend", "hf", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "gsm8k" in printed and "pass@4" in printed and "maj@4" in printed
    summary = json.loads((out / "summary.json").read_text())
    g = summary["benchmarks"]["gsm8k"]
    assert g["problems"] == 20 and g["samples"] == 80
    assert set(g["metrics"]) == {"greedy", "pass@1", "pass@2", "pass@4", "maj@2", "maj@4"}
    assert summary["settings"]["ks"] == [1, 2, 4]  # --n without --k: powers of two up to n
    # 6 tokens of a random model: every sample is cut at the limit
    assert g["truncation_rate"] == 1.0 and g["mean_length"] == 6.0
    for name in ("report.md", "pass_at_k.png", "maj_at_k.png"):
        assert (out / name).stat().st_size > 0, name
    recs = read_records(out / "gsm8k" / "samples.jsonl.gz")
    assert len(recs) == 20 and recs[0]["id"] == "gsm8k/test/0"
    assert recs[0]["gold"] == "18"  # GSM8K test row 0: Janet's ducks
    s0 = recs[0]["samples"][0]
    assert {"text", "extracted", "correct", "reason", "finish_reason", "tokens"} <= set(s0)
    assert "greedy" in recs[0] and len(recs[0]["answer_class"]) == 4
    assert "| gsm8k | 20 |" in (out / "report.md").read_text()

    # comparing a run with itself: paired differences are exactly 0
    rc = mathrl_main(["eval", "--compare", str(out), str(out), "--out", str(tmp_path / "cmp")])
    assert rc == 0
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    row = cmp["benchmarks"]["gsm8k"]["metrics"]["pass@1"]
    assert row["paired"] and row["diff"] == 0 and row["diff_ci"] == [0, 0]
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0


@pytest.mark.slow
def test_config_mode_uses_heldout_synthetic_set_and_series(tiny_dir, tmp_path, capsys):
    # a training-run-like folder with two checkpoints holding the tiny model
    import shutil

    run = tmp_path / "train_run"
    for step in (1, 2):
        shutil.copytree(tiny_dir, run / "checkpoints" / f"step_{step:06d}" / "policy")
    (run / "checkpoints" / ".tmp-step_000003").mkdir()  # incomplete: ignored
    out = tmp_path / "series"
    rc = mathrl_main(["eval", "--config", str(REPO / "configs" / "demo.yaml"), f"model.name={tiny_dir}",
                      "rollout.backend=hf", "--limit", "2", "--n", "2", "--max-tokens", "3", "--no-greedy",
                      "--series", str(run), "--out", str(out)])
    assert rc == 0
    series = json.loads((out / "series.json").read_text())
    assert [p["step"] for p in series["points"]] == [0, 1, 2]
    assert all(set(p["benchmarks"]) == {"synthetic"} for p in series["points"])
    assert (out / "series.png").stat().st_size > 0
    sub = json.loads((out / "step_000001" / "summary.json").read_text())
    assert sub["benchmarks"]["synthetic"]["problems"] == 2 and "greedy" not in sub["benchmarks"]["synthetic"]["metrics"]
    ids = [r["id"] for r in read_records(out / "step_000001" / "synthetic" / "samples.jsonl.gz")]
    assert all(i.startswith("synthetic/test/") for i in ids)


def test_heldout_set_of_demo_config_is_disjoint_from_training():
    from mathrl.data.synthetic import generate
    from mathrl.data.splits import heldout_problems

    cfg = load_config(REPO / "configs" / "demo.yaml")
    name, problems = heldout_problems(cfg)
    assert name == "synthetic" and len(problems) == cfg.data.eval_limit
    train = {p.question for p in generate(cfg.data.synthetic_size, cfg.data.synthetic_level, cfg.train.seed)}
    assert not any(p.question in train for p in problems)  # a separate stream, not a slice of training data
    assert all(p.meta["level"] == cfg.data.synthetic_level for p in problems)
    assert all(p.id.startswith("synthetic/test/") for p in problems)


@pytest.mark.parametrize("argv,needle", [
    (["--benchmarks", "gsm9k"], "unknown benchmark 'gsm9k'"),
    (["--n", "4", "--k", "1,8"], "eval.k"),
    (["--benchmarks", "gsm8k", "--data-dir", "/nonexistent"], "does not exist"),
    (["--temperature", "-1"], "eval.temperature"),
    (["--suite", "no_such_suite"], "no such suite"),
    (["--compare", "/nonexistent_a", "/nonexistent_b"], "no summary.json"),
    (["--benchmarks", "gsm8k", "--suite", "smoke"], "either --benchmarks or --suite"),
    (["eval.nn=3"], "unknown key 'eval.nn'"),
])
def test_bad_options_are_one_line_errors(argv, needle, capsys):
    rc = mathrl_main(["eval", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert needle in err and len(err.splitlines()) == 1, err


def test_suites_load(tmp_path):
    from mathrl.eval.benchmarks import SUITE_DIR, load_suite

    names = sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))
    assert {"smoke", "embedded", "standard"} <= set(names)
    for n in names:
        suite = load_suite(n)
        assert suite["benchmarks"] and all(1 <= k <= suite["n"] for k in suite["k"])
    emb = load_suite("embedded")
    lvl = [s for s in emb["benchmarks"] if s.name == "math500_level1"][0]
    assert lvl.benchmark.name == "math500" and lvl.where == {"level": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text("benchmarks: [gsm8k]\nsamples: 3\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_suite(str(bad))


def test_math500_level_filter(shared_data):
    from mathrl.eval.benchmarks import load_suite, load_benchmark

    spec = [s for s in load_suite("embedded")["benchmarks"] if s.name == "math500_level1"][0]
    problems = load_benchmark(spec, shared_data)
    assert len(problems) == 43  # MATH-500 has 43 level-1 problems
    assert all(p.meta["level"] == 1 for p in problems)


@pytest.mark.parametrize("argv,n,ks", [
    (["--suite", "embedded", "--n", "4"], 4, [1, 2, 4]),       # suite k (1,4,8) no longer fits: powers of 2
    (["--suite", "standard"], 16, [1, 4, 16]),
    (["--suite", "standard", "--n", "32"], 32, [1, 4, 16]),    # suite k still fits: kept
    (["--n", "16", "--k", "1,16"], 16, [1, 16]),
    (["--config", str(REPO / "configs" / "demo.yaml")], "demo", "demo"),   # the recipe's own eval section
])
def test_sampling_settings_resolution(argv, n, ks):
    from mathrl.eval.cli import build_parser, resolve

    cfg, _ = resolve(build_parser().parse_args(argv))
    if n == "demo":
        import yaml

        recipe = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())["eval"]
        n, ks = recipe["n"], recipe["k"]
    assert cfg.eval.n == n and cfg.eval.k == ks


def test_a_failed_evaluation_leaves_no_empty_out_folder(tmp_path, capsys):
    """Issue 38 point 15: a model that cannot load left an empty --out folder behind."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    out = tmp_path / "out"
    rc = mathrl_main(["eval", "--model", str(tmp_path / "no_such_model"), "--benchmarks", f"gsm8k={data}",
                      "--out", str(out), "--backend", "hf"])
    assert rc == 2 and "no_such_model" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()  # a folder the user made stays
    assert mathrl_main(["eval", "--model", str(tmp_path / "no_such_model"), "--benchmarks", f"gsm8k={data}",
                        "--out", str(out), "--backend", "hf"]) == 2
    assert out.is_dir()


def test_your_own_file_is_a_benchmark(tiny_dir, tmp_path, capsys):
    """Issue 38 point 12: `--benchmarks jsonl=FILE` was refused (`unknown benchmark 'jsonl'`)."""
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                            for a in range(3)))
    out = tmp_path / "out"
    rc = mathrl_main(["eval", "--model", str(tiny_dir), "--benchmarks", f"jsonl={data}", "--n", "1", "--k", "1",
                      "--max-tokens", "4", "--backend", "hf", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmarks"]["jsonl"]["problems"] == 3
    golds = [r["gold"] for r in read_records(out / "jsonl" / "samples.jsonl.gz")]
    assert golds == ["1", "2", "3"]
    assert mathrl_main(["eval", "--model", str(tiny_dir), "--benchmarks", "jsonl"]) == 2
    assert "give your file as jsonl=FILE" in capsys.readouterr().err
    help_text = subprocess_help()
    assert "jsonl=my.jsonl" in help_text and "adapter" in help_text


def subprocess_help() -> str:
    from mathrl.eval.cli import build_parser

    return build_parser().format_help()


def test_an_evaluation_in_a_log_prints_progress_lines(tiny_dir, tmp_path, capsys, monkeypatch):
    """Issue 38 point 10: with output to a log (not a terminal) an evaluation was silent until it ended.
    Here the thresholds are 0 s, so every chunk prints its line (a real run: after 10 s, every 30 s)."""
    import mathrl.progress

    monkeypatch.delenv("MATHRL_PROGRESS", raising=False)
    monkeypatch.setattr(mathrl.progress, "LINE_AFTER", 0.0)
    monkeypatch.setattr(mathrl.progress, "LINE_EVERY", 0.0)
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                            for a in range(6)))
    rc = mathrl_main(["eval", "--model", str(tiny_dir), "--benchmarks", f"jsonl={data}", "--n", "1", "--k", "1",
                      "--max-tokens", "2", "--backend", "hf", "--out", str(tmp_path / "out"), "eval.chunk_rows=2"])
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    lines = [x for x in err.splitlines() if x.startswith("mathrl: [jsonl] generating: ")]
    assert [x.split(": ", 2)[2].split(" problem")[0] for x in lines] == ["2/6", "4/6", "6/6"], err[-2000:]


def test_series_reads_the_runs_own_config(tiny_dir, tmp_path, capsys):
    """Issue 38 point 11: --series evaluated with the defaults (256 tokens, backend auto) where the run used
    its own settings, unless --config was given; now the run's config.yaml is read."""
    import shutil

    from mathrl.config import dump_yaml

    run = tmp_path / "train_run"
    shutil.copytree(tiny_dir, run / "checkpoints" / "step_000001" / "policy")
    cfg = load_config(REPO / "configs" / "demo.yaml", [f"model.name={tiny_dir}", "rollout.backend=hf",
                                                       "eval.max_tokens=3", "eval.n=2", "eval.k=1,2",
                                                       "eval.greedy=false", "data.eval_limit=2"])
    (run / "config.yaml").write_text(dump_yaml(cfg))
    out = tmp_path / "series"
    assert mathrl_main(["eval", "--series", str(run), "--out", str(out)]) == 0
    assert f"settings from {run / 'config.yaml'}" in capsys.readouterr().err
    sub = json.loads((out / "step_000001" / "summary.json").read_text())
    assert sub["settings"]["max_tokens"] == 3 and sub["settings"]["n"] == 2
    assert sub["benchmarks"]["synthetic"]["problems"] == 2 and sub["backend"] == "HFRolloutEngine"
