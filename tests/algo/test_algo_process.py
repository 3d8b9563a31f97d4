"""Process supervision's pure functions (mathrl/algo/process.py) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.process import process_advantages, segment_steps, step_end_tokens, step_labels

T = torch.tensor


def test_segment_steps_by_the_documented_rule():
    text = "a = 1\n\nb = 2\n so 3"
    spans = segment_steps(text)
    assert spans == [(0, 7), (7, 14), (14, 18)]
    assert [text[a:b] for a, b in spans] == ["a = 1\n\n", "b = 2\n ", "so 3"]
    assert segment_steps("one step") == [(0, 8)] and segment_steps("") == []
    assert segment_steps("x\n") == [(0, 2)]
    assert segment_steps("\n\nx\ny") == [(0, 4), (4, 5)]  # leading blank lines join the first step
    assert segment_steps("x\n   \n") == [(0, 6)]  # a whitespace-only tail joins the step before
    for t in ("a\nb\n\nc", "\n", "  x  \n y", "no newline"):
        spans = segment_steps(t)
        assert "".join(t[a:b] for a, b in spans) == t  # the spans cover the text in order


def test_step_end_tokens_from_decoded_prefix_lengths():
    # tokens decode to "a =", " 1\n", "\nb", " = 2" (prefix lengths 3, 6, 8, 12); steps end at chars 7 and 12
    assert step_end_tokens([3, 6, 8, 12], [(0, 7), (7, 12)]) == [2, 3]
    assert step_end_tokens([3, 6, 8, 12], [(0, 6), (6, 12)]) == [1, 3]  # a step ending on a token boundary
    assert step_end_tokens([3, 6], [(0, 2), (2, 3), (3, 40)]) == [0, 0, 1]  # sharing a token; past the end
    assert step_end_tokens([], [(0, 1)]) == []


def test_step_labels_hard_and_soft():
    hard, soft = step_labels([[True, False, False, False], [False] * 4, [True] * 4])
    assert hard == [1.0, 0.0, 1.0] and soft == [0.25, 0.0, 1.0]
    with pytest.raises(ValueError, match="step 1 has no completions"):
        step_labels([[True], []])


def test_process_advantages_by_hand():
    """Group {0, 1}: response 0 has steps with rewards 1 and 0 ending at tokens 1 and 3, response 1 one step of
    reward 0.9 ending at token 2 (its last token). R = {1, 0, 0.9}: mean 0.6333, unbiased std 0.55076, so
    r~ = 0.6658, -1.1499 | 0.4842; each token gets the sum of the r~ of the steps ending at or after it."""
    rewards = T([[1.0, 0.0], [0.9, 0.0]], dtype=torch.float64)
    ends = T([[1, 3], [2, 0]])
    smask = T([[True, True], [True, False]])
    mask = T([[1, 1, 1, 1], [1, 1, 1, 0]])
    adv = process_advantages(rewards, ends, smask, T([7, 7]), mask, eps=0.0)
    mean = (1 + 0 + 0.9) / 3
    std = math.sqrt(((1 - mean) ** 2 + mean ** 2 + (0.9 - mean) ** 2) / 2)
    a, b, c = (1 - mean) / std, (0 - mean) / std, (0.9 - mean) / std
    want = T([[a + b, a + b, b, b], [c, c, c, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    assert adv[1, 3] == 0  # padding
    # the outcome-only control: one step per response (its reward at the last token) is GRPO's advantage
    outcome = process_advantages(T([[1.0], [0.0]]), T([[3], [2]]), T([[True], [True]]), T([0, 0]), mask, eps=0.0)
    g = 0.5 / math.sqrt(0.5)  # GRPO: (1 - 0.5) / std, std = sqrt(0.5)
    torch.testing.assert_close(outcome, T([[g, g, g, g], [-g, -g, -g, 0.0]]))


def test_process_advantages_groups_apart_and_equal_rewards_give_zero():
    rewards = T([[1.0, 1.0], [1.0, 0.0], [0.2, 0.2], [0.2, 0.2]])
    ends = T([[0, 1], [0, 1], [0, 1], [0, 1]])
    smask = torch.ones(4, 2, dtype=torch.bool)
    mask = torch.ones(4, 2)
    adv = process_advantages(rewards, ends, smask, T([0, 0, 5, 5]), mask)
    assert (adv[2:] == 0).all()  # every step reward of group 5 equal: no signal
    assert adv[0, 1] > 0 > adv[1, 1]  # group 0 normalised on its own
    with pytest.raises(ValueError, match="outside the response tokens"):
        process_advantages(rewards, ends + 5, smask, T([0, 0, 5, 5]), mask)


def test_prm_loss_by_hand():
    """Logits 0 and 2 with labels 1 and 0.25 (a soft label), a padded step: L = (log 2 + BCE(2, 0.25)) / 2 with
    BCE(z, y) = softplus(z) - y z."""
    from mathrl.algo.process import prm_loss

    z = T([[0.0, 2.0, 9.0]], dtype=torch.float64, requires_grad=True)
    y = T([[1.0, 0.25, 0.0]], dtype=torch.float64)
    sm = T([[True, True, False]])
    loss, st = prm_loss(z, y, sm)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert float(loss.detach()) == pytest.approx((sp(0.0) - 0.0 + sp(2.0) - 0.25 * 2.0) / 2, abs=1e-12)
    loss.backward()  # d/dz = (sigmoid(z) - y) / n, 0 at the padded step
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert z.grad.tolist() == [[pytest.approx((0.5 - 1) / 2), pytest.approx((sig(2.0) - 0.25) / 2), 0.0]]
    assert float(st["accuracy"]) == 0.0  # z = 0 is not > 0 for label 1; z = 2 > 0 for label 0.25
    assert float(prm_loss(z.detach(), y, sm, norm_steps=4)[0]) == pytest.approx(float(loss.detach()) / 2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        prm_loss(z.detach(), y + 1, sm)


def test_roc_auc_by_hand():
    from mathrl.algo.process import roc_auc

    assert roc_auc([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == 1.0
    assert roc_auc([0.1, 0.9], [True, False]) == 0.0
    # 0.8 (positive) vs negatives 0.5 and 0.8: 1 + 0.5 (a tie); 0.4 vs them: 0 + 0 -> 1.5 / 4
    assert roc_auc([0.8, 0.4, 0.5, 0.8], [True, True, False, False]) == 0.375
    assert math.isnan(roc_auc([0.1, 0.2], [True, True]))


def test_constant_loss_by_hand():
    from mathrl.algo.process import constant_loss, prm_loss

    # one right step in four: the best constant is 0.25, -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623
    assert constant_loss([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.562335, abs=1e-6)
    # soft labels: mean 0.5 -> ln 2, whatever their spread
    assert constant_loss([0.25, 0.75]) == pytest.approx(math.log(2))
    assert constant_loss([0.0, 0.0]) == 0.0 and constant_loss([1.0]) == 0.0
    assert math.isnan(constant_loss([]))
    # it is prm_loss at the constant logit log(m / (1 - m)), and no other constant does better
    y = torch.tensor([[1.0, 0.0, 0.3], [0.0, 0.0, 0.9]])
    m = float(y.mean())
    at_mean, _ = prm_loss(torch.full_like(y, math.log(m / (1 - m))), y, torch.ones_like(y, dtype=torch.bool))
    assert float(at_mean) == pytest.approx(constant_loss(y.flatten().tolist()), abs=1e-6)
    for z in (-2.0, -0.5, 0.5, 2.0):
        other, _ = prm_loss(torch.full_like(y, z), y, torch.ones_like(y, dtype=torch.bool))
        assert float(other) > float(at_mean)
