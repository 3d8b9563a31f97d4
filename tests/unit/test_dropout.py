"""Dropout is off in training (model.disable_dropout, default true): the old logprobs are computed in
eval mode, so with dropout active in the training forward the PPO ratio would not start at 1."""

from __future__ import annotations

import torch

from mathrl.models.loading import disable_dropout
from mathrl.testing.tiny import tiny_config


def _model(p: float):
    from transformers import LlamaForCausalLM

    cfg = tiny_config(50, hidden_size=32)
    cfg.attention_dropout = p
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def test_disable_dropout_makes_train_mode_equal_eval_mode():
    ids = torch.randint(0, 50, (2, 9))
    model = _model(0.5)
    model.train()
    a, b = model(ids).logits, model(ids).logits
    assert not torch.allclose(a, b)  # the control: dropout is active in train mode
    assert disable_dropout(model) > 0
    assert model.config.attention_dropout == 0.0
    torch.testing.assert_close(model(ids).logits, model.eval()(ids).logits.detach(), atol=1e-6, rtol=0)
    assert disable_dropout(model) == 0
