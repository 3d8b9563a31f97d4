"""Trainer-level loss normalisation with realistic shapes: responses of 2..12 tokens, split into 1, 2 and
4 micro-batches, and 2 gloo ranks with different token and micro-batch counts, through the real
DeepSpeed engine (ZeRO 1/2/3). The parameter change of one update must not depend on the split; the
classic per-micro-batch token mean (a mutated trainer) must be caught by the same comparison."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _train_tasks import torchrun

pytestmark = pytest.mark.slow

# float32 sums in another order: the change ~ the gradient (lr 1, Adam eps 1) agrees to ~1e-7 relative
REL_TOL = 1e-5
MUTANT_MIN_REL = 1e-2


def run_worker(model_dir: Path, out: Path, ws: int, timeout: int = 420, script: Path | None = None,
               args: tuple = ()) -> dict:
    """torchrun a worker script that saves its result to ``out``; a hang fails after ``timeout``."""
    script = script or Path(__file__).with_name("_norm_update.py")
    rc, log = torchrun(script, (model_dir, out, *args), ws, timeout)
    assert rc == 0, log[-4000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def results(digit_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("norm")
    return run_worker(digit_model_dir, tmp / "ws1.pt", 1), run_worker(digit_model_dir, tmp / "ws2.pt", 2)


def _rel(a: dict, b: dict) -> float:
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    den = max(float(b[k].abs().max()) for k in b)
    return num / den


def test_the_worker_made_the_intended_splits(results):
    ws1, ws2 = results
    plans1, = ws1["plans"]
    assert {k[2]: v for k, v in plans1.items()} == {1: 1, 2: 2, 4: 4}
    r0, r1 = ws2["plans"]
    assert set(r0.values()) == {2} and set(r1.values()) == {1}  # uneven work across ranks


@pytest.mark.parametrize("agg, mode, expect_equal", [
    ("token-mean", "global", True), ("seq-mean-token-mean", "global", True),
    # every micro-batch holds whole groups of 4 responses, so a per-micro-batch *sequence* count happens
    # to be right for seq-mean-token-mean; the per-micro-batch *token* mean is the classic bug
    ("token-mean", "per_micro", False)],
    ids=["token-mean", "seq-mean-token-mean", "negative-control-per-micro-batch-token-mean"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_update_does_not_depend_on_micro_batches_or_ranks(results, stage, agg, mode, expect_equal):
    ws1, ws2 = results
    base = ws1["deltas"][(stage, agg, 1, "global")]  # one micro-batch, one rank: the reference
    assert max(float(v.abs().max()) for v in base.values()) > 1e-3  # the update did something
    cases = {f"{n} micro-batches": ws1["deltas"][(stage, agg, n, mode)] for n in (2, 4)}
    cases["2 ranks, 2 + 1 micro-batches"] = ws2["deltas"][(stage, agg, "ws2", mode)]
    errors = {name: _rel(d, base) for name, d in cases.items()}
    print(f"[normalisation] zero {stage} {agg} {mode}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    if expect_equal:
        assert all(e < REL_TOL for e in errors.values()), errors
    else:  # the classic mean weights short and long micro-batches alike: the comparison must catch it
        assert all(e > MUTANT_MIN_REL for e in errors.values()), errors
