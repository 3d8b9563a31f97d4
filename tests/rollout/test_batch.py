"""Unit tests for the rollout records and the sampling math (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.rollout.batch import RolloutBatch, Sample, SamplingConfig, collate
from mathrl.rollout.hf import cut_at_stop
from mathrl.rollout.sampling import sampling_logprobs


def test_sampling_config_validation():
    assert SamplingConfig(stop="x").stop == ("x",)
    assert SamplingConfig.from_dict(SamplingConfig(stop=["a"], seed=3).to_dict()) == SamplingConfig(stop=("a",), seed=3)
    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(max_tokens=0),
                dict(stop=[""]), dict(seed=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingConfig(**bad)


def test_sampling_logprobs_hand_computed():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    z = math.log(math.exp(2) + math.exp(1) + 1 + math.exp(-1))
    # plain, T=1
    torch.testing.assert_close(sampling_logprobs(logits, 1.0)[0], torch.tensor([2 - z, 1 - z, -z, -1 - z]))
    # T=2 halves the logits
    z2 = math.log(math.exp(1) + math.exp(0.5) + 1 + math.exp(-0.5))
    torch.testing.assert_close(sampling_logprobs(logits, 2.0)[0], torch.tensor([1 - z2, 0.5 - z2, -z2, -0.5 - z2]))
    # top-k 2: renormalised over the two largest
    zk = math.log(math.exp(2) + math.exp(1))
    out = sampling_logprobs(logits, 1.0, top_k=2)[0]
    torch.testing.assert_close(out[:2], torch.tensor([2 - zk, 1 - zk]))
    assert torch.isinf(out[2:]).all()
    # top-p: probs are .644, .237, .087, .032 -> p=0.5 keeps 1 token, p=0.7 keeps 2, p=0.9 keeps 3
    assert torch.isfinite(sampling_logprobs(logits, 1.0, top_p=0.5)[0]).sum() == 1
    assert sampling_logprobs(logits, 1.0, top_p=0.5)[0, 0] == 0
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, top_p=0.7)[0, :2], torch.tensor([2 - zk, 1 - zk]))
    assert torch.isfinite(sampling_logprobs(logits, 1.0, top_p=0.9)[0]).sum() == 3
    # greedy: raw log_softmax
    torch.testing.assert_close(sampling_logprobs(logits, 0.0)[0], torch.tensor([2 - z, 1 - z, -z, -1 - z]))


def _batch() -> RolloutBatch:
    samples = [[Sample([5, 6, 2], [-0.1, -0.2, -0.3], "stop", "ab"), Sample([7], [-1.0], "length", "c")],
               [Sample([8, 9], [-0.5, -0.6], "length", "de"), Sample([2], [-0.01], "stop", "")]]
    return collate([[1, 2, 3], [4]], samples, ["p0", "p1"], pad_token_id=0)


def test_collate_layout():
    b = _batch()
    b.validate()
    assert len(b) == 4 and b.num_prompts == 2 and b.group_size == 2
    assert b.prompt_ids.tolist() == [[1, 2, 3], [1, 2, 3], [0, 0, 4], [0, 0, 4]]
    assert b.prompt_mask.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert b.response_ids.tolist() == [[5, 6, 2], [7, 0, 0], [8, 9, 0], [2, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]]
    assert b.group_index.tolist() == [0, 0, 1, 1]
    assert b.num_tokens == 7 and b.response_lengths.tolist() == [3, 1, 2, 1]
    assert b.truncated == [False, True, True, False]  # the rows that stopped at max_tokens
    torch.testing.assert_close(b.logprobs[2], torch.tensor([-0.5, -0.6, 0.0]))
    ids, mask = b.sequences()
    assert ids.shape == (4, 6) and mask[2].tolist() == [0, 0, 1, 1, 1, 0]
    assert b.to("cpu").response_ids.data_ptr() != 0


@pytest.mark.parametrize("breakage,match", [
    (lambda b: b.logprobs.__setitem__((0, 0), 0.5), "logprobs"),
    (lambda b: b.logprobs.__setitem__((1, 2), -1.0), "padding positions are not 0"),
    (lambda b: b.response_mask.__setitem__((1, 2), 1), "right-padded"),
    (lambda b: b.finish_reason.__setitem__(0, "eos"), "finish_reason"),
    (lambda b: b.group_index.__setitem__(1, 1), "group_index"),
])
def test_validate_catches(breakage, match):
    b = _batch()
    breakage(b)
    with pytest.raises(ValueError, match=match):
        b.validate()


def test_cut_at_stop():
    assert cut_at_stop("x = 4.\n\nDone", ["\n\n", "."]) == ("x = 4", True)
    assert cut_at_stop("abc", ["z"]) == ("abc", False)


def test_select_groups_repads_and_keeps_rows_together():
    from mathrl.rollout.batch import select_groups

    a = collate([[5, 6], [7]], [[Sample([1, 2, 3], [-0.1, -0.2, -0.3], "stop", "a0"), Sample([4], [-0.4], "length", "a1")],
                                [Sample([9], [-0.9], "stop", "b0"), Sample([8, 8], [-0.8, -0.7], "stop", "b1")]],
                ["A", "B"], pad_token_id=0)
    b = collate([[1, 2, 3, 4]], [[Sample([6, 6, 6, 6, 6], [-0.6] * 5, "length", "c0"), Sample([], [], "stop", "c1")]],
                ["C"], pad_token_id=0)
    out = select_groups([a, b], [(1, 0), (0, 1)])  # C's group, then B's
    out.validate()
    assert out.prompt_text == ["C", "B"] and out.response_text == ["c0", "c1", "b0", "b1"]
    assert out.finish_reason == ["length", "stop", "stop", "stop"]
    assert out.prompt_ids.tolist() == [[1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 7], [0, 0, 0, 7]]
    assert out.response_ids.shape == (4, 5) and out.response_ids[2].tolist() == [9, 0, 0, 0, 0]
    assert out.response_mask.sum(1).tolist() == [5, 0, 1, 2]
    assert torch.allclose(out.logprobs[3, :2], torch.tensor([-0.8, -0.7]))
    assert out.group_index.tolist() == [0, 0, 1, 1]
    narrow = select_groups([a, b], [(0, 1)])  # the widths shrink to the picked groups
    assert narrow.prompt_ids.shape == (2, 1) and narrow.response_ids.shape == (2, 2)
    with pytest.raises(ValueError, match="at least one"):
        select_groups([a], [])


def _draw_frequencies(sampler, logprobs: torch.Tensor, draws: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    chunk = max(1, min(draws, 2_000_000 // logprobs.shape[-1]))
    counts = torch.zeros(logprobs.shape[-1], dtype=torch.float64)
    for start in range(0, draws, chunk):
        rows = logprobs.expand(min(chunk, draws - start), -1).contiguous()
        counts += torch.bincount(sampler(rows, False, g), minlength=logprobs.shape[-1]).double()
    return counts / draws


@pytest.mark.slow
def test_sample_tokens_draws_the_distribution_and_never_a_cut_token():
    """Frequencies over 200k draws within 5 standard errors of p, never a token with p = 0 (cut by
    top-k / top-p); the greedy draw is the argmax. Negative control: a sampler off by one token in
    its cumulative sum is rejected by the same check."""
    from mathrl.rollout.sampling import sample_tokens

    p = torch.tensor([0.5, 0.0, 0.3, 0.0, 0.15, 0.05, 0.0])
    lp = torch.log(p)[None]  # log 0 = -inf, as sampling_logprobs marks a cut token

    def close(sampler) -> bool:
        f = _draw_frequencies(sampler, lp, 200_000)
        se = (p.double() * (1 - p.double()) / 200_000).sqrt()
        return bool(((f - p.double()).abs() <= 5 * se + 1e-12).all() and (f[p == 0] == 0).all())

    assert close(sample_tokens)

    def shifted(logprobs, greedy, g):  # the mutation: an exclusive cumulative sum
        cdf = torch.cumsum(logprobs.exp(), -1, dtype=torch.float64) - logprobs.exp().double()
        u = torch.rand((logprobs.shape[0], 1), generator=g, dtype=torch.float64)
        return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logprobs.shape[-1] - 1)

    assert not close(shifted)
    # a real vocabulary after top-p: no cut token is ever drawn, the kept mass is followed
    g = torch.Generator().manual_seed(3)
    big = sampling_logprobs(torch.randn(1, 49152, generator=g) * 4, temperature=1.0, top_p=0.8)
    f = _draw_frequencies(sample_tokens, big, 20_000, seed=1)
    assert (f[torch.isinf(big[0])] == 0).all() and torch.isinf(big[0]).sum() > 40_000
    top = int(big[0].argmax())
    assert abs(float(f[top]) - float(big[0, top].exp())) < 0.02
    assert torch.equal(sample_tokens(big.expand(3, -1), True, None), big.argmax(-1).expand(3))
