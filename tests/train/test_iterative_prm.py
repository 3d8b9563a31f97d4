"""Iterative RL with the PRM (issue 41, point 3; DeepSeekMath Algorithm 1) through the trainer: every N steps the
current policy's samples are labelled, the PRM continues training on them with a 10% replay of the earlier ones,
the reference is reset, and a resumed run continues exactly."""

from __future__ import annotations

import json
import random

import pytest
import torch
from _train_tasks import crash_copy, digit_cfg, digit_problems, save_prm, step_rows, without_timing
from safetensors.torch import load_file

from mathrl.config import ConfigError, load_config, rules
from mathrl.prm.cli import PRMInputError
from mathrl.prm.iterative import replay_sample
from mathrl.prm.iterative import run as iterative_run
from mathrl.train import checkpoint as ckpt
from mathrl.train import run

ITER = ["algo.advantage=grpo_ps", "algo.prm_update_every=1", "algo.ref_update_every=1", "algo.prm_lr=0.05",
        "algo.prm_batch=8", "algo.prm_label_k=2"]


def _cfg(model_dir, out, prm, *extra):
    return digit_cfg(model_dir, out, "train.steps=3", "rollout.max_tokens=4", "train.save_every=1",
                     "train.keep_last=5", "logging.log_samples=0", f"model.prm={prm}", *extra)


def _weights(folder):
    return load_file(str(folder))


@pytest.mark.slow
def test_the_prm_is_retrained_every_n_steps_with_replay_and_a_resume_is_exact(digit_model_dir, tmp_path, capsys):
    prm = save_prm(digit_model_dir, tmp_path / "prm0", 1.0)  # no labels.jsonl: its training data is unknown
    fixed_out, it_out = tmp_path / "fixed", tmp_path / "iter"
    assert run(_cfg(digit_model_dir, fixed_out, prm, "algo.advantage=grpo_ps"), problems=digit_problems(8)) == 0
    assert iterative_run(_cfg(digit_model_dir, it_out, prm, *ITER), problems=digit_problems(8)) == 0
    fixed, it = step_rows(fixed_out), step_rows(it_out)
    # step 1 runs before any round: the same step as with the fixed PRM; the rounds change the later PRM scores
    same_keys = [k for k in fixed[0] if not k.startswith(("time/", "throughput/", "sys/", "ref/"))]
    assert {k: it[0][k] for k in same_keys} == {k: fixed[0][k] for k in same_keys}
    assert it[1]["ps/step_reward_mean"] != fixed[1]["ps/step_reward_mean"]
    # each round labels the step's 4 problems x 4 samples and replays 10% of the earlier records
    assert [r["prm/records_new"] for r in it] == [16.0, 16.0, 16.0]
    assert [r["prm/records_replay"] for r in it] == [0.0, 2.0, 3.0]  # round(0.1 x 16), round(0.1 x 32)
    assert "the first PRM round replays nothing" in capsys.readouterr().err  # and the run says so
    assert [r["prm/records_trained"] for r in it] == [16.0, 18.0, 19.0]
    assert [r["prm/optimizer_steps"] for r in it] == [2.0, 3.0, 3.0]  # prm_batch 8, one epoch
    assert all(r["prm/loss"] > 0 for r in it)
    assert all(r["ref/step"] == r["step"] for r in it)  # the reference follows the policy (ref_update_every=1)
    pool = [json.loads(line) for line in (it_out / "prm_pool.rank0.jsonl").read_text().splitlines()]
    assert [p["round_step"] for p in pool] == [1] * 16 + [2] * 16 + [3] * 16
    # the digit task's responses have no line break: one step, read where its text ends (before any EOS)
    assert all(len(p["ends"]) == len(p["soft"]) <= 1 and all(0 <= e < len(p["response_ids"]) for e in p["ends"])
               for p in pool)
    assert sum(len(p["ends"]) for p in pool) > 40 and {p["soft"][0] for p in pool if p["ends"]} == {0.0, 1.0}
    heads = [_weights(it_out / "prm" / f"step_{s:06d}" / "value_head.safetensors") for s in (1, 2, 3)]
    first = _weights(prm / "value_head.safetensors")
    assert all(not torch.equal(h["weight"], w["weight"]) for h, w in zip(heads, [first] + heads[:2]))

    # a crash after step 2's checkpoint (with step 3's round already on disk) resumes exactly
    part = tmp_path / "part"
    crash_copy(it_out, part, keep_step=2)
    assert iterative_run(_cfg(digit_model_dir, part, prm, *ITER, "train.resume=auto"),
                         problems=digit_problems(8)) == 0
    assert without_timing(step_rows(part)) == without_timing(it)
    full_w = _weights(ckpt.list_checkpoints(it_out)[-1][1] / "policy" / "model.safetensors")
    part_w = _weights(ckpt.list_checkpoints(part)[-1][1] / "policy" / "model.safetensors")
    assert all(torch.equal(full_w[k], part_w[k]) for k in full_w)
    assert torch.equal(_weights(part / "prm" / "step_000003" / "value_head.safetensors")["weight"], heads[2]["weight"])

    # a pool file with a bad line (edited by hand; mathrl writes it atomically) is refused naming its file and line
    torn = tmp_path / "torn"
    crash_copy(it_out, torn, keep_step=2)
    pool_file = torn / "prm_pool.rank0.jsonl"
    pool_file.write_text(pool_file.read_text()[:-40])
    with pytest.raises(PRMInputError, match=r"prm_pool\.rank0\.jsonl:48: not valid JSON"):
        iterative_run(_cfg(digit_model_dir, torn, prm, *ITER, "train.resume=auto"), problems=digit_problems(8))


