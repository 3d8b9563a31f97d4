"""Study files: grid expansion, presets, per-run configs, errors, launcher commands; offline RFT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from mathrl.ablate.cli import main as ablate_main
from mathrl.ablate.study import dump_study, load_study, run_config
from mathrl.config import ConfigError
from mathrl.config.rules import inert_settings

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, study: dict) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(study, sort_keys=False))
    return p


def test_grid_expansion_presets_and_overrides(tmp_path):
    p = _write(tmp_path, {
        "study": {"name": "g", "out": str(tmp_path / "o"), "rft": {"max_per_problem": 2}},
        "base": {"train": {"steps": 3}, "algo.kl_coef": 0.04},
        "runs": [
            {"method": "rft", "rft": {"dedup": False}, "overrides": {"train": {"lr": 1e-5}}},
            {"method": "grpo", "variant": ["dr_grpo", "no_kl"]},
            {"method": "grpo", "sweep": {"rollout.n": [4, 16], "algo.kl_estimator": ["k2", "k3"]}},
            {"method": "ppo", "name": "ppo-G{rollout.n}", "sweep": {"rollout.n": [2]}},
        ]})
    s = load_study(p)
    assert [r.name for r in s.runs] == ["rft", "grpo-dr_grpo-no_kl", "grpo-n4-kl_estimatork2", "grpo-n4-kl_estimatork3",
                                        "grpo-n16-kl_estimatork2", "grpo-n16-kl_estimatork3", "ppo-G2"]
    rft = run_config(s, s.runs[0])
    assert (rft.algo.kl_coef, rft.train.lr, rft.train.steps) == (0.0, 1e-5, 3)   # method preset beats base
    assert s.runs[0].rft == {"max_per_problem": 2, "dedup": False}
    dr = run_config(s, s.runs[1])
    assert (dr.advantage, dr.algo.loss_agg, dr.algo.kl_coef) == ("dr_grpo", "seq-mean-token-sum-norm", 0.0)
    g = run_config(s, s.runs[4])
    assert (g.rollout.n, g.algo.kl_estimator, g.algo.kl_coef) == (16, "k2", 0.04)
    ppo = run_config(s, s.runs[6])
    assert (ppo.algo.name, ppo.advantage, ppo.kl_in, ppo.rollout.n) == ("ppo", "gae", "reward", 2)
    assert Path(ppo.train.output_dir) == tmp_path / "o" / "ppo-G2"
    assert load_study(p, out=tmp_path / "elsewhere").out == tmp_path / "elsewhere"


@pytest.mark.parametrize("runs, base, match", [
    ([{"method": "dpoo"}], {}, r"method = .dpoo.; allowed: rft, online_rft, dpo, online_dpo, grpo, grpo_ps, ppo"),
    ([{"method": "grpo", "variant": "dr-grpo"}], {}, r"variant = 'dr-grpo'; allowed: dr_grpo"),
    ([{"method": "grpo", "overrides": {"algo.kl_cof": 0}}], {}, r"unknown key 'algo.kl_cof' \(.*s\.yaml:\d+ \(run #1 "
                                                                r"overrides\), run 'grpo'\); did you mean 'algo.kl_coef'"),
    ([{"method": "grpo"}], {"train": {"lr": -1}}, r"train.lr = -1.0 \(.*s\.yaml:\d+\): out of range"),
    ([{"method": "grpo"}, {"method": "grpo"}], {}, r"run name\(s\) grpo occur more than once"),
    ([{"method": "grpo", "sweep": {"rollout.n": 4}}], {}, r"sweep.rollout.n must be a non-empty list"),
    ([{"method": "grpo", "rft": {"cap": 2}}], {}, r"unknown rft option\(s\) cap"),
    ([{"method": "grpo", "overrides": {"rollout.n": 1}}], {}, r"run 'grpo'.*rollout.n = 1.*needs rollout.n >= 2"),
])
def test_errors_name_the_file_run_and_key(tmp_path, runs, base, match):
    p = _write(tmp_path, {"study": {"out": str(tmp_path / "o")}, "base": base, "runs": runs})
    with pytest.raises(ConfigError, match=match):
        load_study(p)


def test_unknown_top_level_key_has_a_line_number(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("study: {out: x}\nrunz:\n  - {method: grpo}\n")
    with pytest.raises(ConfigError, match=r"s\.yaml:2: unknown top-level key 'runz'"):
        load_study(p)


def test_shipped_studies_load():
    cpu = load_study(ROOT / "configs/ablations/cpu_demo.yaml")
    assert [r.name for r in cpu.runs] == ["rft", "online_rft", "grpo", "ppo", "grpo-iterative"]
    assert run_config(cpu, cpu.run("grpo-iterative")).algo.ref_update_every == 2
    c = run_config(cpu, cpu.runs[2])
    assert c.model.name == "embedded" and c.data.source == "synthetic" and c.rollout.backend == "hf"
    gpu = load_study(ROOT / "configs/ablations/deepseekmath_gsm8k.yaml")
    names = [r.name for r in gpu.runs]
    assert {"grpo-dr_grpo", "grpo-no_kl", "grpo-k1", "grpo-mb16", "grpo-mb16-clip_higher", "grpo-G4", "grpo-G16",
            "grpo-iterative"} <= set(names)
    # every section-5.2 method gets the same learning-rate sweep (no method a larger rate by fiat)
    for method in ("rft", "online_rft", "dpo", "grpo", "grpo_ps", "ppo"):
        rates = sorted(run_config(gpu, gpu.run(f"{method}-lr{r}")).train.lr for r in ("1e-06", "1e-05"))
        assert rates == [1e-6, 1e-5], method
    # every row of DeepSeekMath's sec. 5.2.1; the process-supervised rows train on the study's initial PRM
    ps, ps_iter = run_config(gpu, gpu.run("grpo_ps-lr1e-06")), run_config(gpu, gpu.run("grpo_ps-iterative"))
    assert ps.advantage == ps_iter.advantage == "grpo_ps" and ps.model.prm == ps_iter.model.prm
    assert ps.model.prm.endswith("prm_initial") and gpu.prm["problems"] == 256 and gpu.prm["heldout"] == 128
    assert ps_iter.algo.prm_update_every == ps_iter.algo.ref_update_every == 50
    assert run_config(gpu, gpu.run("grpo-G16")).rollout.n == 16
    higher = run_config(gpu, gpu.run("grpo-mb16-clip_higher"))
    assert higher.algo.clip_high == 0.28 and higher.train.mini_batch_size == 16
    assert run_config(gpu, gpu.run("grpo-mb16")).clip_high == 0.2  # auto: PPO's
    assert run_config(gpu, gpu.run("grpo-mb16")).to_dict() == {
        **higher.to_dict(), "algo": {**higher.to_dict()["algo"], "clip_low": "auto", "clip_high": "auto"},
        "train": {**higher.to_dict()["train"], "output_dir": run_config(gpu, gpu.run("grpo-mb16")).train.output_dir}}
    # no run of the GPU study carries a setting that cannot act (clip-higher with one update per batch)
    assert [r.name for r in gpu.runs if inert_settings(run_config(gpu, r))] == []
    # its confirmatory family, declared before any run: the CPU study's 16 contrasts at the paper's rate 1e-6
    assert gpu.primary_metric == "pass@1" and len(gpu.contrasts) == 16
    assert {g for pair in gpu.contrasts for g in pair} - {"before"} == {
        "rft-lr1e-06", "online_rft-lr1e-06", "dpo-lr1e-06", "grpo-lr1e-06", "grpo_ps-lr1e-06", "ppo-lr1e-06",
        "grpo-iterative", "grpo_ps-iterative"}
    declared = {g for pair in gpu.contrasts for g in pair}
    assert all(run_config(gpu, r).train.lr == 1e-6 for r in gpu.runs if r.group in declared)


def test_print_commands_lists_pending_runs_then_the_report(tmp_path, capsys):
    p = _write(tmp_path, {"study": {"out": str(tmp_path / "o"), "launcher": "deepspeed -m mathrl.ablate.cli"},
                          "runs": [{"method": "grpo"}, {"method": "ppo"}]})
    (tmp_path / "o" / "grpo").mkdir(parents=True)
    (tmp_path / "o" / "grpo" / "DONE.json").write_text("{}")
    assert ablate_main([str(p), "--print-commands"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"deepspeed -m mathrl.ablate.cli {p} --only ppo --out {tmp_path / 'o'}",
                     f"deepspeed -m mathrl.ablate.cli {p} --report-only --out {tmp_path / 'o'}"]
    with pytest.raises(ConfigError, match="no run named 'sft'"):
        ablate_main([str(p), "--only", "sft"])


def test_offline_rft_trains_on_samples_of_the_initial_model(tmp_path, digit_model_dir, capsys, monkeypatch):
    """Offline RFT samples every step's problems up front; its step-1 data equals online RFT's step 1."""
    from _ablate_tasks import digit_problems

    from mathrl.ablate.methods import run_method
    from mathrl.config import load_config
    from mathrl.train.metrics import read_metrics

    monkeypatch.setenv("MATHRL_PROGRESS", "0")  # progress as log lines, as in a log file or CI
    recs, printed = {}, {}
    for method in ("rft", "online_rft"):
        cfg = load_config(None, [f"model.name={digit_model_dir}", "rollout.backend=hf", "rollout.max_tokens=1",
                                 "rollout.n=4", "train.batch_size=4", "train.steps=3", "train.lr=1e-2",
                                 "algo.kl_coef=0", "data.template=chat_boxed", "deepspeed.zero_stage=1",
                                 f"train.output_dir={tmp_path / method}", "logging.tensorboard=false",
                                 "logging.console=plain", "train.save_every=1", "train.keep_last=3"])
        assert run_method(method, cfg, rft_opts={"dedup": False},
                          task=__import__("mathrl.ablate", fromlist=["Task"]).Task(
                              train_problems=digit_problems(32), reward_terms={"first_digit": {}})) == 0
        recs[method] = read_metrics(tmp_path / method / "metrics.jsonl")
        printed[method] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rft: sampled")]
        assert (tmp_path / method / "checkpoints" / "step_000003" / "policy" / "config.json").is_file()
    off = recs["rft"]
    assert off[0]["event"] == "rft_sampling" and off[0]["tokens"] == 3 * 4 * 4
    # the up-front sampling reports each step as it goes (offline only: online RFT logs its steps)
    want = [f"rft: sampled the initial policy for step {s}/3" for s in (1, 2, 3)]
    assert [ln.partition(": kept ")[0] for ln in printed["rft"]] == want
    assert printed["online_rft"] == []
    steps_off = [r for r in off if "event" not in r]
    steps_on = [r for r in recs["online_rft"] if "event" not in r]
    assert [r["step"] for r in steps_off] == [1, 2, 3] and all(r["tokens"] == 0 for r in steps_off)
    assert steps_off[0]["rft/kept"] == steps_on[0]["rft/kept"]            # same sampler, same seed at step 1
    assert steps_off[0]["reward/accuracy"] == steps_on[0]["reward/accuracy"]
    # without dedup every correct sample is kept
    assert all(r["rft/kept"] == r["reward/accuracy"] * 16 for r in steps_off + steps_on)
    assert json.loads(json.dumps(steps_off))  # finite, serialisable

    # resume offline RFT after step 1: it trains on the saved samples of the initial model, not on new
    # samples of the partly trained policy, and ends with the uninterrupted run's weights
    import shutil

    from safetensors.torch import load_file

    part = tmp_path / "rft_part"
    shutil.copytree(tmp_path / "rft", part)
    for step in ("step_000003", "step_000002"):
        shutil.rmtree(part / "checkpoints" / step, ignore_errors=True)
    assert (part / "checkpoints" / "step_000001").is_dir()
    cfg = load_config(None, [f"model.name={digit_model_dir}", "rollout.backend=hf", "rollout.max_tokens=1",
                             "rollout.n=4", "train.batch_size=4", "train.steps=3", "train.lr=1e-2",
                             "algo.kl_coef=0", "data.template=chat_boxed", "deepspeed.zero_stage=1",
                             f"train.output_dir={part}", "logging.tensorboard=false", "logging.console=plain",
                             "train.save_every=1", "train.keep_last=3", "train.resume=auto"])
    task = __import__("mathrl.ablate", fromlist=["Task"]).Task(train_problems=digit_problems(32),
                                                               reward_terms={"first_digit": {}})
    assert run_method("rft", cfg, rft_opts={"dedup": False}, task=task) == 0
    w_full = load_file(str(tmp_path / "rft" / "checkpoints" / "step_000003" / "policy" / "model.safetensors"))
    w_part = load_file(str(part / "checkpoints" / "step_000003" / "policy" / "model.safetensors"))
    assert all(torch.equal(w_part[k], w_full[k]) for k in w_full)
    strip = lambda rows: [{k: v for k, v in r.items() if "time/" not in k and not k.startswith("sys/")}
                          for r in rows if "event" not in r]
    assert strip(read_metrics(part / "metrics.jsonl")) == strip(off)
    # without its samples, a resumed offline RFT run refuses to continue
    (part / "rft_pool.rank0.safetensors").unlink()
    shutil.rmtree(part / "checkpoints" / "step_000003")
    from mathrl.train.checkpoint import TrainingError

    with pytest.raises(TrainingError, match=r"rft_pool.rank0.safetensors\) are missing"):
        run_method("rft", cfg, rft_opts={"dedup": False}, task=task)


@pytest.mark.slow
def test_cli_trains_each_run_in_a_worker_process(tmp_path, digit_model_dir, capfd):
    """`mathrl ablate STUDY` (no custom task): every run in its own interpreter, then the report here."""
    p = _write(tmp_path, {
        "study": {"name": "w", "out": str(tmp_path / "o")},
        "base": {"model": {"name": str(digit_model_dir)}, "data": {"template": "chat_boxed", "eval_limit": 3},
                 "rollout": {"backend": "hf", "n": 2, "max_tokens": 2}, "reward": {"workers": 1},
                 "train": {"steps": 1, "batch_size": 2}, "deepspeed": {"zero_stage": 1},
                 "logging": {"tensorboard": False, "console": "plain"},
                 "eval": {"n": 2, "k": [1, 2], "max_tokens": 2}},
        "runs": [{"method": "grpo", "overrides": {"algo.kl_coef": 0.0}}]})
    assert ablate_main([str(p)]) == 0
    err = capfd.readouterr().err
    assert "grpo: worker process:" in err and "--only grpo" in err
    out = tmp_path / "o"
    assert (out / "grpo" / "DONE.json").is_file() and (out / "report.md").is_file()
    assert json.loads((out / "report.json").read_text())["runs"][0]["name"] == "grpo"


def test_dump_study_round_trips_the_expanded_runs(tmp_path):
    s = load_study(ROOT / "configs/ablations/deepseekmath_gsm8k.yaml", out=tmp_path / "o")
    s.runs[2].overrides.append(("train.steps", 2, "edited"))
    again = load_study(dump_study(s, tmp_path / "copy.yaml"))
    assert [r.name for r in again.runs] == [r.name for r in s.runs] and again.curve_every == s.curve_every
    for a, b in zip(s.runs, again.runs):
        assert run_config(s, a).to_dict() == run_config(again, b).to_dict() and a.rft == b.rft
    assert run_config(again, again.run(s.runs[2].name)).train.steps == 2


STUDY_FILE = """\
study:
  out: {out}
  seeds: [0, 1]
  primary_metric: {metric}
  contrasts: {contrasts}
