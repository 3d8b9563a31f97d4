"""DPO as a training method (issue 41, point 1) through the trainer: offline pairs of the initial model sampled
once and kept for a resume, online pairs of the current policy with the reference model loaded beside it, and,
on the real model, the implicit reward margin of held-out pairs rising."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _ablate_tasks import digit_problems
from safetensors.torch import load_file

from mathrl.ablate import Task
from mathrl.ablate.methods import DPOMethod, load_pool, run_method
from mathrl.config import load_config
from mathrl.procs import without_dist_env
from mathrl.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _cfg(model_dir, out, *extra):
    return load_config(None, [f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=3", "rollout.n=4",
                              "train.batch_size=4", "train.steps=3", "train.lr=1e-2", "algo.kl_coef=0",
                              "algo.dpo_beta=0.5", "data.template=chat_boxed", "deepspeed.zero_stage=1",
                              f"train.output_dir={out}", "logging.tensorboard=false", "logging.console=plain",
                              "train.save_every=1", "train.keep_last=3", *extra])


TASK = dict(reward_terms={"first_digit": {}})


def test_dpo_offline_and_online_on_the_trainer(tmp_path, digit_model_dir, monkeypatch):
    """At step 1 the policy is the reference, so every pair's margin is 0 and the loss log 2 (offline exactly:
    the reference logprobs are the initial policy's own; online within float rounding of the separate reference
    model). The offline pool holds the initial model's pairs (several-token responses);
    the pairs of step 1 are the same offline and online (same sampler, same seed); step 1's update raises their
    margin; a resume trains on the kept pool and ends with the same weights."""
    monkeypatch.setenv("MATHRL_PROGRESS", "0")
    recs = {}
    for method in ("dpo", "online_dpo"):
        assert run_method(method, _cfg(digit_model_dir, tmp_path / method),
                          task=Task(train_problems=digit_problems(32), **TASK)) == 0
        recs[method] = read_metrics(tmp_path / method / "metrics.jsonl")
    off = recs["dpo"]
    assert off[0]["event"] == "dpo_sampling" and off[0]["dpo/pairs_total"] > 0
    steps_off = [r for r in off if "event" not in r]
    steps_on = [r for r in recs["online_dpo"] if "event" not in r]
    assert [r["step"] for r in steps_off] == [1, 2, 3] and all(r["tokens"] == 0 for r in steps_off)
    assert steps_off[0]["dpo/pairs_sampled"] == steps_on[0]["dpo/pairs_sampled"] == steps_off[0]["dpo/pairs"] > 0
    assert steps_off[0]["dpo/margin"] == 0.0 and steps_off[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-12)
    assert abs(steps_on[0]["dpo/margin"]) < 1e-5 and steps_on[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert all(r["stepped"] == 1.0 for r in steps_off + steps_on)
    # online, the reference stays the initial model while the policy moves: later margins are not 0
    assert any(abs(r["dpo/margin"]) > 1e-4 for r in steps_on[1:])

    pool = load_pool(tmp_path / "dpo" / "dpo_pool.rank0.safetensors")
    data = pool[0][0]
    assert data["response_ids"].shape[0] == 2 * steps_off[0]["dpo/pairs"] and data["response_mask"].sum() > 2
    # step 1's update raises the margin of step 1's pairs (at h = 0 every pair weighs the same, so a descent step
    # on the loss raises their mean margin to first order; the later steps train on other problems)
    from transformers import AutoModelForCausalLM

    from mathrl.train import dpo

    after = AutoModelForCausalLM.from_pretrained(str(tmp_path / "dpo" / "checkpoints" / "step_000001" / "policy"),
                                                 dtype=torch.float32)
    seq = dpo.reference_logprobs(after, dpo.as_forward_batch(data), token_budget=4096, device="cpu")
    margin = (seq - data["ref_logps"])[0::2] - (seq - data["ref_logps"])[1::2]
    assert float(margin.mean()) > 1e-3, margin

    # resume after step 1: the kept pool, not new samples of the trained policy; same final weights
    part = tmp_path / "dpo_part"
    shutil.copytree(tmp_path / "dpo", part)
    for step in ("step_000003", "step_000002"):
        shutil.rmtree(part / "checkpoints" / step)
    assert run_method("dpo", _cfg(digit_model_dir, part, "train.resume=auto"),
                      task=Task(train_problems=digit_problems(32), **TASK)) == 0
    w_full = load_file(str(tmp_path / "dpo" / "checkpoints" / "step_000003" / "policy" / "model.safetensors"))
    w_part = load_file(str(part / "checkpoints" / "step_000003" / "policy" / "model.safetensors"))
    assert all(torch.equal(w_part[k], w_full[k]) for k in w_full)


@pytest.mark.slow
def test_dpo_on_two_ranks_with_uneven_pairs(tmp_path, digit_model_dir):
    """World size 2 under ZeRO-2: each rank samples its own half of the problems, so the ranks hold different
    numbers of pairs (a rank without any steps with a masked row); the loss is normalised by the pairs of both
    (step 1: log 2 over all of them), nothing hangs, and each rank kept its own pool."""
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    from _train_tasks import torchrun

    out = tmp_path / "ws2"
    rc, log = torchrun(Path(__file__).with_name("_dpo_two_ranks.py"), (digit_model_dir, out), 2)
    assert rc == 0, log[-3000:]
    steps = [r for r in read_metrics(out / "metrics.jsonl") if "event" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(r["stepped"] == 1.0 for r in steps)
    assert steps[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-9) and steps[0]["dpo/margin"] == 0.0
    pools = [load_pool(out / f"dpo_pool.rank{r}.safetensors") for r in (0, 1)]
    per_rank = [[p[0]["response_ids"].shape[0] // 2 for p in pool] for pool in pools]
    assert [a + b for a, b in zip(*per_rank)] == [r["dpo/pairs"] for r in steps]
    assert any(a != b for a, b in zip(*per_rank)), per_rank  # uneven work


def test_pair_rows_put_the_correct_response_first():
    from mathrl.train.dpo import pair_rows

    assert pair_rows([0, 0, 1, 1, 1], [False, True, True, False, False], per_group=2) == [1, 0, 2, 3]


def test_offline_dpo_loads_no_reference_model_and_online_dpo_does():
    cfg = load_config(None, ["algo.kl_coef=0"])
    assert not DPOMethod(online=False).needs_reference(cfg) and DPOMethod(online=True).needs_reference(cfg)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dpo_raises_the_implicit_reward_margin_of_held_out_pairs(tmp_path, embedded_model_path):
    """SmolLM2-135M-Instruct on the synthetic task with the real verifier: offline DPO on pairs of the initial
    model, then pairs of the initial model on held-out problems (another synthetic draw, disjoint facts) built
    by the same code. Before training their margin is 0 (the policy is the reference); after it the mean
    implicit reward margin beta * [(log pi - log pi_ref)(chosen) - (...)(rejected)] is positive and most pairs
    are ordered right. Run in its own process (the `mathrl` command's memory goes back afterwards)."""
    out = tmp_path / "dpo_real"
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("_dpo_heldout.py")), str(embedded_model_path),
                        str(out)], capture_output=True, text=True, timeout=880, cwd=str(ROOT),
                       env={**without_dist_env(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
                            "MATHRL_PROGRESS": "0"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    result = dict(line.split("=", 1) for line in p.stdout.splitlines() if line.startswith("heldout_"))
    pairs, margin, ordered = int(result["heldout_pairs"]), float(result["heldout_margin"]), float(result["heldout_ordered"])
    print(f"[dpo held-out] {result}")
    assert pairs >= 8 and int(result["heldout_lengths"]) > 1, result  # several-token responses of different lengths
    assert float(result["heldout_chosen_right"]) == 1.0, result  # each pair: the verifier's right answer first
    assert margin > 0 and ordered > 0.5, result
