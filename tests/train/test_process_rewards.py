"""The RL step's process rewards (mathrl/train/process.py): where each step of a sampled response ends on its own
tokens, where the PRM reads it, and through which token its reward is credited; with SmolLM2's real tokenizer."""

from __future__ import annotations

import torch

from mathrl.algo.process import process_advantages
from mathrl.train.process import batch_steps, process_metrics, process_rewards, prm_scores
from mathrl.train.rows import ForwardBatch

TEXT = "First, 17 + 25 = 42.\nThen 42 * 2 = 84.\n\nSo the answer is \\boxed{84}."


def _rows(tok):
    """Three right-padded responses: three steps + EOS, EOS only (no text), and one step without EOS."""
    a = tok(TEXT, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    b = [tok.eos_token_id]
    c = tok("The answer is 5", add_special_tokens=False)["input_ids"]
    T = len(a)
    ids = torch.full((3, T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.bool)
    for i, r in enumerate((a, b, c)):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), True
    return ids, mask, (a, b, c)


def test_batch_steps_on_real_tokens(tokenizer):
    ids, mask, (a, b, c) = _rows(tokenizer)
    ends, step_mask, lengths = batch_steps(tokenizer, ids, mask)
    assert lengths == [len(a), 1, len(c)] and step_mask.sum(1).tolist() == [3, 1, 1]
    # response 0: each step ends at the first token whose decoded prefix covers its text; the last step's text
    # ends at the token before EOS
    dec = [tokenizer.decode(a[: t + 1], skip_special_tokens=True) for t in range(len(a))]
    for j, piece in enumerate(("First, 17 + 25 = 42.\n", "First, 17 + 25 = 42.\nThen 42 * 2 = 84.\n\n", TEXT)):
        e = int(ends[0, j])
        assert dec[e].startswith(piece) and not dec[e - 1].startswith(piece), (j, dec[e])
    assert int(ends[0, 2]) == len(a) - 2
    assert int(ends[1, 0]) == 0 and int(ends[2, 0]) == len(c) - 1  # no text: one step at its only token


def test_process_rewards_read_at_the_text_end_and_credit_through_the_last_token(tokenizer, tiny_model):
    from mathrl.models.value_head import ValueModel

    torch.manual_seed(0)
    prm = ValueModel.from_causal_lm(tiny_model)
    torch.nn.init.normal_(prm.value_head.weight, std=1.0)  # a head that tells the steps apart
    ids, mask, (a, b, c) = _rows(tokenizer)
    prompts = torch.tensor([tokenizer("Solve: 17 + 25, times 2.", add_special_tokens=False)["input_ids"]] * 3)
    tokens = ForwardBatch(prompts, torch.ones_like(prompts), ids, mask)
    steps = process_rewards(prm, tokenizer, tokens, token_budget=10_000, device="cpu")
    ends, step_mask, _ = batch_steps(tokenizer, ids, mask)
    want = prm_scores(prm, tokens, ends, step_mask, token_budget=10_000, device="cpu")
    torch.testing.assert_close(steps.rewards, want)  # read where the steps' texts end
    assert len(set(want[0, :3].tolist())) == 3 and ((want > 0) & (want < 1))[step_mask].all()
    # the PRM at the EOS token reads a different state: the reading position matters
    at_eos = ends.clone()
    at_eos[0, 2] = len(a) - 1
    assert not torch.allclose(prm_scores(prm, tokens, at_eos, step_mask, token_budget=10_000, device="cpu")[0, 2],
                              want[0, 2])
    # credited through the response's last token (EOS included); earlier steps where their text ends
    assert steps.ends[0].tolist() == [int(ends[0, 0]), int(ends[0, 1]), len(a) - 1]
    assert steps.ends[1, 0] == 0 and steps.ends[2, 0] == len(c) - 1
    adv = process_advantages(steps.rewards, steps.ends, steps.mask, torch.zeros(3, dtype=torch.long), mask)
    assert (adv[mask] != 0).all() and (adv[~mask] == 0).all()  # every response token has an advantage
    m = process_metrics(steps)
    assert m["ps/steps_per_response"] == 5 / 3
    assert abs(m["ps/step_reward_mean"] - float(want[step_mask].mean())) < 1e-6
