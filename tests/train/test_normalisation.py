"""Trainer-level loss normalisation with realistic shapes: responses of 1..12 tokens, split into 1, 2 and
4 micro-batches, and 2 gloo ranks with different token and micro-batch counts, through the real
DeepSpeed engine (ZeRO 1/2/3). Each process runs the product's own RL step (tests/train/_norm_update.py:
``Trainer.setup()`` and ``Trainer.step()`` with ``RLMethod``, the rollout replayed), so the loop's
normalisers, the agreed micro-batch count and the world-size scaling are the product's. The parameter change
of one update must not depend on the split; two mutations of the product's code, installed at run time, must
be caught by the same comparison: the classic per-micro-batch token mean, and per-rank normalisers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _train_tasks import torchrun

pytestmark = pytest.mark.slow

# float32 sums in another order: the change ~ the gradient (lr 1, Adam eps 1) agrees to ~1e-7 relative
# (measured: at most 2.5e-7)
REL_TOL = 1e-5
MUTANT_MIN_REL = 1e-2  # measured: per-micro-batch token mean ~0.65, per-rank normalisers ~1.4


def run_worker(model_dir: Path, out: Path, ws: int, timeout: int = 420, script: Path | None = None,
               args: tuple = ()) -> dict:
    """torchrun a worker script that saves its result to ``out``; a hang fails after ``timeout``."""
    script = script or Path(__file__).with_name("_norm_update.py")
    rc, log = torchrun(script, (model_dir, out, *args), ws, timeout)
    assert rc == 0, log[-4000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def results(digit_model_dir, module_tmp):
    tmp = module_tmp  # removed when the module ends (real-model runs)
    # a hang (ranks disagreeing on the micro-batch count under ZeRO-2/3) fails after 300 s
    return (run_worker(digit_model_dir, tmp / "ws1.pt", 1, timeout=300),
            run_worker(digit_model_dir, tmp / "ws2.pt", 2, timeout=300))


def _rel(a: dict, b: dict) -> float:
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    den = max(float(b[k].abs().max()) for k in b)
    return num / den


def test_the_step_made_the_intended_splits(results):
    """What the product's step ran (a spy around its micro-batch loop): 1, 2 and 4 micro-batches in one
    process; with 2 ranks 2 real micro-batches on rank 0 and 1 on rank 1, both running the agreed 2."""
    ws1, ws2 = results
    records1, = ws1["records"]
    assert {k[2]: r["micro_batches"] for k, r in records1.items()} == {1: (1, 1), 2: (2, 2), 4: (4, 4)}
    r0, r1 = ws2["records"]
    assert {r["micro_batches"] for r in r0.values()} == {(2, 2)}
    assert {r["micro_batches"] for r in r1.values()} == {(1, 2)}  # uneven work, the same count of backwards


def test_the_batch_has_uneven_lengths_and_informative_advantages(results):
    ws1, ws2 = results
    lengths = ws1["lengths"]
    assert min(lengths) == 1 and max(lengths) == 12
    adv = next(iter(ws1["records"][0].values()))["advantages"]  # each row's advantage, as the step computed it
    groups = [adv[i:i + 4] for i in range(0, len(adv), 4)]
    assert all(max(map(abs, g)) > 0.1 for g in groups), groups
    assert len({tuple(round(a, 4) for a in g) for g in groups}) == len(groups), groups
    r0, r1 = ws2["records"]
    two = next(iter(r0.values()))["advantages"] + next(iter(r1.values()))["advantages"]
    assert max(abs(a - b) for a, b in zip(two, adv)) < 1e-5  # the ranks' steps saw the same batch


@pytest.mark.parametrize("agg, mode, expect_equal", [
    ("token-mean", "global", True), ("seq-mean-token-mean", "global", True),
    # every micro-batch holds whole groups of 4 responses, so a per-micro-batch *sequence* count happens
    # to be right for seq-mean-token-mean; the per-micro-batch *token* mean is the classic bug
    ("token-mean", "per_micro", False),
    # mathrl.train.loop's global_sum made the identity: each rank divides by its own counts (2 ranks only)
    ("token-mean", "per_rank", False)],
    ids=["token-mean", "seq-mean-token-mean", "negative-control-per-micro-batch-token-mean",
         "negative-control-per-rank-normaliser"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_update_does_not_depend_on_micro_batches_or_ranks(results, stage, agg, mode, expect_equal):
    ws1, ws2 = results
    base = ws1["deltas"][(stage, agg, 1, "global")]  # one micro-batch, one rank, the product: the reference
    assert max(float(v.abs().max()) for v in base.values()) > 1e-3  # the update did something
    cases = {f"{n} micro-batches": ws1["deltas"][(stage, agg, n, mode)] for n in (2, 4)
             if (stage, agg, n, mode) in ws1["deltas"]}
    cases["2 ranks, 2 + 1 micro-batches"] = ws2["deltas"][(stage, agg, "ws2", mode)]
    assert len(cases) == (1 if mode == "per_rank" else 3), sorted(cases)
    errors = {name: _rel(d, base) for name, d in cases.items()}
    print(f"[normalisation] zero {stage} {agg} {mode}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    if expect_equal:
        assert all(e < REL_TOL for e in errors.values()), errors
    else:  # the mutated product weights short and long micro-batches (or ranks) alike: the comparison catches it
        assert all(e > MUTANT_MIN_REL for e in errors.values()), errors
