"""Host syncs of the policy update per micro-batch (issue 37): the update's own code reads one value
back from the device per micro-batch (the NaN/inf check of logprobs and loss together) and the
gradient norm once per optimizer step; its statistics
stay on the device until :func:`mathrl.train.update.host_stats` reads them all at once, with the
values ``float()`` gave one by one."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from mathrl.procs import DIST_ENV_VARS

G = 4
PROMPT_LENS = [3, 6, 4, 8]
RESPONSE_LENS = [[12, 9, 5, 11], [7, 11, 10, 2], [4, 2, 3, 4], [3, 1, 2, 3]]
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture()
def process_group(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    for k in DIST_ENV_VARS:
        if k in os.environ:
            monkeypatch.setenv(k, os.environ[k])
        else:
            monkeypatch.delenv(k, raising=False)
    from mathrl.dist.collectives import init_distributed

    return init_distributed()


def _batch():
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    B, P, T = len(PROMPT_LENS), max(PROMPT_LENS), max(max(r) for r in RESPONSE_LENS)
    pids = torch.zeros(B * G, P, dtype=torch.long)
    pmask = torch.zeros(B * G, P, dtype=torch.long)
    rids = torch.zeros(B * G, T, dtype=torch.long)
    rmask = torch.zeros(B * G, T, dtype=torch.bool)
    for b, plen in enumerate(PROMPT_LENS):
        prompt = torch.randint(3, 13, (plen,), generator=g)
        for j in range(G):
            i = b * G + j
            pids[i, P - plen:], pmask[i, P - plen:] = prompt, 1
            n = RESPONSE_LENS[b][j]
            rids[i, :n] = torch.randint(3, 13, (n,), generator=g)
            rmask[i, :n] = True
    adv = (torch.randn(B * G, generator=g)[:, None].expand(-1, T) * rmask).contiguous()
    ref_logp = -torch.rand(B * G, T, generator=g) * 3 * rmask
    sampler = -torch.rand(B * G, T, generator=g) * 3 * rmask
    return SimpleNamespace(prompt_ids=pids, prompt_mask=pmask, response_ids=rids, logprobs=sampler), rmask, adv, \
        ref_logp


def test_host_stats_equal_float_of_each_value():
    from mathrl.train.update import _acc, host_stats

    acc: dict = {}
    vals = [torch.tensor(0.1, dtype=torch.float32), 2.5, torch.tensor(1 / 3, dtype=torch.float64),
            torch.tensor(float("nan")), torch.tensor(7), torch.tensor([1e-8])]
    for i, v in enumerate(vals):
        _acc(acc, f"k{i % 3}", v)
    assert any(isinstance(v, torch.Tensor) for vs in acc.values() for v in vs)  # still on the device
    got = host_stats(acc)
    want = {f"k{r}": [float(v) for i, v in enumerate(vals) if i % 3 == r] for r in range(3)}
    assert {k: [repr(x) for x in v] for k, v in got.items()} == {k: [repr(x) for x in v] for k, v in want.items()}


@pytest.mark.slow  # starts DeepSpeed
def test_update_reads_back_once_per_micro_batch(digit_model_dir, process_group, monkeypatch):
    import mathrl.train.models as tm
    import mathrl.train.update as tu
    from mathrl.algo.losses import global_normalizers
    from mathrl.config import load_config

    batch, mask, adv, ref_logp = _batch()
    cfg = load_config(None, [f"model.name={digit_model_dir}", f"rollout.n={G}", f"train.batch_size={len(PROMPT_LENS)}",
                             "algo.kl_coef=0.1", "algo.entropy_coef=0.01", "deepspeed.zero_stage=2",
                             "train.micro_batch_tokens=25"])
    models = tm.build_models(cfg, process_group, total_steps=1)
    layout = models.layouts["policy"]
    plan = layout.plan(tu.ForwardBatch.of(batch, mask), 25)
    assert len(plan) == 4
    norms = global_normalizers([mask[r] for r in plan], reduce=None)  # one process
    tb = tu.TrainBatch(batch=batch, mask=mask, advantages=adv, ref_logp=ref_logp)

    calls = []

    def wrap(name):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, **kw):
            if sys._getframe(1).f_code.co_filename == tu.__file__:
                calls.append((name, sys._getframe(1).f_code.co_name, sys._getframe(1).f_lineno))
            return orig(self, *a, **kw)
        return counted

    for name in SYNC_METHODS:
        monkeypatch.setattr(torch.Tensor, name, wrap(name))
    stats: dict = {}
    problem = tu.update_policy(cfg, process_group, models, tb, layout.agreed(plan), norms, stats)
    monkeypatch.undo()
    assert problem is None
    # one per micro-batch, and the step's gradient norm (read in skip_or_step and for the metric)
    assert len(calls) <= len(plan) + 2, calls
    assert all(isinstance(v, torch.Tensor) for v in stats["loss/policy"])
    metrics = {k: v for k, v in tu.host_stats(stats).items()}
    assert len(metrics["loss/policy"]) == len(plan) and all(isinstance(x, float) for x in metrics["loss/policy"])
