"""The padding-free layout (mathrl/train/varlen.py) in the trainer: which models get it, what the
micro-batch planner budgets for it, the attention setting that selects it, and a PPO run through
``mathrl.train.run`` that ends with the padded run's weights.

The forward itself (logprobs, entropies, values, gradients; sdpa and eager; Llama and Qwen2; DeepSpeed
ZeRO-1/3) is compared with an unpadded row-alone reference in tests/train/test_forward_reference.py,
with negative controls there."""

from __future__ import annotations

import os

import pytest
import torch
from _train_tasks import digit_cfg, digit_problems, step_rows
from safetensors.torch import load_file

from mathrl.models import ModelError
from mathrl.models.loading import set_attention
from mathrl.testing.tiny import build_tiny_model
from mathrl.train import checkpoint as ckpt
from mathrl.train import run
from mathrl.train import varlen
from mathrl.train.rows import ForwardBatch
from mathrl.train.forward import plan_micro_batches
from mathrl.train.layouts import Varlen, choose_layout

os.environ.setdefault("OMP_NUM_THREADS", "2")


class _Vocab:
    pad_token_id, eos_token_id, bos_token_id = 0, 1, None

    def __len__(self) -> int:
        return 64


def test_layout_choice_by_attention_kernel_and_request():
    model = build_tiny_model(_Vocab(), seed=0, attn_implementation="sdpa")
    def names(*requests, g=4):
        return tuple(choose_layout(model, p, g).name for p in requests)

    assert names(False, True, "one_call", "varlen") == ("shared-prompt", "packed", "packed-one-call", "varlen")
    assert names(False, True, "one_call", g=1) == ("padded",) * 3  # one row per prompt: nothing to share
    # a kernel that takes packed sequences without a mask: packing means padding-free; off stays off
    for kernel in varlen.VARLEN_ATTENTION:
        model.config._attn_implementation = kernel
        assert names(True, False) == ("varlen", "shared-prompt"), kernel
    model.config._attn_implementation = "sdpa"
    model.gradient_checkpointing_enable()  # drops the prompt cache: padded, unless padding-free is asked for
    assert names(True, False, "varlen") == ("padded", "padded", "varlen")


def test_real_token_budget_by_hand():
    """Rows of (prompt, response) = (3, 2), (1, 4), (2, 1), (4, 4): real tokens 5, 5, 3, 8. A budget of 10
    holds rows 0-1 (10), then row 2 (3; with row 3: 11 > 10), then row 3. The padded cost would be
    2 x (3 + 4) = 14 for the first two rows alone."""
    pm = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1], [1, 1, 1, 1]])
    rm = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]).bool()
    assert [r.tolist() for r in plan_micro_batches(pm, rm, 10, real=True)] == [[0, 1], [2], [3]]
    assert [r.tolist() for r in plan_micro_batches(pm, rm, 10)] == [[0], [1], [2], [3]]
    ids = torch.arange(16).view(4, 4)
    mb = Varlen().micro_batch(ForwardBatch(ids, pm, ids + 100, rm), torch.tensor([0, 1]))
    assert mb.ids.tolist() == [[1, 2, 3, 100, 101, 7, 104, 105, 106, 107]]
    assert mb.pos.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
    assert mb.keep.tolist() == [2, 3, 5, 6, 7, 8] and mb.targets.tolist() == [[100, 101, 104, 105, 106, 107]]
    assert (mb.real_tokens, mb.T) == (10, 4)


def test_an_attention_kernel_this_machine_lacks_names_the_setting():
    model = build_tiny_model(_Vocab(), seed=0, attn_implementation="sdpa")
    with pytest.raises(ModelError, match=r"model.attn_implementation=flash_attention_2: .*allowed here"):
        set_attention(model, "flash_attention_2")  # no flash-attn package (and no GPU) here
    set_attention(model, "eager")
    assert model.config._attn_implementation == "eager"


@pytest.mark.slow
def test_ppo_run_padding_free_ends_with_the_padded_runs_weights(digit_model_dir, tmp_path, monkeypatch):
    """One PPO step (critic and KL on; 2 mini-batches x 2 epochs, so four optimizer steps each for the
    policy and the critic) through ``run``: padded rows vs padding-free micro-batches (asked for with
    train.padding_free on sdpa). Same samples (same seed), so the weights and the logged losses agree to
    float32 rounding; the padding-free builder really ran."""
    built = []
    real = varlen.make_varlen_micro_batch

    def spy(tokens, rows, *rest, **kw):
        mb = real(tokens, rows, *rest, **kw)
        built.append((mb.real_tokens, rows.numel()))
        return mb

    monkeypatch.setattr("mathrl.train.layouts.make_varlen_micro_batch", spy)
    weights, logs = {}, {}
    for name, extra in (("padded", ["train.packing=false", "train.share_prompt=false"]),
                        ("varlen", ["train.padding_free=true"])):
        out = tmp_path / name
        cfg = digit_cfg(digit_model_dir, out, "logging.console=plain", "algo.name=ppo", "train.steps=1",
                        "train.mini_batch_size=2", "algo.ppo_epochs=2", "train.micro_batch_tokens=48", *extra)
        assert run(cfg, problems=digit_problems()) == 0
        step = ckpt.list_checkpoints(out)[-1][1]
        weights[name] = {**load_file(str(step / "policy" / "model.safetensors")),
                         **{f"critic.{k}": v for k, v in load_file(str(step / "critic" / "backbone.safetensors")).items()}}
        logs[name] = step_rows(out)[-1]
    # budgeted by real tokens (each row runs its own prompt): the shared-prompt planner, which counts a
    # group's prompt once, would put two groups (about 64 real tokens) in one micro-batch of 48
    assert built and all(t <= 48 for t, _ in built) and max(t for t, _ in built) > 24, built
    start = load_file(str(digit_model_dir / "model.safetensors"))
    moved = 0
    for k, w in weights["padded"].items():
        torch.testing.assert_close(weights["varlen"][k], w, atol=2e-5, rtol=1e-4, msg=lambda m: f"{k}: {m}")
        moved += k in start and bool((w - start[k]).abs().max() > 1e-3)
    assert moved > 0  # the update moved the weights: the comparison is not between two starting points
    # (the per-micro-batch means, e.g. policy/clipfrac, differ: the two layouts split the rows differently)
    for key in ("loss/policy", "loss/value", "policy/grad_norm"):
        assert logs["varlen"][key] == pytest.approx(logs["padded"][key], rel=1e-5, abs=1e-7), key
