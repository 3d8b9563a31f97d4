"""Tiny tasks for trainer tests (imported by tests/train)."""

from __future__ import annotations


def digit_tokenizer():
    """A 15-token word-level tokenizer (digits, a few words, special tokens) with a minimal chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{str(d): 3 + d for d in range(10)}, "show": 13, ":": 14}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    # only the first line of the last user turn ("show : 7"); the instruction lines would be <unk>s
    tok.chat_template = "{{ messages[-1]['content'].split('\\n')[0] }}"
    return tok


def digit_problems(n: int = 64):
    from mathrl.data import Problem

    return [Problem(id=f"digit/{i}", question=f"show : {i % 10}", gold=str(i % 10), source="digit")
            for i in range(n)]


def first_digit_reward(responses, golds, truncated):
    return [1.0 if r.strip()[:1] == g else 0.0 for r, g in zip(responses, golds)]


def crash_copy(full, part, keep_step: int) -> None:
    """``part`` = the run folder ``full`` as a crash right after step ``keep_step``'s checkpoint leaves it:
    later checkpoints are gone and the metrics log ends at that step (a resumed run must write the rest
    itself; a copied full log would make a log comparison pass without testing anything)."""
    import json
    import shutil
    from pathlib import Path

    shutil.copytree(full, part)
    for ck in (Path(part) / "checkpoints").glob("step_*"):
        if int(ck.name.split("_")[1]) > keep_step:
            shutil.rmtree(ck)
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

    from mathrl.train.engines import _free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ws), "--master_port",
           str(_free_port()), str(script), *map(str, args)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"world size {ws}: no result after {timeout} s (ranks hang in a collective?)\n{log[-3000:]}")
    return proc.returncode, log
