"""Seeds and paired comparisons of a study (mathrl/ablate/compare.py), against hand-computed values.

Evaluation folders are written by hand: 6 held-out problems, n = 4. The initial model: greedy wrong,
1 sample of 4 right (pass@4 = 1, maj@4 = 0: the wrong answer wins the vote). GRPO, both seeds: greedy
right, 3 of 4 right (maj@4 = 1). RFT: seed 0 greedy-right on problems 0-2, seed 1 on problems 3-5. So,
seeds pooled per problem, GRPO - RFT = +0.5 on every problem (interval [0.5, 0.5]) and GRPO's maj@4
gain exceeds its pass@4 gain by exactly 1. Negative controls: a report that used one seed only, or
paired problems by file position, would not give these numbers (the files list problems in different
orders).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mathrl.ablate.compare import comparison_table, group_table, study_comparisons
from mathrl.ablate.report import write_study_report
from mathrl.ablate.study import load_study
from mathrl.config import ConfigError
from mathrl.eval.runner import EvalSettings, write_records
from mathrl.config.rules import inert_settings

IDS = [f"svamp/test/{i}" for i in range(6)]


def _rec(pid: str, greedy: bool, right: int) -> dict:
    samples = [{"text": "x", "extracted": "1" if j < right else "2", "correct": j < right, "finish_reason": "stop",
                "tokens": 3} for j in range(4)]
    return {"id": pid, "gold": "1", "samples": samples, "greedy": {"text": "x", "correct": greedy},
            "num_correct": right, "answer_class": [0 if j < right else 1 for j in range(4)],
            "correct_classes": [0] if right else []}


def _eval_folder(folder: Path, recs: list[dict]) -> None:
    write_records(folder / "svamp" / "samples.jsonl", recs)
    settings = EvalSettings(n=4, ks=(1, 4), greedy=True).to_dict()
    (folder / "summary.json").write_text(json.dumps({"model": "m", "settings": settings,
                                                     "benchmarks": {"svamp": {"problems": len(recs)}}}))


def _values(recs: list[dict]) -> dict:
    m = len(recs)
    return {"greedy": sum(r["greedy"]["correct"] for r in recs) / m, "pass@1": sum(r["num_correct"] for r in recs) / 4 / m}


@pytest.fixture()
def study(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({
        "study": {"out": str(tmp_path / "out"), "seeds": [0, 1], "compare": [["rft", "grpo"]]},
        "base": {"model": {"name": "embedded"}, "train": {"steps": 2}},
        "runs": [{"method": "rft"}, {"method": "grpo"}]}))
    s = load_study(p)
    out = Path(s.out)
    _eval_folder(out / "baseline-k", [_rec(i, False, 1) for i in IDS])
    runs = {"grpo-seed0": [_rec(i, True, 3) for i in IDS], "grpo-seed1": [_rec(i, True, 3) for i in reversed(IDS)],
            "rft-seed0": [_rec(i, n < 3, 1) for n, i in enumerate(IDS)],
            "rft-seed1": [_rec(i, n >= 3, 1) for n, i in reversed(list(enumerate(IDS)))]}
    for name, recs in runs.items():
        _eval_folder(out / name / "eval" / "step_000002", recs)
        (out / name / "DONE.json").write_text(json.dumps({
            "name": name, "method": name.split("-")[0], "final_step": 2, "baseline": "k", "steps": 2,
            "before": _values([_rec(i, False, 1) for i in IDS]), "after": _values(recs), "curve": [],
            "wall_train_s": 1.0, "wall_eval_s": 1.0, "tokens": 10, "eval_problems": 6,
            "eval_settings": {"n": 4, "temperature": 0.6, "top_p": 0.95, "max_tokens": 8}}))
    return s


def test_seeds_expand_into_groups_and_compare_is_checked(study, tmp_path):
    assert [(r.name, r.group) for r in study.runs] == [("rft-seed0", "rft"), ("rft-seed1", "rft"),
                                                       ("grpo-seed0", "grpo"), ("grpo-seed1", "grpo")]
    from mathrl.ablate.study import run_config

    assert [run_config(study, r).train.seed for r in study.runs] == [0, 1, 0, 1]
    assert study.compare == [("rft", "grpo")]
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"study": {"compare": [["rft", "ppo"]]}, "runs": [{"method": "rft"}]}))
    with pytest.raises(ConfigError, match="study.compare names 'ppo', which is not a run"):
        load_study(bad)
    bad.write_text(json.dumps({"study": {"seeds": [0, 0]}, "runs": [{"method": "rft"}]}))
    with pytest.raises(ConfigError, match="study.seeds = \\[0, 0\\]; allowed: a non-empty list of distinct"):
        load_study(bad)
    # a run's own seeds replace the study's for that run only
    one = tmp_path / "one.yaml"
    one.write_text(json.dumps({"study": {"seeds": [0, 1]}, "runs": [{"method": "rft"}, {"method": "grpo", "seeds": [3]}]}))
    s = load_study(one)
    assert [(r.name, r.group, run_config(s, r).train.seed) for r in s.runs] == \
        [("rft-seed0", "rft", 0), ("rft-seed1", "rft", 1), ("grpo-seed3", "grpo", 3)]
    one.write_text(json.dumps({"runs": [{"method": "grpo", "seeds": "0"}]}))
    with pytest.raises(ConfigError, match="run #1: seeds = '0'; allowed: a non-empty list"):
        load_study(one)


def test_paired_comparisons_pool_seeds_per_problem(study):
    from mathrl.ablate.report import collect

    comp = study_comparisons(study, collect(study), resamples=500)
    rows = {(r["kind"], r.get("group"), r["a"], r["b"], r["metric"]): r for r in comp["rows"]}
    g = rows[("vs before", None, "before", "grpo", "greedy")]
    assert (g["value_a"], g["value_b"], g["diff"], g["lo"], g["hi"], g["p_b_le_a"]) == (0.0, 1.0, 1.0, 1.0, 1.0, 0.0)
    assert rows[("vs before", None, "before", "grpo", "pass@4")]["diff"] == 0.0  # pass@4 was already 1
    mp = rows[("maj gain - pass gain", "grpo", "pass@4 gain", "maj@4 gain", "maj@4 - pass@4")]
    assert (mp["diff"], mp["lo"], mp["hi"]) == (1.0, 1.0, 1.0)
    # RFT seeds pooled: 0.5 on every problem, so GRPO - RFT is exactly +0.5 with no spread; one seed only
    # (or problems paired by position: the files list them in other orders) would give a spread
    pair = rows[("pair", None, "rft", "grpo", "greedy")]
    assert (pair["value_a"], pair["value_b"], pair["diff"], pair["lo"], pair["hi"]) == (0.5, 1.0, 0.5, 0.5, 0.5)
    r = rows[("vs before", None, "before", "rft", "greedy")]
    assert r["diff"] == 0.5 and r["lo"] == r["hi"] == 0.5
    table = comparison_table(comp)
    assert "| grpo vs rft | greedy | 50.0 | 100.0 | +50.0 | [+50.0, +50.0] | 0.000 | yes |" in table
    assert "| grpo: maj@4 gain vs pass@4 gain | maj@4 - pass@4 |" in table
    assert "| rft | rft | 2 | 50.0 (50.0, 50.0) |" in group_table(comp)


@pytest.mark.slow
def test_report_has_the_comparison_section(study):
    data = write_study_report(study, log=lambda m: None)
    md = Path(study.out, "report.md").read_text()
    assert "## Groups (seeds pooled) and paired comparisons" in md and "| grpo vs rft | greedy |" in md
    assert json.loads(Path(study.out, "report.json").read_text())["comparisons"]["rows"] == data["comparisons"]["rows"]
    # a missing samples file is reported, not a crash
    (Path(study.out) / "rft-seed1" / "eval" / "step_000002" / "svamp" / "samples.jsonl").unlink()
    write_study_report(study, log=lambda m: None)
    assert "Comparisons not computed" in Path(study.out, "report.md").read_text()


@pytest.mark.slow
def test_command_line_overrides_reach_every_run_and_the_worker_commands(tmp_path, shared_data, capsys):
    from mathrl.ablate.cli import main as ablate_main
    from mathrl.ablate.study import run_config

    path = Path(__file__).resolve().parents[2] / "configs" / "ablations" / "wordproblems_cpu.yaml"
    asdiv = str(shared_data / "asdiv" / "test.jsonl")
    s = load_study(path, out=tmp_path / "o", overrides=[f"data.path={asdiv}"])
    assert [r.group for r in s.runs][:10:2] == ["rft", "online_rft", "grpo", "ppo", "grpo-iterative"]
    # the GRPO-family rows: one seed each (the run's own `seeds`), compared with GRPO
    assert [r.name for r in s.runs][10:] == ["grpo-dynamic_sampling-seed0", "grpo-mb2-seed0",
                                             "grpo-mb2-clip_higher-seed0", "grpo-dr_grpo-seed0"]
    assert {("grpo", "grpo-dr_grpo"), ("grpo-mb2", "grpo-mb2-clip_higher")} <= {tuple(p) for p in s.compare}
    assert len(s.runs) == 14 and {run_config(s, r).data.path for r in s.runs} == {asdiv}
    c = run_config(s, s.run("grpo-iterative-seed1"))
    assert (c.train.seed, c.algo.ref_update_every, c.train.lr, c.data.eval_source, c.data.eval_limit) == \
        (1, 5, 1e-5, "svamp", 500)
    assert {run_config(s, r).train.lr for r in s.runs} == {1e-5}  # one rate for every method
    assert {run_config(s, r).model.autocast for r in s.runs} == {"off"}  # one precision, whatever the CPU
    assert [r.name for r in s.runs if run_config(s, r).algo.dynamic_sampling] == ["grpo-dynamic_sampling-seed0"]
    # clip-higher against the same GRPO with 4 updates per step, where the clip can act (not on one update)
    higher, mb2 = run_config(s, s.run("grpo-mb2-clip_higher-seed0")), run_config(s, s.run("grpo-mb2-seed0"))
    assert (higher.algo.clip_high, higher.train.mini_batch_size, mb2.algo.clip_high) == (0.28, 2, 0.2)
    assert [r.name for r in s.runs if inert_settings(run_config(s, r))] == []
    assert ablate_main([str(path), "--print-commands", "--out", str(tmp_path / "o"), f"data.path={asdiv}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 15 and all(line.endswith(f"data.path={asdiv}") for line in lines)
    with pytest.raises(ConfigError, match="override 'nonsense' \\(command line\\) must look like key.sub=value"):
        load_study(path, overrides=["nonsense"])
