"""Exact resume beyond the float32 case of tests/train/test_trainer.py: a bfloat16 run resumed in a process
that ran a ZeRO-3 model before (the first GPU check's failure), and a run with dropout (the global random
generators travel in the checkpoint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _train_tasks import crash_copy, digit_cfg, digit_problems, digit_tokenizer, step_rows, without_timing
from safetensors.torch import load_file

from mathrl.procs import without_dist_env
from mathrl.train import checkpoint as ckpt
from mathrl.train import run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 (q/k/v biases like Qwen2.5, whose bias add is where ZeRO-3's linear rounds differently in
    bf16) with the digit tokenizer; attention dropout 0.1 in its config (model.disable_dropout, on by default,
    sets it to 0)."""
    from mathrl.testing.tiny import build_tiny_qwen2_model

    path = tmp_path_factory.mktemp("qwen_digit")
    tok = digit_tokenizer()
    model = build_tiny_qwen2_model(tok, seed=0, hidden_size=32, layers=2)
    model.config.attention_dropout = 0.1
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors"))


def _assert_same_run(full: Path, part: Path) -> None:
    a, b = _final_weights(full), _final_weights(part)
    differ = {k: float((a[k].float() - b[k].float()).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not differ, f"the resumed run's step-3 weights differ from the uninterrupted run's: {differ}"
    assert without_timing(step_rows(part)) == without_timing(step_rows(full))


def test_bf16_resume_after_a_zero3_run_is_exact(qwen_dir, tmp_path):
    """The first GPU check (scripts/gpu_check.py) resumed its bf16 ZeRO-2 run after the ZeRO-3 runs, in the
    same process, and got weights up to 3e-5 off the uninterrupted run (made before them). DeepSpeed's ZeRO-3
    had swapped torch.nn.functional.linear for its own, which adds the bias after rounding the product to
    bf16, and never swapped it back; a run now starts with torch's own (setup.restore_torch_linear). Fresh
    process, so the uninterrupted run is made before any ZeRO-3 model existed in it."""
    script = Path(__file__).parent / "_resume_after_zero3.py"
    env = {**without_dist_env(), "OMP_NUM_THREADS": "1"}  # a world of its own (this process may hold one)
    proc = subprocess.run([sys.executable, str(script), str(qwen_dir), str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=str(Path(__file__).parents[2]))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "linear is zero3_linear_wrap" in proc.stdout  # the ZeRO-3 run did swap it (the condition tested)
    assert all(w.dtype == torch.bfloat16 for w in _final_weights(tmp_path / "full").values())
    _assert_same_run(tmp_path / "full", tmp_path / "part")


def test_resume_with_dropout_is_exact(qwen_dir, tmp_path):
    """With dropout on (model.disable_dropout=false) the training forwards draw masks from torch's global
    generator; a resume used to start it from the seed again, so step 3 drew step 1's masks. The checkpoint
    now holds each rank's generators (rng_rank<r>.pt)."""
    args = ("model.disable_dropout=false", "train.steps=3", "train.save_every=1", "train.keep_last=3")
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(digit_cfg(qwen_dir, full, *args), problems=digit_problems()) == 0
    folder = ckpt.list_checkpoints(full)[-1][1]
    assert (folder / ckpt.rng_file(0)).is_file() and ckpt.file_owner(ckpt.rng_file(1), 2) == 1
    crash_copy(full, part, keep_step=2)
    assert run(digit_cfg(qwen_dir, part, *args, "train.resume=auto"), problems=digit_problems()) == 0
    _assert_same_run(full, part)
    # dropout acted: without it the same run ends elsewhere (else this test could not fail)
    off = tmp_path / "off"
    assert run(digit_cfg(qwen_dir, off, "train.steps=3"), problems=digit_problems()) == 0
    a, b = _final_weights(full), _final_weights(off)
    assert any(not torch.equal(a[k], b[k]) for k in a)
