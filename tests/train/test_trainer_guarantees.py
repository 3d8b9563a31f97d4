"""Every method gets the same run guarantees from the one Trainer (issue 39, point 1): checkpoints by steps
and by minutes, the memory fit, the stop with a save after consecutive NaN steps, exact resume and held-out
evaluation hold for an RFT run (offline and online) as for a GRPO run.

Each test runs the product's :class:`mathrl.train.trainer.Trainer` with the product's step
(:class:`mathrl.train.loop.RLMethod`, :class:`mathrl.ablate.methods.RFTMethod`) on the digit task: a tiny
random model, 4 prompts x 4 samples of up to 5 tokens. The reward scores every response above 0 (1 for the
gold first digit, 0.5 otherwise), so RFT keeps rows at every step (it trains on responses with a reward
> 0) and GRPO's advantages differ within a group.
"""

from __future__ import annotations

import re

import pytest
import torch
from _train_tasks import crash_copy, digit_cfg, digit_problems, step_rows, without_timing
from safetensors.torch import load_file

from mathrl.ablate.methods import RFTMethod
from mathrl.reward.rewards import REWARDS, register_reward
from mathrl.train import checkpoint as ckpt
from mathrl.train import memory
from mathrl.train import trainer as trainer_mod
from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import RLMethod
from mathrl.train.metrics import read_metrics
from mathrl.train.trainer import Trainer

METHODS = ["grpo", "rft", "online_rft"]

if "digit_or_half" not in REWARDS:
    @register_reward("digit_or_half", needs_grades=False)
    def digit_or_half(ctx):
        """1 for the gold first digit, else 0.5: every response counts as correct for RFT."""
        return [1.0 if r.strip()[:1] == g else 0.5 for r, g in zip(ctx.responses, ctx.golds or ())]


def _method(name: str):
    return RLMethod() if name == "grpo" else RFTMethod(online=name == "online_rft")


def _cfg(model_dir, out, *extra):
    return digit_cfg(model_dir, out, "reward.terms={digit_or_half: {}}", "train.micro_batch_tokens=16",
                     "logging.console=plain", "train.keep_last=10", *extra)


def _train(method: str, model_dir, out, *extra, eval_problems=None) -> int:
    cfg = _cfg(model_dir, out, *extra)
    return Trainer(cfg, _method(method), problems=digit_problems(), eval_problems=eval_problems).fit()


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "policy" / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", METHODS)
def test_checkpoints_by_steps_by_minutes_and_at_the_end(digit_model_dir, tmp_path, method):
    def saved(name, *extra):
        assert _train(method, digit_model_dir, tmp_path / name, "train.steps=3", *extra) == 0
        return [s for s, _ in ckpt.list_checkpoints(tmp_path / name)]

    assert saved("minutes", "train.save_every=0", "train.save_every_minutes=0.00001") == [1, 2, 3]
    assert saved("steps", "train.save_every=2", "train.save_every_minutes=0") == [2, 3]


@pytest.mark.parametrize("method", METHODS)
def test_micro_batches_fit_the_free_memory(digit_model_dir, tmp_path, monkeypatch, capsys, method):
    """The free memory holds 24 tokens of activations: train.micro_batch_tokens=auto (8192) shrinks to 24 with
    a note, every step trains and logs with it, and the checkpoint keeps it for a resume."""
    monkeypatch.setattr(memory, "tokens_that_fit", lambda *a, **k: 24)
    out = tmp_path / "run"
    assert _train(method, digit_model_dir, out, "train.steps=2", "train.micro_batch_tokens=auto") == 0
    assert "using train.micro_batch_tokens=24" in capsys.readouterr().err
    rows = step_rows(out)
    assert [r["sys/micro_batch_tokens"] for r in rows] == [24.0, 24.0]
    assert ckpt.read_state(ckpt.list_checkpoints(out)[-1][1])["micro_batch_tokens"] == 24


@pytest.mark.parametrize("method", METHODS)
def test_consecutive_nan_steps_stop_after_saving_the_last_good_weights(digit_model_dir, tmp_path, monkeypatch,
                                                                       method):
    """NaN embeddings in the training forwards of steps 3 and 4 (max_bad_steps=2): both updates are skipped,
    the run saves step 4's checkpoint (the weights of step 2) and stops with a message naming it."""
    real_resume = trainer_mod.resume_and_log

    def poisoning_resume(cfg, dist, out, models, state):  # the trainer's models and state, as it builds them
        def poison(module, args, output):
            if torch.is_grad_enabled() and state.step + 1 in (3, 4):
                return output * float("nan")
            return output

        models.policy.module.get_input_embeddings().register_forward_hook(poison)
        return real_resume(cfg, dist, out, models, state)

    monkeypatch.setattr(trainer_mod, "resume_and_log", poisoning_resume)
    out = tmp_path / "stop"
    with pytest.raises(TrainingError) as info:
        _train(method, digit_model_dir, out, "train.steps=6", "train.save_every=2", "train.save_every_minutes=0",
               "train.max_bad_steps=2")
    msg = str(info.value)
    assert msg.startswith("step 4: 2 consecutive steps had NaN/inf and were skipped"), msg
    assert "the weights are those of step 2" in msg and "--resume auto" in msg
    assert re.search(r"nan", msg.split("(last one: ")[1], re.IGNORECASE), msg
    ck = dict(ckpt.list_checkpoints(out))
    assert sorted(ck) == [2, 4] and str(ck[4]) in msg
    assert _same(_weights(ck[2]), _weights(ck[4]))
    assert [r["bad_step"] for r in step_rows(out)] == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("method", METHODS)
def test_resume_continues_the_uninterrupted_run(digit_model_dir, tmp_path, method):
    """A run stopped after step 2's checkpoint and resumed ends with the uninterrupted run's weights and logs
    the same metrics (offline RFT reloads its samples of the initial model instead of sampling again)."""
    full, part = tmp_path / "full", tmp_path / "part"
    assert _train(method, digit_model_dir, full, "train.steps=4", "train.save_every=1") == 0
    first = _weights(ckpt.list_checkpoints(full)[0][1])
    last = _weights(ckpt.list_checkpoints(full)[-1][1])
    assert not _same(first, last)  # the run trains: the comparison below can fail
    crash_copy(full, part, keep_step=2)
    assert _train(method, digit_model_dir, part, "train.steps=4", "train.save_every=1", "train.resume=auto") == 0
    assert _same(_weights(ckpt.list_checkpoints(part)[-1][1]), last)
    assert without_timing(step_rows(part)) == without_timing(step_rows(full))
    events = [m.get("event") for m in read_metrics(part / "metrics.jsonl") if "event" in m]
    assert events.count("rft_sampling") == (1 if method == "rft" else 0)  # sampled once, not again on resume


@pytest.mark.parametrize("method", METHODS)
def test_held_out_evaluation_before_every_n_steps_and_at_the_end(digit_model_dir, tmp_path, method):
    out = tmp_path / "run"
    assert _train(method, digit_model_dir, out, "train.steps=3", "eval.every=2", "eval.n=1", "eval.k=1",
                  "eval.max_tokens=4", eval_problems=digit_problems(4, offset=100)) == 0
    evals = [m for m in read_metrics(out / "metrics.jsonl") if m.get("event") == "eval"]
    assert [m["step"] for m in evals] == [0, 2, 3]
    for step in (0, 2, 3):
        assert (out / "eval" / ckpt.step_dirname(step)).is_dir()
    assert "| before | after |" in (out / "summary.md").read_text()
