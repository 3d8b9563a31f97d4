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


def write_study(tmp_path: Path, study: dict, runs_yaml: list[dict], baselines: dict[str, list[dict]],
                runs: dict[str, tuple[str, list[dict]]]):
    """A loaded study whose runs are finished by hand: ``baselines`` key -> records of the initial model,
    ``runs`` name -> (its baseline key, its records)."""
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"study": {"out": str(tmp_path / "out"), **study},
                             "base": {"model": {"name": "embedded"}, "train": {"steps": 2}}, "runs": runs_yaml}))
    s = load_study(p)
    out = Path(s.out)
    for key, recs in baselines.items():
        _eval_folder(out / f"baseline-{key}", recs)
    for name, (key, recs) in runs.items():
        _eval_folder(out / name / "eval" / "step_000002", recs)
        (out / name / "DONE.json").write_text(json.dumps({
            "name": name, "method": name.split("-")[0], "final_step": 2, "baseline": key, "steps": 2,
            "before": _values(baselines[key]), "after": _values(recs), "curve": [],
            "wall_train_s": 1.0, "wall_eval_s": 1.0, "tokens": 10, "eval_problems": len(recs),
            "eval_settings": {"n": 4, "temperature": 0.6, "top_p": 0.95, "max_tokens": 8}}))
    return s


@pytest.fixture()
def study(tmp_path):
    runs = {"grpo-seed0": [_rec(i, True, 3) for i in IDS], "grpo-seed1": [_rec(i, True, 3) for i in reversed(IDS)],
            "rft-seed0": [_rec(i, n < 3, 1) for n, i in enumerate(IDS)],
            "rft-seed1": [_rec(i, n >= 3, 1) for n, i in reversed(list(enumerate(IDS)))]}
    return write_study(tmp_path, {"seeds": [0, 1], "compare": [["rft", "grpo"]]}, [{"method": "rft"}, {"method": "grpo"}],
                       {"k": [_rec(i, False, 1) for i in IDS]}, {name: ("k", recs) for name, recs in runs.items()})


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
    # the two-sided sign-flip p of six equal differences is 2 / 2^6; they have no spread, so the MDE is 0
    assert pair["p"] == 2 / 64 and pair["mde"] == 0.0 and not pair["seeds_differ"]
    table = comparison_table(comp)
    assert "| grpo vs rft | greedy | 2/2 | 50.0 | 100.0 | +50.0 | [+50.0, +50.0] | 0.031 | yes | 0.0 |" in table
    assert "| grpo: maj@4 gain vs pass@4 gain | maj@4 - pass@4 |" in table
    # each seed's value and the seed range: RFT's seeds are right on 3 of 6 problems each
    assert "| rft | rft | 2 | 50.0 (50.0, 50.0; 0.0) |" in group_table(comp)
    assert comp["contrasts"] == []  # no family declared: every row is exploratory


def test_each_seed_is_paired_with_its_own_evaluation_of_the_initial_model(tmp_path):
    """Seed 1's runs sample their evaluation with seed 1, so their "before" is baseline k1, not seed 0's k0.

    k0: greedy wrong, 1 of 4 right (pass@4 1, maj@4 0); k1: greedy right on problems 0-2, 2 of 4 right
    (pass@4 1, maj@4 1/2: a 2-2 tie). GRPO, both seeds: greedy right, 3 of 4 right (maj@4 1). Per problem,
    the pooled before is greedy (0 + 1) / 2 on problems 0-2 and 0 on 3-5: mean 0.25, so GRPO's greedy gain is
    0.75 (against seed 0's baseline alone: 1.0); its maj@4 gain is (1 + 0.5) / 2 = 0.75 and its pass@4 gain 0,
    so "maj gain - pass gain" is 0.75 (against k0 alone: 1.0)."""
    s = write_study(tmp_path, {"seeds": [0, 1], "primary_metric": "greedy", "contrasts": [["before", "grpo"]]},
                    [{"method": "grpo"}],
                    {"k0": [_rec(i, False, 1) for i in IDS], "k1": [_rec(i, n < 3, 2) for n, i in enumerate(IDS)]},
                    {"grpo-seed0": ("k0", [_rec(i, True, 3) for i in IDS]),
                     "grpo-seed1": ("k1", [_rec(i, True, 3) for i in IDS])})
    from mathrl.ablate.report import collect

    comp = study_comparisons(s, collect(s), resamples=200)
    rows = {(r["kind"], r["metric"]): r for r in comp["rows"]}
    g = rows[("vs before", "greedy")]
    assert (g["value_a"], g["value_b"], g["diff"]) == (0.25, 1.0, 0.75)
    assert rows[("vs before", "pass@4")]["diff"] == 0.0
    assert (rows[("vs before", "maj@4")]["value_a"], rows[("vs before", "maj@4")]["diff"]) == (0.25, 0.75)
    assert rows[("maj gain - pass gain", "maj@4 - pass@4")]["diff"] == 0.75
    assert comp["groups"]["grpo"]["baselines"] == ["k0", "k1"]
    assert comp["groups"]["grpo"]["before_seed_values"]["greedy"] == [0.0, 0.5]
    (c,) = comp["contrasts"]
    assert (c["value_a"], c["diff"], c["a_per_seed"], c["b_per_seed"]) == (0.25, 0.75, [0.0, 0.5], [1.0, 1.0])


