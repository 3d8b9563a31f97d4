"""Rank-0-only work that outlasts the collective timeout, with two gloo ranks:

* held-out evaluation is split across the ranks by chunks and gathered: the report (metrics and every
  per-sample record) is identical to one process's;
* each rank hashes the checkpoint files it wrote (its ZeRO shards) on save and verifies them on resume;
  rank 0 does not hash the other rank's shards; a tampered shard of rank 1 is refused on resume with the
  file named;
* under ZeRO-3 the hf engine generates with the trainer's own (sharded) module, gathered for each
  sampling and evaluation phase on both ranks although they generate different numbers of chunks,
  and gives ZeRO-2's samples.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from _train_tasks import torchrun

from mathrl.train import checkpoint as ckpt
from mathrl.train.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SCRIPT = Path(__file__).with_name("_dist_eval.py")


def _text(path: Path) -> str:
    """The per-problem samples an evaluation wrote (gzip)."""
    return gzip.decompress(path.read_bytes()).decode()


def launch(model_dir: Path, out: Path, ws: int, steps: int, *extra: str, timeout: int = 400):
    return torchrun(SCRIPT, (model_dir, out, steps, *extra), ws, timeout)


def _hashed(out: Path, rank: int) -> list[str]:
    f = out / f"hashed_rank{rank}.txt"
    return [Path(line).name for line in f.read_text().split()] if f.exists() else []


def _eval_events(out: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("time")} for m in read_metrics(out / "metrics.jsonl")
            if m.get("event") == "eval"]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, module_tmp):
    tmp = module_tmp  # removed when the module ends (real-model runs)
    one, two = tmp / "ws1", tmp / "ws2"
    for out, ws in ((one, 1), (two, 2)):
        rc, log = launch(tiny_model_dir, out, ws, 1)
        assert rc == 0, log[-4000:]
    return one, two


def test_split_evaluation_equals_one_process(runs):
    one, two = runs
    before = "eval/step_000000/heldout/samples.jsonl.gz"
    text = _text(one / before)
    assert len(text.splitlines()) == 7  # every problem, in order (4 chunks: ranks 0, 1, 0, 1)
    assert _text(two / before) == text
    ev1, ev2 = _eval_events(one), _eval_events(two)
    assert [e["step"] for e in ev2] == [0, 1] and ev2[0] == ev1[0]
    assert "pass@2" in ev2[0] and "greedy" in ev2[0]
    # both ranks did a share: chunks of 2 problems, rank 0 the 1st and 3rd, rank 1 the 2nd and 4th
    shares = [(two / f"generated_rank{r}.txt").read_text().splitlines()[0].split() for r in (0, 1)]
    assert [len(s) for s in shares] == [4, 3], shares
    assert not set(shares[0]) & set(shares[1])


def test_each_rank_hashes_its_own_shards(runs):
    _, two = runs
    (step, folder), = ckpt.list_checkpoints(two)
    ckpt.verify(folder)  # the manifest built from both ranks' hashes is right for every file
    shards = {r: sorted(p.name for p in folder.rglob(f"*zero_pp_rank_{r}_*")) for r in (0, 1)}
    assert shards[0] and shards[1]
    h0, h1 = _hashed(two, 0), _hashed(two, 1)
    assert set(shards[1]) <= set(h1) and not set(shards[1]) & set(h0)
    assert set(shards[0]) <= set(h0) and not set(shards[0]) & set(h1)
    assert "model.safetensors" in h0 and "model.safetensors" not in h1


def test_resume_verifies_on_each_rank_and_refuses_a_tampered_shard(runs, tiny_model_dir):
    _, two = runs
    for r in (0, 1):
        (two / f"hashed_rank{r}.txt").unlink()
    rc, log = launch(tiny_model_dir, two, 2, 2)
    assert rc == 0, log[-4000:]
    first = ckpt.list_checkpoints(two)[0][1]
    assert "resumed from" in log
    # on resume rank 1 verified its own shard of step 1's checkpoint
    assert any("zero_pp_rank_1_" in n for n in _hashed(two, 1))
    assert not any("zero_pp_rank_1_" in n for n in _hashed(two, 0))
    # a flipped byte in rank 1's shard of the newest checkpoint: resume refused, the file named
    last = ckpt.list_checkpoints(two)[-1][1]
    assert last != first
    shard = next(last.rglob("*zero_pp_rank_1_*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    rc, log = launch(tiny_model_dir, two, 2, 3)
    assert rc != 0
    assert shard.name in log and "SHA-256" in log, log[-3000:]


def test_zero3_hf_engine_generates_with_the_gathered_module(tiny_model_dir, tmp_path):
    """ZeRO-3, two ranks, the hf engine: no copy of the weights beside the shards (the engine holds the
    policy's module, gathered for each generation phase). Five held-out problems in chunks of two give
    rank 0 two chunks and rank 1 one: a gather per ``generate`` call would leave rank 0 waiting for rank 1
    in its second chunk. The evaluation before training and the first step's samples equal ZeRO-2's
    (the same weights and seeds), and the run trains through both phases."""
    outs = {}
    for stage in (2, 3):
        out = tmp_path / f"z{stage}"
        rc, log = launch(tiny_model_dir, out, 2, 2, f"deepspeed.zero_stage={stage}", "data.eval_limit=5",
                         "logging.log_samples=4")
        assert rc == 0, log[-4000:]
        outs[stage] = out
    z2, z3 = outs[2], outs[3]
    assert [(z3 / f"shares_module_rank{r}.txt").read_text() for r in (0, 1)] == ["True", "True"]
    for r in (0, 1):  # every generate call (sampling and evaluation chunks) saw the whole weights
        calls = (z3 / f"whole_weights_rank{r}.txt").read_text().split()
        assert calls and set(calls) == {"True"}, (r, calls)
    shares = [(z3 / f"generated_rank{r}.txt").read_text().splitlines()[0].split() for r in (0, 1)]
    assert [len(s) for s in shares] == [3, 2], shares  # rank 0: chunks 1 and 3; rank 1: chunk 2
    before = "eval/step_000000/heldout/samples.jsonl.gz"
    assert _text(z3 / before) == _text(z2 / before)
    assert len(_text(z3 / before).splitlines()) == 5
    first = [m for m in read_metrics(z3 / "metrics.jsonl") if m.get("step") == 1 and "event" not in m]
    ref = [m for m in read_metrics(z2 / "metrics.jsonl") if m.get("step") == 1 and "event" not in m]
    for key in ("reward/mean", "response/length_mean", "response/length_max"):
        assert first[0][key] == ref[0][key], key
    assert (z3 / "rollouts.jsonl").read_text().splitlines()[:4] == (z2 / "rollouts.jsonl").read_text().splitlines()[:4]
    steps = [m for m in read_metrics(z3 / "metrics.jsonl") if "event" not in m and "step" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["bad_step"] == 0 for m in steps)


def test_zero3_online_rft_generates_with_the_gathered_module(tiny_model_dir, tmp_path):
    """The RFT driver samples through the same phase (mathrl/ablate/methods.py): under ZeRO-3 on two
    ranks its hf engine holds the policy's module and every generate call sees the whole weights."""
    out = tmp_path / "rft"
    rc, log = launch(tiny_model_dir, out, 2, 2, "deepspeed.zero_stage=3", "method=online_rft")
    assert rc == 0, log[-4000:]
    for r in (0, 1):
        assert (out / f"shares_module_rank{r}.txt").read_text() == "True"
        calls = (out / f"whole_weights_rank{r}.txt").read_text().split()
        assert len(calls) >= 2 and set(calls) == {"True"}, (r, calls)