@pytest.mark.slow
def test_the_first_round_replays_the_prms_own_training_data(digit_model_dir, tmp_path, capsys):
    """DeepSeekMath's Algorithm 1 replays 10% of the historical data, which includes what the PRM was trained on
    before the run: `mathrl prm train` and a study keep it as labels.jsonl beside the PRM (algo.prm_history=auto).
    With 30 such records the rounds replay round(0.1 x 30) = 3, then round(0.1 x (30 + 16)) = 5 (banker's
    rounding of 4.6 is 5), then round(0.1 x 62) = 6; algo.prm_history=none replays only the run's own rounds."""
    from mathrl.prm.pipeline import PRM_LABELS, write_labels

    prm = save_prm(digit_model_dir, tmp_path / "prm0", 1.0)
    seed_out = tmp_path / "seed"  # labelled responses of the digit model, as a PRM's training data
    assert iterative_run(_cfg(digit_model_dir, seed_out, prm, *ITER, "train.steps=2"), problems=digit_problems(8)) == 0
    history = [json.loads(x) for x in (seed_out / "prm_pool.rank0.jsonl").read_text().splitlines()][:30]
    write_labels(prm / PRM_LABELS, history)
    capsys.readouterr()
    out = tmp_path / "iter"
    assert iterative_run(_cfg(digit_model_dir, out, prm, *ITER), problems=digit_problems(8)) == 0
    rows = step_rows(out)
    assert [r["prm/records_replay"] for r in rows] == [3.0, 5.0, 6.0]
    assert [r["prm/records_trained"] for r in rows] == [19.0, 21.0, 22.0]
    assert "replays nothing" not in capsys.readouterr().err
    # the pool file keeps this run's rounds only (the history stays in the PRM's folder)
    assert len((out / "prm_pool.rank0.jsonl").read_text().splitlines()) == 48
    none = tmp_path / "none"
    assert iterative_run(_cfg(digit_model_dir, none, prm, *ITER, "train.steps=1", "algo.prm_history=none"),
                         problems=digit_problems(8)) == 0
    assert [r["prm/records_replay"] for r in step_rows(none)] == [0.0]
    with pytest.raises(Exception, match=r"algo.prm_history = '/nowhere.jsonl': no such file"):
        iterative_run(_cfg(digit_model_dir, tmp_path / "bad", prm, *ITER, "algo.prm_history=/nowhere.jsonl"),
                      problems=digit_problems(8))


