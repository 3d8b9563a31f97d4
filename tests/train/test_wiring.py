"""Each configuration term reaches the update it claims to (each a defect found in review), through the real
trainer: the KL in the reward with a group estimator, the LR schedule over a whole run for several
(mini-batch, epoch) settings, value_clip = 0, file-order data, and exact resume on the real model."""

from __future__ import annotations

import shutil

import pytest
import torch
from _train_tasks import crash_copy, digit_problems, without_timing, digit_cfg, step_rows as _steps
from safetensors.torch import load_file

from mathrl.config import load_config
from mathrl.train import checkpoint as ckpt
from mathrl.train import run
from mathrl.data.splits import step_indices
from mathrl.train.loop import compute_advantages
from mathrl.train.models import optimizer_steps_per_rl_step

QUIET = ["logging.tensorboard=false", "logging.console=plain"]


def _digit_cfg(model_dir, out, *extra):
    return digit_cfg(model_dir, out, "logging.console=plain", *extra)



@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_kl_in_reward_reaches_group_advantages(estimator):
    """Before the fix the per-token KL was computed and dropped: advantages were bit-identical for KL 0
    and 50. Now beta * sum_t KL_t is part of each response's score before the group baseline."""
    cfg = load_config(None, [f"algo.advantage={estimator}", "algo.kl_in=reward", "algo.kl_coef=0.1", "rollout.n=4"])
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    group = torch.zeros(4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    kl = torch.zeros(4, 4)
    kl[0, :3] = 50.0  # response 0 is correct but far from the reference
    without, _ = compute_advantages(cfg, scores, group, mask, torch.zeros(4, 4), None)
    with_kl, _ = compute_advantages(cfg, scores, group, mask, kl, None)
    assert not torch.equal(with_kl, without)
    assert with_kl[0, 0] < 0 < without[0, 0]  # 1 - 0.1 * 150 = -14: now the worst of its group
    from mathrl.algo.advantages import get_advantage_estimator

    fn = get_advantage_estimator(estimator)
    expected = fn(torch.tensor([1.0 - 15.0, 0.0, 1.0, 0.0]), group)
    torch.testing.assert_close(with_kl[:, 0], expected)


def test_file_order_when_shuffle_is_off():
    assert step_indices(5, 0, 3, seed=1, shuffle=False) == [0, 1, 2]
    assert step_indices(5, 1, 3, seed=1, shuffle=False) == [3, 4, 0]
    assert step_indices(5, 0, 5, seed=1) != [0, 1, 2, 3, 4] or step_indices(5, 0, 5, seed=2) != [0, 1, 2, 3, 4]



LINEAR = [1.0, 2 / 3, 1 / 3, 0.0]  # after RL steps 1..4 of 4 with 1 warm-up step (in RL steps)


@pytest.mark.slow
@pytest.mark.parametrize("mini, epochs, schedule, expected", [
    (4, 1, "linear", LINEAR), (2, 1, "linear", LINEAR), (4, 2, "linear", LINEAR), (2, 2, "linear", LINEAR),
    (2, 2, "cosine", [1.0, 0.75, 0.25, 0.0])])
def test_lr_schedule_spans_the_whole_run(digit_model_dir, tmp_path, mini, epochs, schedule, expected):
    """The scheduler advances once per optimizer step (mini-batches x epochs per RL step). Before the fix
    it was sized in RL steps, so with 2 x 2 updates per step the LR was 0 from RL step 1 of 4 on."""
    cfg = _digit_cfg(digit_model_dir, tmp_path / "run", "train.steps=4", f"train.mini_batch_size={mini}",
                     f"algo.ppo_epochs={epochs}", f"train.lr_schedule={schedule}", "train.warmup_steps=1")
    assert optimizer_steps_per_rl_step(cfg) == (4 // mini) * epochs
    assert run(cfg, problems=digit_problems()) == 0
    lrs = [s["lr"] for s in _steps(tmp_path / "run")]
    assert lrs == pytest.approx([1e-2 * x for x in expected], abs=1e-12), lrs


@pytest.mark.slow
def test_value_clip_zero_means_unclipped_critic(digit_model_dir, tmp_path):
    """value_clip = 0 was accepted by the config and crashed at the first critic update."""
    out = tmp_path / "ppo"
    cfg = _digit_cfg(digit_model_dir, out, "algo.name=ppo", "algo.value_clip=0", "rollout.n=2", "train.steps=2")
    assert run(cfg, problems=digit_problems()) == 0
    steps = _steps(out)
    assert all(s["critic/vf_clipfrac"] == 0.0 and s["loss/value"] > 0 for s in steps)


@pytest.mark.slow
def test_grpo_with_kl_in_reward_runs_and_logs_the_kl(digit_model_dir, tmp_path):
    out = tmp_path / "g"
    cfg = _digit_cfg(digit_model_dir, out, "algo.kl_in=reward", "train.steps=3", "algo.kl_coef=0.5")
    assert cfg.kl_estimator == "k1"
    assert run(cfg, problems=digit_problems()) == 0
    steps = _steps(out)
    assert "loss/kl" not in steps[-1] and steps[-1]["kl/mean"] != 0.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resume_is_exact_on_the_real_model(embedded_model_path, tmp_path):
    """SmolLM2-135M-Instruct, the real verifier, sampled responses of up to 24 tokens, 2 mini-batches x 2
    epochs with a cosine schedule: stopping after step 1 and resuming gives the uninterrupted run's
    weights bit for bit and the same metrics log."""
    args = [f"model.name={embedded_model_path}", "rollout.backend=hf", "rollout.n=2", "rollout.max_tokens=24",
            "train.batch_size=2", "train.mini_batch_size=1", "algo.ppo_epochs=2", "train.steps=2",
            "train.save_every=1", "train.keep_last=3", "train.lr=1e-5", "train.lr_schedule=cosine",
            "train.warmup_steps=1", "data.source=synthetic", "data.synthetic_size=16", "data.eval_limit=1",
            "eval.n=1", "eval.k=1", "eval.max_tokens=4", "eval.greedy=false", "reward.function=correctness_format",
            "reward.format_bonus=0.2", "data.template=chat_boxed", *QUIET]  # no worked example: 75-token prompts
    full = tmp_path / "full"
    assert run(load_config("configs/demo.yaml", [*args, f"train.output_dir={full}"])) == 0
    steps = _steps(full)
    assert max(s["response/length_max"] for s in steps) > 8  # several tokens per response
    part = tmp_path / "part"
    crash_copy(full, part, keep_step=1)
    shutil.rmtree(full / "checkpoints" / "step_000001" / "ds_policy")  # its optimizer state (~2 GB) is not read again
    assert run(load_config("configs/demo.yaml", [*args, f"train.output_dir={part}", "train.resume=auto"])) == 0
    w_full = load_file(str(ckpt.list_checkpoints(full)[-1][1] / "policy" / "model.safetensors"))
    w_part = load_file(str(ckpt.list_checkpoints(part)[-1][1] / "policy" / "model.safetensors"))
    assert all(torch.equal(w_part[k], w_full[k]) for k in w_full)
    assert without_timing(_steps(part)) == without_timing(steps)
    assert any(w_full[k].ne(load_file(str(full / "checkpoints" / "step_000001" / "policy" / "model.safetensors"))[k]).any()
               for k in w_full)  # training moved the weights


def test_float16_training_is_refused_with_the_fix(digit_model_dir, tmp_path):
    from mathrl.config import ConfigError
    from mathrl.train.setup import prepare_run

    cfg = _digit_cfg(digit_model_dir, tmp_path / "fp16", "model.dtype=float16")
    with pytest.raises(ConfigError, match="model.dtype = 'float16'.*use model.dtype=bfloat16"):
        prepare_run(cfg)


@pytest.mark.slow
def test_zero3_loads_models_sharded(digit_model_dir, tmp_path):
    """Under ZeRO-3 the policy and the reference are loaded inside deepspeed.zero.Init (each rank builds
    only its shard); the flag is cleared afterwards, so a later plain load (the hf rollout's own copy)
    gets ordinary whole tensors."""
    from transformers import AutoModelForCausalLM

    from mathrl.dist.engines import zero3_init

    before = zero3_init.taken
    cfg = _digit_cfg(digit_model_dir, tmp_path / "z3", "deepspeed.zero_stage=3", "train.steps=1")
    assert run(cfg, problems=digit_problems()) == 0
    assert zero3_init.taken - before == 2  # policy and reference
    plain = AutoModelForCausalLM.from_pretrained(str(digit_model_dir))
    assert not any(hasattr(p, "ds_id") for p in plain.parameters())


@pytest.mark.slow
def test_zero3_loads_the_critic_sharded(digit_model_dir, tmp_path):
    """The PPO critic is built inside deepspeed.zero.Init under ZeRO-3 too: right after loading, its
    backbone weights are ZeRO-3 shards (no full copy), for both a causal-LM folder and a saved critic
    (whose files are loaded into the gathered shards). Outside ZeRO-3 the same load gives whole tensors."""
    from mathrl.models.value_head import ValueModel
    from mathrl.dist.collectives import init_distributed
    from mathrl.dist.engines import zero3_init
    from mathrl.dist.ds_json import ds_config

    init_distributed()
    plain = ValueModel.from_pretrained(digit_model_dir)
    assert not any(hasattr(p, "ds_id") for p in plain.parameters())
    torch.manual_seed(1)
    with torch.no_grad():
        plain.value_head.weight.normal_()
    plain.save_pretrained(tmp_path / "critic")
    cfg = ds_config(3, "none", micro_batch=1, world_size=1, grad_clip=1.0, dtype=torch.float32)
    for src in (digit_model_dir, tmp_path / "critic"):
        with zero3_init(cfg):
            sharded = ValueModel.from_pretrained(src)
        back = [p for n, p in sharded.named_parameters() if n.startswith("backbone.")]
        assert back and all(hasattr(p, "ds_id") and p.numel() == 0 for p in back), src  # partitioned at load
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(sharded.parameters())):  # the saved critic's values
        got = {n: p.detach().clone() for n, p in sharded.named_parameters()}
    for n, p in plain.named_parameters():
        torch.testing.assert_close(got[n], p.detach(), rtol=0, atol=0, msg=n)
    # and a PPO run under ZeRO-3 goes through the sharded path for policy, reference and critic
    before = zero3_init.taken
    run_cfg = _digit_cfg(digit_model_dir, tmp_path / "ppo", "deepspeed.zero_stage=3", "train.steps=1",
                         "algo.name=ppo", "rollout.n=2", "train.mini_batch_size=2")
    assert run(run_cfg, problems=digit_problems()) == 0
    assert zero3_init.taken - before == 3
