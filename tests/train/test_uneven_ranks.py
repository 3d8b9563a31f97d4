"""Two gloo ranks with uneven work on the real model: SmolLM2-135M-Instruct, sampled responses of up to
64 tokens, ZeRO-2 and ZeRO-3, rank 0 with more micro-batches than rank 1. Each process runs the product's
own ``train_step`` (tests/train/_uneven_update.py): problems drawn from the stream, the real verifier, the
old/reference forwards, the loop's global normalisers, the agreed micro-batch count and the update.
Before the ranks agreed on the micro-batch count this hung (ZeRO communicates inside every backward,
ZeRO-3 inside every forward): the test has a timeout, so a regression fails instead of hanging. The
update equals one process doing the whole global batch."""

from __future__ import annotations

import pytest
from test_normalisation import run_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # three torchrun launches of the real model

# One PPO epoch: the hang needs only one pass of uneven micro-batch counts (a second epoch repeated the
# same counts and cost a third of each launch). The weight change (lr 2e-2, Adam eps 1: ~2e-2 x the
# gradient, one optimizer step) is read as the difference of float32 weights, so it carries their
# rounding (~6e-8 absolute on a change of ~6e-3); at lr 1e-3 that rounding alone is 1e-4 relative
# (measured), so the change is made large enough: measured ZeRO-2 5.8e-6, ZeRO-3 1.2e-5 (at lr 1e-2:
# 1.2e-5 and 4.6e-5, i.e. the rounding dominates). The one-process reference runs on both cores (the ranks on
# one each): its sums round in another order, measured 2.3e-5 at both stages; with per-rank token counts
# (global_normalizers without its reduce) 0.60.
REL_TOL = 1e-4


@pytest.fixture(scope="module")
def results(embedded_model_path, module_tmp):
    from pathlib import Path

    tmp = module_tmp  # removed when the module ends (real-model runs)
    script = Path(__file__).with_name("_uneven_update.py")
    # the one-process reference under ZeRO-2 (ZeRO-3 equals it: tests/train/test_normalisation.py)
    one = run_worker(embedded_model_path, tmp / "ws1.pt", 1, timeout=600, script=script, args=(2,))
    two = {stage: run_worker(embedded_model_path, tmp / f"ws2_z{stage}.pt", 2, timeout=600, script=script,
                             args=(stage,)) for stage in (2, 3)}
    return one, two


def test_the_ranks_had_uneven_work(results):
    _, ws2 = results
    for stage, res in ws2.items():
        r0, r1 = res["micro_batches"]
        assert all(a > b for a, b in zip(r0[stage], r1[stage])), (stage, r0, r1)
    lengths = ws2[2]["lengths"]
    assert min(lengths) >= 8 and max(lengths) > min(lengths), lengths  # several tokens, different lengths


@pytest.mark.parametrize("stage", [2, 3])
def test_two_uneven_ranks_equal_one_process(results, stage):
    ws1, ws2 = results
    base, two = ws1["deltas"][2], ws2[stage]["deltas"][stage]
    scale = max(float(v.abs().max()) for v in base.values())
    assert scale > 1e-3  # the update did something
    err = max(float((two[k] - base[k]).abs().max()) for k in base) / scale
    print(f"[uneven ranks] zero {stage}: relative difference {err:.2e}, micro-batches per rank "
          f"{ws2[stage]['micro_batches']}, response lengths {ws2[stage]['lengths']}")
    assert err < REL_TOL, err
