"""Tiny tasks for trainer tests (imported by tests/train)."""

from __future__ import annotations


from mathrl.testing.digits import FIRST_DIGIT, digit_problems, digit_tokenizer, first_digit_reward  # noqa: F401


def step_rows(out) -> list[dict]:
    """The per-step rows of ``<out>/metrics.jsonl`` (evaluation and other events left out)."""
    from pathlib import Path

    from mathrl.train.metrics import read_metrics

    return [m for m in read_metrics(Path(out) / "metrics.jsonl") if "event" not in m]


def digit_cfg(model_dir, out, *extra):
    """The digit task's GRPO config for trainer tests (hf engine, 4 prompts x 4 samples of up to 5 tokens,
    lr 1e-2, KL 0.04); ``extra`` overrides come last and win."""
    from mathrl.config import load_config

    return load_config(None, [
        f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=5", "rollout.n=4",
        "train.batch_size=4", "train.lr=1e-2", "algo.kl_coef=0.04", "data.template=chat_boxed",
        f"train.output_dir={out}", FIRST_DIGIT, "logging.tensorboard=false", *extra])


def without_timing(rows: list[dict]) -> list[dict]:
    """Metrics rows without the wall-clock and process entries (time/, throughput/, sys/), which differ
    between two runs that are otherwise the same."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "sys/"))} for r in rows]


def crash_copy(full, part, keep_step: int) -> None:
    """``part`` = the run folder ``full`` as a crash right after step ``keep_step``'s checkpoint leaves it:
    later checkpoints are gone and the metrics log ends at that step (a resumed run must write the rest
    itself; a copied full log would make a log comparison pass without testing anything)."""
    import json
    import shutil
    from pathlib import Path

    def later_checkpoints(folder, names):  # not copied at all: real-model checkpoints are GBs each
        if Path(folder) != Path(full) / "checkpoints":
            return []
        return [n for n in names if n.startswith("step_") and int(n.split("_")[1]) > keep_step]

    shutil.copytree(full, part, ignore=later_checkpoints)
    log = Path(part) / "metrics.jsonl"
    rows = [line for line in log.read_text().splitlines() if json.loads(line).get("step", 0) <= keep_step]
    log.write_text("".join(r + "\n" for r in rows))


def torchrun(script, args, ws: int, timeout: int = 420) -> tuple[int, str]:
    """Launch ``script args`` on ``ws`` local ranks with torchrun (``OMP_NUM_THREADS=1``); returns the exit
    code and the log. A hang (the ranks disagree on the collectives) fails the test after ``timeout``."""
    import os
    import signal
    import subprocess
    import sys

    import pytest

    from mathrl.dist.collectives import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ws), "--master_port",
           str(free_port()), str(script), *map(str, args)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts each worker in a session of its own: killing the launcher's group would leave the
        # hung workers running, holding the log pipe open, and the wait for the log would never end
        tree = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            log, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            log = "(the log pipe stayed open after the kill)"
        pytest.fail(f"world size {ws}: no result after {timeout} s (ranks hang in a collective?)\n{log[-3000:]}")
    return proc.returncode, log


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), whatever session they run in."""
    from mathrl.procs import child_pids

    out, todo = [], [pid]
    while todo:
        kids = child_pids(todo.pop(), zombies=True)
        out += kids
        todo += kids
    return out


def save_prm(model_dir, out, head_std: float):
    """A PRM folder as `mathrl prm train` writes it, from the digit model, with a head of the given spread (0: every
    step scores sigmoid(0) = 0.5)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mathrl.models.value_head import ValueModel

    torch.manual_seed(1)
    prm = ValueModel.from_causal_lm(AutoModelForCausalLM.from_pretrained(str(model_dir)))
    with torch.no_grad():
        if head_std:
            prm.value_head.weight.normal_(std=head_std)
        else:
            prm.value_head.weight.zero_()
        if getattr(prm.value_head, "bias", None) is not None:
            prm.value_head.bias.zero_()
    prm.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))
    return out
