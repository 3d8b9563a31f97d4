"""Whitening (GAE advantages, REINFORCE++) uses the global batch's statistics: two gloo ranks with
unequal shares give the same result as one process on the whole batch; per-rank statistics do not."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from _algo_problem import N, whiten_batch, whiten_worker

from mathrl.algo.advantages import masked_whiten, reinforce_pp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reduce_identity_matches_local_statistics():
    x, m = whiten_batch()
    torch.testing.assert_close(masked_whiten(x, m, reduce=lambda t: t), masked_whiten(x, m), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(masked_whiten(x, m, shift_mean=False, reduce=lambda t: t),
                               masked_whiten(x, m, shift_mean=False), atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_whiten_like_one(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "w.pt"
    mp.spawn(whiten_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    parts = torch.load(out, weights_only=False)
    x, m = whiten_batch()
    full_w, full_r = masked_whiten(x, m), reinforce_pp(x, m, gamma=0.9)
    glob_w, loc_w, glob_r = (torch.zeros(N, x.shape[1]) for _ in range(3))
    for p in parts:
        glob_w[p["rows"]], loc_w[p["rows"]], glob_r[p["rows"]] = p["whiten_global"], p["whiten_local"], p["rpp_global"]
    torch.testing.assert_close(glob_w, full_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(glob_r, full_r, atol=1e-6, rtol=0)
    # negative control: statistics of each rank's own rows (the old behaviour) are far off
    assert (loc_w - full_w).abs().max() > 0.1
