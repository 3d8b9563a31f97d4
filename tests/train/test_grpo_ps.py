"""GRPO with process supervision through the trainer (issue 41, point 2): `model.prm` is loaded frozen beside the
policy, its step scores become the ``grpo_ps`` advantages of the step, and the outcome weight mixes GRPO in."""

from __future__ import annotations

import json

import pytest
import torch
from _train_tasks import digit_cfg, digit_problems, save_prm as _prm, step_rows, without_timing
from safetensors.torch import load_file

from mathrl.algo.process import process_advantages
from mathrl.train import checkpoint as ckpt
from mathrl.train import run

pytestmark = pytest.mark.slow


def _train(model_dir, out, *extra):
    assert run(digit_cfg(model_dir, out, "train.steps=2", "rollout.max_tokens=4", "train.save_every=1",
                         "logging.log_samples=16", *extra), problems=digit_problems(8)) == 0
    weights = load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors"))
    return weights, step_rows(out)


def test_grpo_ps_trains_on_the_prms_step_scores(digit_model_dir, tmp_path):
    """(1) A PRM that scores every step alike adds no process signal: with outcome weight 1 the run is GRPO's,
    bit for bit (weights and metrics). (2) With a PRM that tells responses apart and no outcome weight, every
    logged response's advantage is the group-normalised process advantage of its logged step scores (all 16
    responses of each step are logged), and the run differs from GRPO's."""
    flat = _prm(digit_model_dir, tmp_path / "prm_flat", 0.0)
    sharp = _prm(digit_model_dir, tmp_path / "prm_sharp", 1.0)
    w_os, m_os = _train(digit_model_dir, tmp_path / "grpo")
    w_flat, m_flat = _train(digit_model_dir, tmp_path / "flat", "algo.advantage=grpo_ps", f"model.prm={flat}",
                            "algo.ps_outcome_weight=1.0")
    assert all(torch.equal(w_os[k], w_flat[k]) for k in w_os)
    ps_keys = {k for r in m_flat for k in r if k.startswith("ps/")}
    assert ps_keys == {"ps/steps_per_response", "ps/step_reward_mean"}
    assert [r["ps/step_reward_mean"] for r in m_flat] == [0.5, 0.5]
    assert without_timing([{k: v for k, v in r.items() if k not in ps_keys} for r in m_flat]) == without_timing(m_os)

    w_ps, m_ps = _train(digit_model_dir, tmp_path / "sharp", "algo.advantage=grpo_ps", f"model.prm={sharp}")
    assert any(not torch.equal(w_os[k], w_ps[k]) for k in w_os)
    assert all(r["bad_step"] == 0.0 for r in m_ps) and "time/prm_forward" in m_ps[0]
    records = [json.loads(line) for line in (tmp_path / "sharp" / "rollouts.jsonl").read_text().splitlines()]
    for step in (1, 2):
        recs = [r for r in records if r["step"] == step]
        assert len(recs) == 16
        N, T, S = 16, max(r["tokens"] for r in recs), max(len(r["step_ends"]) for r in recs)
        rewards, ends, smask = torch.zeros(N, S), torch.zeros(N, S, dtype=torch.long), torch.zeros(N, S, dtype=torch.bool)
        mask = torch.arange(T)[None] < torch.tensor([r["tokens"] for r in recs])[:, None]
        for i, r in enumerate(recs):
            k = len(r["step_ends"])
            rewards[i, :k], ends[i, :k], smask[i, :k] = torch.tensor(r["step_rewards"]), torch.tensor(r["step_ends"]), True
            assert r["step_ends"][-1] == r["tokens"] - 1  # the last step is credited through the last token
        want = process_advantages(rewards, ends, smask, torch.arange(N) // 4, mask)
        want_mean = (want * mask).sum(1) / mask.sum(1)
        got = torch.tensor([r["advantage"] for r in recs])
        torch.testing.assert_close(got, want_mean, atol=1e-5, rtol=0)
        assert len({round(x, 4) for r in recs for x in r["step_rewards"]}) > 4  # the PRM tells responses apart
        # the negative control: the outcome advantage of the same responses is not what was trained
        assert not torch.allclose(got, torch.tensor([r["reward"] for r in recs]) - 0.5, atol=1e-3)


def test_a_prm_with_another_tokenizer_or_no_prm_folder_is_refused(digit_model_dir, tiny_model_dir, tmp_path):
    from mathrl.config import ConfigError
    from mathrl.train.preflight import check_model_specs

    with pytest.raises(ConfigError, match="not a process reward model folder written by `mathrl prm train`"):
        check_model_specs(digit_cfg(digit_model_dir, tmp_path / "run", "algo.advantage=grpo_ps",
                                    f"model.prm={tmp_path}"))

    other = _prm(tiny_model_dir, tmp_path / "prm_smol", 0.0)  # SmolLM2's tokenizer, not the digit model's
    with pytest.raises(ConfigError, match="its tokenizer differs from the policy's"):
        run(digit_cfg(digit_model_dir, tmp_path / "run", "train.steps=1", "algo.advantage=grpo_ps",
                      f"model.prm={other}"), problems=digit_problems(8))


def test_grpo_ps_on_two_ranks_under_zero3_matches_zero2(digit_model_dir, tmp_path):
    """Two ranks: at ZeRO-3 the PRM is loaded as a sharded inference engine (as the reference is) and gathered for
    its forward; the run must read the same step scores and train the same as at ZeRO-2. Step 1 samples from the
    same initial weights, so its responses, step scores and advantages agree; step 2 within float rounding of the
    sharded update."""
    from pathlib import Path

    from _train_tasks import torchrun

    sharp = _prm(digit_model_dir, tmp_path / "prm_sharp", 1.0)
    logs = {}
    for stage in (2, 3):
        out = tmp_path / f"z{stage}"
        rc, log = torchrun(Path(__file__).parent / "_grpo_ps_ranks.py", (digit_model_dir, sharp, out, stage), 2)
        assert rc == 0, log[-3000:]
        logs[stage] = ([json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()],
                       step_rows(out))
    (r2, m2), (r3, m3) = logs[2], logs[3]
    assert len(m2) == len(m3) == 2 and all(r["bad_step"] == 0.0 for r in m2 + m3)
    one2, one3 = ([r for r in rs if r["step"] == 1] for rs in (r2, r3))
    assert len(one2) == len(one3) > 0 and [r["response"] for r in one2] == [r["response"] for r in one3]
    for a, b in zip(one2, one3):
        assert a["step_ends"] == b["step_ends"]
        torch.testing.assert_close(torch.tensor(a["step_rewards"]), torch.tensor(b["step_rewards"]), atol=1e-5, rtol=0)
        assert abs(a["advantage"] - b["advantage"]) < 1e-4
    for key in ("ps/step_reward_mean", "ps/steps_per_response", "loss/policy"):
        assert abs(m2[0][key] - m3[0][key]) < 1e-4, key
    assert len({round(x, 4) for r in one2 for x in r["step_rewards"]}) > 2  # the PRM tells responses apart