base:
  model: {{name: embedded}}
  eval: {{n: {n}, k: [1]}}
runs:
  - {{method: rft}}
  - {{method: grpo}}
"""


@pytest.mark.parametrize("metric,contrasts,n,match", [
    ("pass@1", "[[rft, grpo]]", 4, r"s.yaml:4: study.primary_metric = pass@1 needs eval.n >= 8 samples per problem; "
                                    r"run 'rft-seed0' has eval.n = 4"),
    ("maj@16", "[[rft, grpo]]", 8, r"s.yaml:4: study.primary_metric = maj@16, but run 'rft-seed0' draws eval.n = 8"),
    ("acc", "[[rft, grpo]]", 8, r"s.yaml:4: study.primary_metric = 'acc'; allowed: greedy, pass@k or maj@k"),
    ("\"\"", "[[rft, grpo]]", 8, r"s.yaml:4: study.primary_metric = ''; allowed: greedy"),
    ("greedy", "[[rft, ppo]]", 8, r"s.yaml:5: study.contrasts names 'ppo', which is not a run of this study"),
    ("greedy", "[[grpo, before]]", 8, r"s.yaml:5: study.contrasts names 'before', which is not a run of this study "
                                      r"\(before is allowed as A only\)"),
    ("greedy", "[[rft, grpo], [rft, grpo]]", 8, r"s.yaml:5: study.contrasts: \[rft, grpo\] is declared twice"),
    ("greedy", "[[rft, rft]]", 8, r"s.yaml:5: study.contrasts: \[rft, rft\] compares a run with itself"),
    ("greedy", "[]", 8, r"s.yaml:5: study.contrasts = \[\]; allowed: a non-empty list of \[A, B\] pairs"),
])
def test_primary_metric_and_contrasts_are_checked_with_line_numbers(tmp_path, metric, contrasts, n, match):
    p = tmp_path / "s.yaml"
    p.write_text(STUDY_FILE.format(out=tmp_path / "o", metric=metric, contrasts=contrasts, n=n))
    with pytest.raises(ConfigError, match=match):
        load_study(p)


def test_declared_family_loads_and_round_trips(tmp_path):
    from mathrl.ablate.study import dump_study

    p = tmp_path / "s.yaml"
    # pass@1 with eval.n = 8 samples is allowed
    p.write_text(STUDY_FILE.format(out=tmp_path / "o", metric="pass@1", contrasts="[[before, grpo], [rft, grpo]]", n=8))
    s = load_study(p)
    assert (s.primary_metric, s.contrasts) == ("pass@1", [("before", "grpo"), ("rft", "grpo")])
    again = load_study(dump_study(s, tmp_path / "copy.yaml"))
    assert (again.primary_metric, again.contrasts) == (s.primary_metric, s.contrasts)
    # declared together: one without the other is refused, at its own line
    text = STUDY_FILE.format(out=tmp_path / "o", metric="greedy", contrasts="[[rft, grpo]]", n=8)
    p.write_text(text.replace("  primary_metric: greedy\n", ""))
    with pytest.raises(ConfigError, match=r"s.yaml:4: study.primary_metric and study.contrasts are declared together "
                                          r"\(study.primary_metric is missing\)"):
        load_study(p)
    p.write_text(text.replace("  contrasts: [[rft, grpo]]\n", ""))
    with pytest.raises(ConfigError, match=r"s.yaml:4: .*\(study.contrasts is missing\)"):
        load_study(p)
    p.write_text(text.replace("{method: grpo}", "{method: grpo, name: before}"))
    with pytest.raises(ConfigError, match="'baseline' and 'before' are reserved"):
        load_study(p)


def test_config_differences_ignore_neutral_keys_and_fields_added_later():
    from mathrl.ablate.driver import config_differences
    from mathrl.config import load_config

    cfg = load_config(None, ["train.lr=1e-5"])
    rec = cfg.to_dict()
    del rec["algo"]["ref_update_every"]              # a field mathrl gained after the run finished
    rec["train"]["keep_last"] = 9                     # checkpointing does not change the result
    rec["logging"]["console"] = "plain"
    assert config_differences(rec, cfg) == []
    assert config_differences(rec, load_config(None, ["train.lr=1e-5", "algo.ref_update_every=3"])) == \
        ["algo.ref_update_every"]
    assert config_differences(rec, load_config(None, ["train.lr=2e-5"])) == ["train.lr"]
    # issue 40: the old default 8192 (lowered to the free memory) is what auto means now; another number differs
    rec["train"]["micro_batch_tokens"] = 8192
    assert config_differences(rec, cfg) == []
    rec["train"]["micro_batch_tokens"] = 2048
    assert config_differences(rec, cfg) == ["train.micro_batch_tokens"]
    # issue 41: a run recorded before data.eval_seed drew its generated held-out set with train.seed, so a study
    # pinning data.eval_seed to that seed gives it the same config, and another seed does not
    rec = load_config(None, ["train.seed=1"]).to_dict()
    del rec["data"]["eval_seed"]
    assert config_differences(rec, load_config(None, ["train.seed=1", "data.eval_seed=1"])) == []
    assert config_differences(rec, load_config(None, ["train.seed=1"])) == []
    assert config_differences(rec, load_config(None, ["train.seed=1", "data.eval_seed=0"])) == ["data.eval_seed"]


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "ablations").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_loads(path):
    study = load_study(path)
    assert study.runs and all(run_config(study, r).train.output_dir.startswith(str(study.out)) for r in study.runs)


def test_the_cpu_study_has_every_row_and_a_declared_family():
    s = load_study(ROOT / "configs/ablations/deepseekmath_cpu.yaml")
    methods = {r.method for r in s.runs}
    assert methods == {"rft", "online_rft", "dpo", "grpo", "grpo_ps", "ppo"}
    assert {r.group for r in s.runs} >= {"grpo-iterative", "grpo_ps-iterative"}
    assert s.primary_metric == "pass@1" and {b for a, b in s.contrasts if a == "before"} == {r.group for r in s.runs}
    c = run_config(s, s.run("grpo_ps-iterative-seed0"))
    assert c.data.synthetic_level == 2 and c.data.eval_limit == 56 and c.model.prm.endswith("prm_initial")
    assert c.eval.n >= 8 and c.eval.k == [1, 8]  # pass@1 as the primary metric needs n >= 8
    assert c.algo.prm_update_every == c.algo.ref_update_every == 10 and s.prm["heldout"] == 56
    # the 56 held-out problems are the level's 56 distinct held-out expressions, each once
    from mathrl.data.splits import heldout_problems
    held = heldout_problems(c)[1]
    assert len(held) == 56 and len({p.meta["expression"] for p in held}) == 56
    # and it is the same set for every seed and the initial model's evaluation, so seeds pair per problem (the
    # synthetic test draw follows train.seed: unpinned, seed 1 got other wordings and ids and the study's
    # report printed "comparisons skipped: the seeds of a group were evaluated on different problems")
    for r in s.runs:
        rc = run_config(s, r)
        assert rc.data.eval_seed == 0 and [p.id for p in heldout_problems(rc)[1]] == [p.id for p in held], r.name
    assert {run_config(s, r).train.lr for r in s.runs} == {1e-5}  # one learning rate for every method


def test_a_multi_seed_study_evaluates_every_seed_on_one_generated_heldout_set(tmp_path):
    from mathrl.data.splits import heldout_problems

    study = {"study": {"out": str(tmp_path / "o"), "seeds": [3, 1]},
             "base": {"data": {"source": "synthetic", "synthetic_level": 2, "eval_limit": 8}},
             "runs": [{"method": "grpo"}, {"method": "rft", "overrides": {"data.eval_seed": 7}}]}
    s = load_study(_write(tmp_path, study))
    cfgs = {r.name: run_config(s, r) for r in s.runs}
    assert {n: (c.train.seed, c.data.eval_seed) for n, c in cfgs.items()} == {
        "grpo-seed3": (3, 1), "grpo-seed1": (1, 1), "rft-seed3": (3, 7), "rft-seed1": (1, 7)}  # a run's own wins
    ids = {n: [p.id for p in heldout_problems(c)[1]] for n, c in cfgs.items()}
    assert ids["grpo-seed3"] == ids["grpo-seed1"] and ids["grpo-seed1"][0].startswith("synthetic/test/L2/s1/")
    assert ids["rft-seed3"] == ids["rft-seed1"] != ids["grpo-seed1"]
    # a study written out and read again pins once (each run's overrides set data.eval_seed once), the same way
    again = load_study(dump_study(s, tmp_path / "dumped.yaml"))
    assert [[k for k, _, _ in r.overrides].count("data.eval_seed") for r in again.runs] == [1, 1, 1, 1]
    assert {r.name: run_config(again, r).data.eval_seed for r in again.runs} == {
        n: c.data.eval_seed for n, c in cfgs.items()}
    # outside a study the held-out draw follows train.seed, unless data.eval_seed is set
    one = cfgs["grpo-seed3"]
    one.data.eval_seed = None
    assert [p.id for p in heldout_problems(one)[1]][0].startswith("synthetic/test/L2/s3/")
    # the study's own setting is kept; a file-based held-out set, the same for every seed anyway, is not pinned
    study["base"]["data"]["eval_seed"] = 5
    s2 = load_study(_write(tmp_path, study))
    assert {run_config(s2, r).data.eval_seed for r in s2.runs if r.method == "grpo"} == {5}
    study["base"]["data"] = {"source": "jsonl", "path": str(tmp_path / "p.jsonl"),
                             "eval_path": str(tmp_path / "p.jsonl")}
    del study["runs"][1]["overrides"]
    s3 = load_study(_write(tmp_path, study))
    assert {run_config(s3, r).data.eval_seed for r in s3.runs} == {None}
