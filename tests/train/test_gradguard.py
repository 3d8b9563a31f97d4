"""GradGuard keeps its guarantee (the first NaN/inf gradient is found and named before any optimizer
step) with one host sync per check instead of one per parameter and micro-batch."""

from __future__ import annotations

import pytest
import torch

from mathrl.train.models import GradGuard


@pytest.fixture
def model(tiny_model):
    return tiny_model.train()


def _backward(model, n_micro=3):
    for i in range(n_micro):
        ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(i))
        model(ids, labels=ids).loss.backward()


class _PerParameterSync(GradGuard):
    """The old guard (negative control): a host sync inside every hook."""

    def _hook(self, name):
        def check(grad):
            if self._bad is None and not bool(torch.isfinite(grad.sum())):
                self._bad = name
        return check


def _count_syncs(monkeypatch):
    count = [0]
    real = torch.Tensor.__bool__

    def counting(self):
        count[0] += 1
        return real(self)

    monkeypatch.setattr(torch.Tensor, "__bool__", counting)
    return count


@pytest.mark.parametrize("cls, max_syncs", [(GradGuard, 1), (_PerParameterSync, None)],
                         ids=["fused", "negative-control-per-parameter"])
def test_host_syncs_per_step_are_bounded(model, monkeypatch, cls, max_syncs):
    n_params = sum(1 for p in model.parameters() if p.requires_grad)
    guard = cls(model)
    count = _count_syncs(monkeypatch)
    _backward(model)
    assert guard.bad is None
    if max_syncs is not None:
        assert count[0] <= max_syncs, count[0]
    else:
        assert count[0] >= n_params  # the control really syncs per parameter: the bound can fail
    guard.remove()


def test_a_nan_gradient_is_found_and_named(model):
    name, param = list(model.named_parameters())[5]
    param.register_hook(lambda g: torch.where(torch.arange(g.numel()).view_as(g) == 3, float("nan"), g))
    guard = GradGuard(model)
    _backward(model, n_micro=1)
    _backward(model, n_micro=1)  # a later finite micro-batch does not hide it
    assert guard.bad == name
    guard.reset()
    assert guard.bad is None
    guard.remove()