IDS10 = [f"svamp/test/{i}" for i in range(10)]


def test_declared_contrasts_are_holm_corrected_and_give_their_mde(tmp_path):
    """Ten problems, one baseline (greedy wrong everywhere). GRPO (seeds 0, 1) and a one-seed row grpo-one:
    greedy right everywhere. RFT: seed 0 right on problem 0, seed 1 on problem 1 (pooled: 0.5 on two).

    Exact sign-flip p-values: GRPO vs before, ten differences of 1: 2 / 2^10; GRPO vs RFT, (0.5, 0.5, 1 x 8):
    only the all-equal signs reach |sum| 9: 2 / 2^10; RFT vs before, (0.5, 0.5, 0 x 8): 2 / 4 = 0.5;
    grpo-one vs GRPO: all zero, 1. Holm over the 4: sorted 2/1024 x 4 = 0.0078125, 2/1024 x 3 (kept at
    0.0078125), 0.5 x 2 = 1, 1 x 1 = 1. MDE of RFT vs before at Holm's first-step alpha 0.05 / 4:
    sd of the differences sqrt((2 x 0.4^2 + 8 x 0.1^2) / 9) = 0.2108185, (2.497705 + 0.841621) x 0.2108185 /
    sqrt(10) = 0.2226218."""
    runs = {"grpo-seed0": [_rec(i, True, 3) for i in IDS10], "grpo-seed1": [_rec(i, True, 3) for i in IDS10],
            "grpo-one-seed0": [_rec(i, True, 3) for i in IDS10],
            "rft-seed0": [_rec(i, n == 0, 1) for n, i in enumerate(IDS10)],
            "rft-seed1": [_rec(i, n == 1, 1) for n, i in enumerate(IDS10)]}
    s = write_study(tmp_path, {"seeds": [0, 1], "primary_metric": "greedy",
                               "contrasts": [["before", "grpo"], ["before", "rft"], ["rft", "grpo"], ["grpo", "grpo-one"]]},
                    [{"method": "rft"}, {"method": "grpo"}, {"method": "grpo", "name": "grpo-one", "seeds": [0]}],
                    {"k": [_rec(i, False, 1) for i in IDS10]}, {name: ("k", recs) for name, recs in runs.items()})
    from mathrl.ablate.compare import contrast_table
    from mathrl.ablate.report import collect

    comp = study_comparisons(s, collect(s), resamples=200)
    c = {(r["a"], r["b"]): r for r in comp["contrasts"]}
    assert [(r["a"], r["b"]) for r in comp["contrasts"]] == [("before", "grpo"), ("before", "rft"), ("rft", "grpo"),
                                                           ("grpo", "grpo-one")]
    assert [c[k]["p"] for k in c] == [2 / 1024, 0.5, 2 / 1024, 1.0]
    assert [c[k]["p_holm"] for k in c] == pytest.approx([0.0078125, 1.0, 0.0078125, 1.0])
    assert [c[k]["survives"] for k in c] == [True, False, True, False]
    r = c[("before", "rft")]
    assert r["diff"] == pytest.approx(0.1) and r["alpha"] == 0.0125
    assert r["mde"] == pytest.approx(0.2226218, abs=1e-6)
    assert r["verdict"] == "no difference larger than 22.3 points"
    assert (r["a_per_seed"], r["b_per_seed"]) == ([0.0, 0.0], [0.1, 0.1])
    assert c[("rft", "grpo")]["verdict"] == "grpo above rft"
    one = c[("grpo", "grpo-one")]
    assert (one["seeds_a"], one["seeds_b"], one["seeds_differ"]) == (2, 1, True)
    table = contrast_table(comp)
    assert ("| rft vs before | greedy | 2/2 | 0.0 (0.0, 0.0) | 10.0 (10.0, 10.0) | +10.0 | "
            in table and "| 0.5000 | 1.0000 | no | 22.3 | no difference larger than 22.3 points |" in table)
    assert "| grpo-one vs grpo | greedy | 2/1 (unequal) | 100.0 (100.0, 100.0) | 100.0 (100.0) |" in table
    assert "| 0.0020 | 0.0078 | yes | 0.0 | grpo above before |" in table


