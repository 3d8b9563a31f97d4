"""The GRPO-family options end to end: dynamic sampling (real SmolLM2, the real verifier and DeepSpeed;
two ranks with uneven informative groups), its state across a resume, truncated-response masking,
truncated importance sampling and the GSPO / CISPO losses wired through the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _train_tasks import crash_copy, digit_problems, torchrun, without_timing, step_rows as _steps, digit_cfg
from safetensors.torch import load_file

from mathrl.config import ConfigError, load_config
from mathrl.train import checkpoint as ckpt
from mathrl.train import run

QUIET = ["logging.tensorboard=false"]



def _digit_cfg(model_dir, out, *extra):
    return digit_cfg(model_dir, out, "rollout.max_tokens=3", *extra)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dynamic_sampling_fills_the_batch_with_informative_groups(embedded_model_path, tmp_path):
    """SmolLM2-135M-Instruct on the synthetic task with the real verifier, all-or-nothing rewards and G = 2:
    many groups are all right or all wrong. With dynamic sampling every step trains on B groups whose
    rewards differ (unless the rounds ran out, which the step says); without it (the negative control, same
    seed) some step trains on uninformative groups."""
    args = [f"model.name={embedded_model_path}", "rollout.backend=hf", "rollout.n=2", "rollout.max_tokens=40",
            "train.batch_size=4", "train.steps=2", "train.lr=1e-5", "data.source=synthetic",
            "data.synthetic_size=64", "reward.function=correctness", "reward.format_bonus=0", "data.eval_limit=1",
            "eval.n=1", "eval.k=1", "eval.max_tokens=4", "eval.greedy=false", "train.seed=3", *QUIET]
    plain = tmp_path / "plain"
    assert run(load_config("configs/demo.yaml", [*args, f"train.output_dir={plain}"])) == 0
    assert any(s["reward/zero_variance_groups"] > 0 for s in _steps(plain))
    dyn = tmp_path / "dyn"
    assert run(load_config("configs/demo.yaml", [*args, f"train.output_dir={dyn}", "algo.dynamic_sampling=true",
                                                 "algo.sampling_rounds=6"])) == 0
    steps = _steps(dyn)
    assert any(s["sampling/rounds"] > 1 for s in steps)  # the filter had work to do
    for s in steps:
        assert s["sampling/prompts_consumed"] == 4 * s["sampling/rounds"]
        assert s["reward/zero_variance_groups"] == s["sampling/filled_groups"] / 4
        assert 0 < s["sampling/filtered_frac"] < 1
        # the policy's accuracy over every response of every round (4 prompts x G = 2 per round)
        right = s["sampling/accuracy_sampled"] * 8 * s["sampling/rounds"]
        assert 0 <= right <= 8 * s["sampling/rounds"] and abs(right - round(right)) < 1e-9
        if s["sampling/rounds"] == 1:  # nothing was filtered out: the trained groups are all of them
            assert s["sampling/accuracy_sampled"] == pytest.approx(s["reward/accuracy"])
        for key in ("mismatch/kl", "mismatch/logp_diff_max"):
            assert key in s
    assert sum(s["sampling/filled_groups"] for s in steps) < 8  # mostly informative groups were found
    if steps[0]["sampling/rounds"] == 1:  # round 0 is the plain step's own sample
        assert steps[0]["reward/mean"] == _steps(plain)[0]["reward/mean"]


@pytest.mark.slow
def test_dynamic_sampling_with_the_pass_rate_filter_resumes_exactly(digit_model_dir, tmp_path):
    """The stream position and the pass-rate history are part of the checkpoint: a run stopped after
    step 2 and resumed gives the uninterrupted run's weights and metrics."""
    extra = ["algo.dynamic_sampling=true", "algo.sampling_rounds=3", "algo.pass_rate_filter=1", "train.steps=4",
             "train.save_every=1", "train.keep_last=5"]
    full = tmp_path / "full"
    assert run(_digit_cfg(digit_model_dir, full, *extra), problems=digit_problems(12)) == 0
    steps = _steps(full)
    assert sum(s["sampling/prompts_consumed"] for s in steps) > 4 * 4  # extra rounds or skipped prompts
    state = json.loads((ckpt.list_checkpoints(full)[-1][1] / "trainer_state.json").read_text())
    assert state["prompts_used"] == sum(s["sampling/prompts_consumed"] for s in steps)
    assert state["pass_filter"]["history"]
    part = tmp_path / "part"
    crash_copy(full, part, keep_step=2)
    assert run(_digit_cfg(digit_model_dir, part, *extra, "train.resume=auto"), problems=digit_problems(12)) == 0
    w_full = load_file(str(ckpt.list_checkpoints(full)[-1][1] / "policy" / "model.safetensors"))
    w_part = load_file(str(ckpt.list_checkpoints(part)[-1][1] / "policy" / "model.safetensors"))
    assert all(torch.equal(w_part[k], w_full[k]) for k in w_full)
    assert without_timing(_steps(part)) == without_timing(steps)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dynamic_sampling_on_two_ranks_with_uneven_groups(digit_model_dir, tmp_path):
    """Two ranks find informative groups at different rates. The informative groups are pooled over the batch
    (DAPO, verl): rounds stop when both ranks together have B = 4, and the step trains on min(4, found) of them,
    a rank with more than its share handing groups to the other, which would otherwise pad with uninformative
    ones (the per-rank rule before issue 41: the negative control is that rule's count, which falls short at
    the steps where groups moved). Both ranks run the same rounds and the same number of groups (no hang)."""
    out = tmp_path / "ws2"
    rc, log = torchrun(Path(__file__).parent / "_dynamic_sampling.py",
                       (digit_model_dir, out, "train.steps=4", "algo.dynamic_sampling=true", "algo.sampling_rounds=4",
                        "deepspeed.zero_stage=2"), 2)
    assert rc == 0, log[-3000:]
    rows = {r: [json.loads(x) for x in (out / f"ds_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert [x["step"] for x in rows[0]] == [x["step"] for x in rows[1]] == [1, 2, 3, 4]
    found = {r: [json.loads(x) for x in (out / f"found_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert found[0] == found[1]  # the selection sees every rank's groups, the same on both
    moved_steps = 0
    for a, b, f in zip(rows[0], rows[1], found[0]):
        assert a["sampling/rounds"] == b["sampling/rounds"] == len(f[0]) == len(f[1])
        assert a["rows"] == b["rows"] == 2 * 4  # 2 groups of G = 4 per rank
        cumulative = [sum(f[0][:k + 1]) + sum(f[1][:k + 1]) for k in range(len(f[0]))]
        # the stop rule: the first round at which the batch has 4 informative groups (or the last round)
        assert all(c < 4 for c in cumulative[:-1]) and (cumulative[-1] >= 4 or len(f[0]) == 4), cumulative
        pooled = min(4, cumulative[-1])
        assert a["informative"] + b["informative"] == pooled, (a, b, f)
        assert a["sampling/filled_groups"] == b["sampling/filled_groups"] == 4 - pooled
        per_rank_rule = min(2, sum(f[0])) + min(2, sum(f[1]))
        if a["sampling/moved_groups"]:
            moved_steps += 1
            assert per_rank_rule < pooled  # the old rule would have padded one rank while the other had more
    assert moved_steps >= 1, found
    assert any(x["sampling/rounds"] > 1 for x in rows[0])
    # sampling/accuracy_sampled: right / sampled over every round of both ranks, counted here independently
    graded = {r: [json.loads(x) for x in (out / f"graded_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    pos = 0
    for x in rows[0]:
        k = int(x["sampling/rounds"])
        rounds = graded[0][pos:pos + k] + graded[1][pos:pos + k]
        pos += k
        assert x["sampling/accuracy_sampled"] == pytest.approx(sum(r for r, _ in rounds) / sum(n for _, n in rounds))
    assert pos == len(graded[0]) == len(graded[1])


@pytest.mark.slow
def test_mask_truncated_tis_and_sequence_losses_change_the_update(digit_model_dir, tmp_path):
    """Wired through the trainer, each option changes the weights after one step against the plain loss on
    the same samples (same seed), and logs its statistics. GSPO and CISPO equal PPO while every ratio is 1,
    so they are compared over 2 PPO epochs, where the second epoch's ratios have moved (and PPO clips)."""
    def one_step(name, *extra):
        out = tmp_path / name
        assert run(_digit_cfg(digit_model_dir, out, "train.steps=1", "rollout.max_tokens=2", *extra),
                   problems=digit_problems(8)) == 0
        w = load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors"))
        return w, _steps(out)[-1]

    def differ(a, b) -> bool:
        return any(not torch.equal(a[k], b[k]) for k in a)

    base, m0 = one_step("base")
    assert m0["response/truncated"] > 0  # max_tokens=2 cuts some responses
    w, m = one_step("masked", "algo.mask_truncated=true")
    assert differ(w, base) and "mismatch/kl" in m
    # the hf sampler and the trainer agree to ~1e-6, so a cap of 0.5 cuts every weight to 0.5
    w, m = one_step("tis", "algo.tis_cap=0.5")
    assert differ(w, base)
    assert m["tis/capped_frac"] == 1.0 and abs(m["tis/weight_mean"] - 0.5) < 1e-6
    assert m["mismatch/logp_diff_max"] < 1e-3
    seq = ["algo.loss_agg=seq-mean-token-mean", "algo.ppo_epochs=2"]
    base2, m2 = one_step("base2", *seq)
    assert m2["policy/clipfrac"] > 0  # the second epoch leaves the clip range somewhere
    w, m = one_step("gspo", *seq, "algo.policy_loss=gspo", "algo.clip_low=0.0003", "algo.clip_high=0.0004")
    assert differ(w, base2)
    w, m = one_step("cispo", *seq, "algo.policy_loss=cispo")
    assert differ(w, base2) and m["policy/clipfrac"] > 0


@pytest.mark.slow
def test_gspo_and_cispo_train_with_their_papers_settings_by_default(digit_model_dir, tmp_path, capsys):
    """algo.policy_loss alone gives the paper's clip range and aggregation (issue 41): over 2 PPO epochs GSPO with
    auto settings trains bit for bit like GSPO with 3e-4 / 4e-4 and seq-mean-token-mean written out, and not like
    GSPO with PPO's 0.2 / 0.2 and token-mean (the old defaults: the negative control, which is also warned about);
    CISPO's auto (no lower bound, 0.28) is not its old 0.2 / 0.2."""
    def one_step(name, *extra):
        out = tmp_path / name
        assert run(_digit_cfg(digit_model_dir, out, "train.steps=1", "rollout.max_tokens=2", "algo.ppo_epochs=2",
                              *extra), problems=digit_problems(8)) == 0
        return load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors")), _steps(out)[-1]

    def same(a, b) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    auto, m_auto = one_step("gspo-auto", "algo.policy_loss=gspo")
    paper, _ = one_step("gspo-paper", "algo.policy_loss=gspo", "algo.clip_low=0.0003", "algo.clip_high=0.0004",
                        "algo.loss_agg=seq-mean-token-mean")
    capsys.readouterr()
    ppo_sized, m_ppo = one_step("gspo-ppo-sized", "algo.policy_loss=gspo", "algo.clip_low=0.2", "algo.clip_high=0.2",
                                "algo.loss_agg=token-mean")
    assert "almost never binds" in capsys.readouterr().err
    assert same(auto, paper) and not same(auto, ppo_sized)
    assert m_auto["policy/clipfrac"] > m_ppo["policy/clipfrac"]  # the narrow sequence clip binds more often
    cispo_auto, m_cispo = one_step("cispo-auto", "algo.policy_loss=cispo")
    cispo_old, _ = one_step("cispo-old", "algo.policy_loss=cispo", "algo.clip_low=0.2", "algo.clip_high=0.2")
    assert not same(cispo_auto, cispo_old) and m_cispo["policy/clipfrac_low"] == 0


@pytest.mark.slow
def test_clip_higher_acts_only_off_policy_and_says_so(digit_model_dir, tmp_path, capsys):
    """DAPO's clip-higher with one update per batch trains bit for bit like the plain clip (the study's
    clip-higher row repeated its GRPO row), and the run says so; over 2 PPO epochs, where ratios move past
    1 + clip_high, a higher bound changes the weights (the negative control for the equality)."""
    def one_step(name, *extra):
        out = tmp_path / name
        assert run(_digit_cfg(digit_model_dir, out, "train.steps=1", "rollout.max_tokens=2", *extra),
                   problems=digit_problems(8)) == 0
        return load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors")), _steps(out)[-1]

    base, _ = one_step("base")
    assert "has no effect" not in capsys.readouterr().err
    w, _ = one_step("higher", "algo.clip_high=0.28")
    assert all(torch.equal(w[k], base[k]) for k in base)
    err = capsys.readouterr().err
    assert "warning: algo.clip_high = 0.28 has no effect in this run" in err
    base2, m2 = one_step("base2", "algo.ppo_epochs=2")
    w, m = one_step("higher2", "algo.ppo_epochs=2", "algo.clip_high=5.0")  # above every moved ratio
    assert "has no effect" not in capsys.readouterr().err
    assert m2["policy/clipfrac_high"] > 0 and m["policy/clipfrac_high"] == 0
    assert any(not torch.equal(w[k], base2[k]) for k in base2)


def test_option_conflicts_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="algo.dynamic_sampling = true .*'gae'"):
        load_config(None, ["algo.name=ppo", "algo.dynamic_sampling=true"])
    with pytest.raises(ConfigError, match="algo.dual_clip = 3.0 with algo.policy_loss = cispo"):
        load_config(None, ["algo.policy_loss=cispo", "algo.dual_clip=3.0"])
    with pytest.raises(ConfigError, match="algo.policy_loss.*allowed"):
        load_config(None, ["algo.policy_loss=trpo"])