def test_replay_draws_its_share_without_replacement():
    old = [{"i": i} for i in range(25)]
    got = replay_sample(old, 0.1, random.Random(0))
    assert len(got) == 2 and len({g["i"] for g in got}) == 2  # round(2.5) = 2 (banker's rounding)
    assert replay_sample(old, 0.0, random.Random(0)) == [] and replay_sample([], 0.1, random.Random(0)) == []
    assert len(replay_sample(old, 1.0, random.Random(0))) == 25


def test_prm_rounds_are_refused_where_they_cannot_act(tmp_path):
    d = tmp_path / "prm"
    d.mkdir()
    (d / "backbone.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="retraining a process reward model only matters"):
        rules.refuse(load_config(None, ["algo.prm_update_every=2"]))
    with pytest.raises(ConfigError, match="zero_stage = 3"):
        rules.refuse(load_config(None, ["algo.prm_update_every=2", "algo.advantage=grpo_ps", f"model.prm={d}",
                                        "deepspeed.zero_stage=3"]))
    rules.refuse(load_config(None, ["algo.prm_update_every=2", "algo.advantage=grpo_ps", f"model.prm={d}"]))


@pytest.mark.slow
def test_the_grpo_ps_study_row_runs_the_process_method(digit_model_dir, tmp_path):
    """`mathrl ablate`'s grpo_ps row: its presets select the process estimator, and run_method trains with the
    iterative method (a round after each step when the study sets algo.prm_update_every)."""
    from mathrl.ablate.methods import run_method
    from mathrl.registry import ABLATION_METHODS

    prm = save_prm(digit_model_dir, tmp_path / "prm0", 1.0)
    presets = ABLATION_METHODS.meta("grpo_ps")["presets"]
    assert presets == {"algo.name": "grpo", "algo.advantage": "grpo_ps"}
    cfg = _cfg(digit_model_dir, tmp_path / "row", prm, "train.steps=2", *[f"{k}={v}" for k, v in presets.items()],
               "algo.prm_update_every=2", "algo.ref_update_every=2")
    assert run_method("grpo_ps", cfg, task=_digit_task()) == 0
    rows = step_rows(tmp_path / "row")
    assert "prm/records_new" not in rows[0] and rows[1]["prm/records_new"] == 16.0 and "ps/step_reward_mean" in rows[0]
    assert (tmp_path / "row" / "prm" / "step_000002" / "backbone.safetensors").is_file()


def _digit_task():
    from mathrl.ablate import Task

    return Task(train_problems=digit_problems(8), reward_terms={"first_digit": {}})


@pytest.mark.slow
def test_prm_rounds_on_two_ranks_with_uneven_records(digit_model_dir, tmp_path):
    """World size 2, ZeRO-2 policy: rank 0 trains the PRM on its 8 new records of a round, rank 1 on 3 (prm_batch 2:
    4 steps against 2, so rank 1 steps twice with a masked filler). No hang; every PRM step is taken by both
    ranks; the counts add up over the ranks; both ranks end with the same PRM."""
    from pathlib import Path

    from _train_tasks import torchrun

    prm = save_prm(digit_model_dir, tmp_path / "prm0", 1.0)
    out = tmp_path / "ws2"
    rc, log = torchrun(Path(__file__).parent / "_iterative_prm.py", (digit_model_dir, prm, out), 2)
    assert rc == 0, log[-3000:]
    rows = step_rows(out)
    assert [r["prm/records_new"] for r in rows] == [16.0, 16.0]  # 2 problems x 4 samples per rank
    assert rows[0]["prm/records_trained"] == 8 + 3 and rows[0]["prm/optimizer_steps"] == 4.0
    assert rows[1]["prm/records_trained"] == 9 + 3  # rank 0: 8 new + round(0.1 x 8) replayed; rank 1 cut to 3
    ranks = [json.loads((out / f"prm_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    initial = _weights(prm / "value_head.safetensors")["weight"].double().sum().item()
    assert abs(initial - ranks[0]["value_head.weight"]) > 1e-3  # the rounds moved the PRM