def test_a_contrast_of_an_incomplete_group_prints_no_p(tmp_path):
    """A declared contrast whose group has not run yet (a study in progress) is 'not computed': its p counts as 1
    in Holm's family, but the table prints '-' for it, not an adjusted p it never had."""
    s = write_study(tmp_path, {"seeds": [0], "primary_metric": "greedy",
                               "contrasts": [["before", "grpo"], ["before", "ppo"]]},
                    [{"method": "grpo"}, {"method": "ppo"}], {"k": [_rec(i, False, 1) for i in IDS10]},
                    {"grpo-seed0": ("k", [_rec(i, True, 3) for i in IDS10])})
    from mathrl.ablate.compare import contrast_table
    from mathrl.ablate.report import collect

    comp = study_comparisons(s, collect(s), resamples=200)
    done, pending = comp["contrasts"]
    assert done["p_holm"] == pytest.approx(2 * 2 / 1024) and not pending["computed"] and pending["p_holm"] == 1.0
    assert ("| ppo vs before | greedy | - | - | - | - | - | - | - | no | - | not computed (a group is not complete) |"
            in contrast_table(comp).splitlines())


@pytest.mark.slow
def test_report_has_the_comparison_section(study):
    data = write_study_report(study, log=lambda m: None)
    md = Path(study.out, "report.md").read_text()
    assert "## Groups (seeds pooled) and paired comparisons" in md and "| grpo vs rft | greedy |" in md
    assert "every comparison below is exploratory" in md and "pass@1 is estimated from n = 4 samples" in md
    assert json.loads(Path(study.out, "report.json").read_text())["comparisons"]["rows"] == data["comparisons"]["rows"]
    # a missing samples file is reported, not a crash
    (Path(study.out) / "rft-seed1" / "eval" / "step_000002" / "svamp" / "samples.jsonl").unlink()
    write_study_report(study, log=lambda m: None)
    assert "Comparisons not computed" in Path(study.out, "report.md").read_text()


@pytest.mark.slow
def test_kept_wordproblems_report_is_what_its_run_archives_give(tmp_path):
    """docs/ablations/wordproblems_cpu/report.md is the report `mathrl ablate ... --report-only` writes from the
    run folders archived beside it (declared contrasts, per-seed baselines and all): a change to the statistics
    regenerates the kept report in the same commit."""
    import tarfile

    root = Path(__file__).resolve().parents[2]
    kept = root / "docs" / "ablations" / "wordproblems_cpu"
    out = tmp_path / "wordproblems_cpu"
    out.mkdir()
    for archive in sorted((kept / "run_archives").glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter="data")
    s = load_study(root / "configs" / "ablations" / "wordproblems_cpu.yaml", out=out)
    write_study_report(s, log=lambda m: None)
    assert (out / "report.md").read_text() == (kept / "report.md").read_text()


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
    # the declared family: greedy on every compare pair and every group against the initial model
    assert s.primary_metric == "greedy" and len(s.contrasts) == 18
    assert set(s.contrasts) == set(s.compare) | {("before", g) for g in dict.fromkeys(r.group for r in s.runs)}
    assert len(s.runs) == 14 and {run_config(s, r).data.path for r in s.runs} == {asdiv}
    c = run_config(s, s.run("grpo-iterative-seed1"))
    assert (c.train.seed, c.algo.ref_update_every, c.train.lr, c.data.eval_source, c.data.eval_limit) == \
        (1, 5, 1e-5, "svamp", 500)
    assert {run_config(s, r).train.lr for r in s.runs} == {1e-5}  # one rate for every method
    assert {run_config(s, r).model.autocast for r in s.runs} == {"off"}  # one precision, whatever the CPU
    assert [r.name for r in s.runs if run_config(s, r).algo.dynamic_sampling] == ["grpo-dynamic_sampling-seed0"]
    # clip-higher against the same GRPO with 4 updates per step, where the clip can act (not on one update)
    higher, mb2 = run_config(s, s.run("grpo-mb2-clip_higher-seed0")), run_config(s, s.run("grpo-mb2-seed0"))
    assert (higher.algo.clip_high, higher.train.mini_batch_size, mb2.clip_high) == (0.28, 2, 0.2)
    assert [r.name for r in s.runs if inert_settings(run_config(s, r))] == []
    assert ablate_main([str(path), "--print-commands", "--out", str(tmp_path / "o"), f"data.path={asdiv}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 15 and all(line.endswith(f"data.path={asdiv}") for line in lines)
    with pytest.raises(ConfigError, match="override 'nonsense' \\(command line\\) must look like key.sub=value"):
        load_study(path, overrides=["nonsense"])
