"""Gradient-accumulation invariance: the same batch split into 1, 2 or 4 micro-batches,
or over 2 gloo processes, gives the same gradient (to 1e-6) when each micro-batch loss is
normalised by the global counts from ``global_normalizers``."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

# The shared fixture module sits next to this file; make it importable under any pytest
# import mode (and in the spawned gloo workers, which inherit sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _algo_problem import MODES, N, accumulated_grads, full_batch_grads, gloo_worker, make_problem  # noqa: E402
from mathrl.algo.losses import global_normalizers  # noqa: E402
from mathrl_testenv import require  # noqa: E402

ATOL = 1e-6


def _splits(k: int, seed: int) -> list[torch.Tensor]:
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    return list(torch.tensor_split(perm, k))


@pytest.fixture(scope="module")
def problem():
    return make_problem()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [1, 2, 4])
def test_micro_batches_match_full_batch(problem, mode, k):
    full = full_batch_grads(problem, mode)
    assert full.abs().max() > 1e-3  # a real gradient, not all zeros
    for seed in (0, 1):  # two different shuffles
        micro = _splits(k, seed)
        norms = global_normalizers([problem["mask"][m] for m in micro], reduce=None)
        assert norms.tokens == problem["mask"].sum().item()
        assert norms.seqs == N
        acc = accumulated_grads(problem, mode, micro, norms)
        torch.testing.assert_close(acc, full, rtol=0, atol=ATOL)


def test_local_token_mean_is_not_invariant(problem):
    # Negative control: per-micro-batch token means averaged over micro-batches (the
    # common accumulation bug) change the gradient when lengths differ, so the test above
    # can fail.
    full = full_batch_grads(problem, "token-mean")
    acc = accumulated_grads(problem, "token-mean", _splits(4, 0), None)
    assert (acc - full).abs().max() > 1e-3


def test_unequal_seq_split_needs_global_seq_count(problem):
    # seq-mean modes with local sequence counts are only right for equal-size splits.
    rows = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    micro = [rows[:1], rows[1:]]
    full = full_batch_grads(problem, "seq-mean-token-mean")
    acc = accumulated_grads(problem, "seq-mean-token-mean", micro, None)
    assert (acc - full).abs().max() > 1e-3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_gloo_processes_match_full_batch(problem, tmp_path, monkeypatch):
    import torch.distributed as dist

    require(dist.is_available(), "torch.distributed is not available in this torch build")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the spawned workers only
    out = tmp_path / "grads.pt"
    mp.spawn(gloo_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    result = torch.load(out)
    for mode in MODES:
        tokens, seqs = result[mode + "/norms"].tolist()
        assert tokens == problem["mask"].sum().item() and seqs == N  # all-reduced
        torch.testing.assert_close(result[mode], full_batch_grads(problem, mode), rtol=0, atol=ATOL)
