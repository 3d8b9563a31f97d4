"""Policy/value losses, aggregation modes and logit reductions: hand numbers and properties."""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.logprobs import entropy_from_logits, logprobs_and_entropy_from_logits, logprobs_from_logits
from mathrl.algo.losses import LOSS_AGG_MODES, agg_loss, global_normalizers, policy_loss, value_loss

t = torch.tensor


def close(a, b, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64),
                               torch.as_tensor(b, dtype=torch.float64), rtol=0, atol=atol)


# Five valid tokens in two responses (row 1 has one padding slot):
#   token      ratio  A    -A*r    -A*clip(r, .8, 1.2)   max (loss)   d loss / d logp = d(-A r)/d logp
#   (0,0)      1.5    +1   -1.5    -1.2                  -1.2 clip    0
#   (0,1)      0.5    -1    0.5     0.8                   0.8 clip    0
#   (0,2)      1.1    +1   -1.1    -1.1                  -1.1         -1.1
#   (1,0)      1.3    -1    1.3     1.2                   1.3          1.3
#   (1,1)      0.7    +1   -0.7    -0.8                  -0.7         -0.7
RATIO = t([[1.5, 0.5, 1.1], [1.3, 0.7, 1.0]], dtype=torch.float64)
ADV = t([[1.0, -1.0, 1.0], [-1.0, 1.0, 0.0]], dtype=torch.float64)
MASK = t([[1, 1, 1], [1, 1, 0]])
OLD = t([[-1.0, -2.0, -0.5], [-3.0, -0.1, -1.0]], dtype=torch.float64)


def _logp():
    return (OLD + RATIO.log()).clone().requires_grad_()


def test_policy_loss_token_mean_by_hand():
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, ADV, MASK)
    # sum = -1.2 + 0.8 - 1.1 + 1.3 - 0.7 = -0.9 ; / 5 valid tokens = -0.18
    close(loss, -0.18)
    loss.backward()
    close(logp.grad, [[0, 0, -1.1 / 5], [1.3 / 5, -0.7 / 5, 0]])
    close(stats["clipfrac_high"], 1 / 5)  # token (0,0)
    close(stats["clipfrac_low"], 1 / 5)  # token (0,1)
    close(stats["clipfrac"], 2 / 5)
    close(stats["ratio_min"], 0.5)
    close(stats["ratio_max"], 1.5)
    close(stats["ratio_mean"], (1.5 + 0.5 + 1.1 + 1.3 + 0.7) / 5)  # 5.1 / 5 = 1.02
    kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 1.3, 0.7)) / 5
    close(stats["approx_kl"], kl)


def test_policy_loss_aggregation_modes_by_hand():
    # row sums: -1.2 + 0.8 - 1.1 = -1.5 (3 tokens) ; 1.3 - 0.7 = 0.6 (2 tokens)
    cases = {
        ("token-mean", None, None, None): -0.9 / 5,
        ("token-mean", 10.0, None, None): -0.9 / 10,  # global normaliser
        ("seq-mean-token-mean", None, None, None): (-1.5 / 3 + 0.6 / 2) / 2,  # = -0.1
        ("seq-mean-token-mean", None, 4.0, None): (-1.5 / 3 + 0.6 / 2) / 4,
        ("seq-mean-token-sum", None, None, None): (-1.5 + 0.6) / 2,  # = -0.45
        ("seq-mean-token-sum-norm", None, None, 4.0): (-1.5 / 4 + 0.6 / 4) / 2,  # = -0.1125
    }
    for (agg, nt, ns, nc), want in cases.items():
        loss, _ = policy_loss(_logp(), OLD, ADV, MASK, agg=agg, norm_tokens=nt, norm_seqs=ns, norm_const=nc)
        close(loss, want)


def test_clip_higher_is_asymmetric():
    # DAPO clip-higher: ratio 1.25 with A=+1 is clipped at 1+0.2 but not at 1+0.28
    old = t([[0.0]], dtype=torch.float64)
    logp = t([[math.log(1.25)]], dtype=torch.float64, requires_grad=True)
    loss, st = policy_loss(logp, old, t([[1.0]]), t([[1]]), clip_high=0.2)
    close(loss, -1.2)
    loss, st = policy_loss(logp, old, t([[1.0]]), t([[1]]), clip_low=0.2, clip_high=0.28)
    close(loss, -1.25)  # unclipped
    loss.backward()
    close(logp.grad, [[-1.25]])
    close(st["clipfrac_high"], 0.0)


def test_dual_clip_by_hand():
    # A = -1, c = 3:   ratio 4: max(4, 1.2) = 4 -> min(4, 3) = 3 (gradient 0)
    #                  ratio 2.5: max(2.5, 1.2) = 2.5 < 3 -> 2.5 (gradient 2.5)
    old = t([[0.0, 0.0]], dtype=torch.float64)
    logp = t([[math.log(4.0), math.log(2.5)]], dtype=torch.float64, requires_grad=True)
    adv = t([[-1.0, -1.0]], dtype=torch.float64)
    loss, st = policy_loss(logp, old, adv, t([[1, 1]]), dual_clip=3.0, agg="seq-mean-token-sum")
    close(loss, 3.0 + 2.5)
    loss.backward()
    close(logp.grad, [[0.0, 2.5]])
    close(st["dual_clipfrac"], 0.5)
    # without dual clip the first token costs 4
    close(policy_loss(logp, old, adv, t([[1, 1]]), agg="seq-mean-token-sum")[0], 4.0 + 2.5)
    # dual clip never touches positive advantages
    close(policy_loss(logp, old, -adv, t([[1, 1]]), dual_clip=3.0, agg="seq-mean-token-sum")[0], -1.2 - 1.2)


def test_gradient_zero_exactly_where_clipped():
    g = torch.Generator().manual_seed(0)
    n = 2000
    ratio = torch.exp(torch.randn(1, n, generator=g, dtype=torch.float64) * 0.5)
    ratio = ratio[(ratio - 0.8).abs().gt(1e-6) & (ratio - 1.28).abs().gt(1e-6)].reshape(1, -1)
    adv = torch.randn(ratio.shape, generator=g, dtype=torch.float64)
    old = torch.zeros_like(ratio)
    logp = ratio.log().requires_grad_()
    m = torch.ones_like(ratio)
    loss, _ = policy_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.28, agg="seq-mean-token-sum")
    loss.backward()
    clipped = ((adv > 0) & (ratio > 1.28)) | ((adv < 0) & (ratio < 0.8))
    assert clipped.any() and (~clipped).any()
    assert (logp.grad[clipped] == 0).all()
    # elsewhere the gradient is that of the unclipped surrogate: -A * ratio
    torch.testing.assert_close(logp.grad[~clipped], (-adv * ratio)[~clipped])


def test_policy_loss_padding_never_matters():
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, ADV, MASK)
    loss.backward()
    logp2 = _logp().detach()
    old2, adv2 = OLD.clone(), ADV.clone()
    logp2[1, 2], old2[1, 2], adv2[1, 2] = float("nan"), float("inf"), float("nan")
    logp2.requires_grad_()
    for agg in LOSS_AGG_MODES:
        kw = dict(agg=agg, norm_const=7.0)
        a = policy_loss(_logp(), OLD, ADV, MASK, **kw)
        b = policy_loss(logp2, old2, adv2, MASK, **kw)
        close(a[0], b[0])
        for k in a[1]:
            close(a[1][k], b[1][k])
    loss2, _ = policy_loss(logp2, old2, adv2, MASK)
    loss2.backward()
    close(logp2.grad, logp.grad)


def test_policy_loss_validation():
    with pytest.raises(ValueError, match="allowed: token-mean, seq-mean-token-mean, seq-mean-token-sum, "
                                         "seq-mean-token-sum-norm"):
        policy_loss(_logp(), OLD, ADV, MASK, agg="mean")
    with pytest.raises(ValueError, match="needs norm_const"):
        policy_loss(_logp(), OLD, ADV, MASK, agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(_logp(), OLD, ADV, MASK, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(_logp(), OLD, ADV, MASK, clip_low=1.5)
    with pytest.raises(ValueError, match="norm_tokens must be > 0"):
        policy_loss(_logp(), OLD, ADV, MASK, norm_tokens=0)


def test_empty_mask_gives_zero_loss_not_nan():
    loss, stats = policy_loss(_logp(), OLD, ADV, torch.zeros(2, 3))
    assert loss.item() == 0 and all(torch.isfinite(v) for v in stats.values())


# ----------------------------------------------------------------------------- value loss


def test_value_loss_by_hand():
    # clip 0.2
    # tok0: v=1, old=.5, R=2: (1-2)^2 = 1 ; v_clip = .5 + .2 = .7 -> (.7-2)^2 = 1.69 ; max 1.69 -> .845
    # tok1: v=2, old=1.5, R=1: (2-1)^2 = 1 ; v_clip = 1.7 -> .49 ; max 1 -> .5
    # tok2: v=0, old=0, R=.05: .0025 both -> .00125
    # token-mean: (.845 + .5 + .00125) / 3 = .44875 ; clipped branch larger on tok0 only
    v = t([[1.0, 2.0, 0.0, 7.0]], dtype=torch.float64, requires_grad=True)
    old = t([[0.5, 1.5, 0.0, 0.0]], dtype=torch.float64)
    ret = t([[2.0, 1.0, 0.05, float("nan")]], dtype=torch.float64)
    m = t([[1, 1, 1, 0]])
    loss, st = value_loss(v, old, ret, m, clip=0.2)
    close(loss, (0.845 + 0.5 + 0.00125) / 3)
    close(st["vf_clipfrac"], 1 / 3)
    close(st["value_mean"], 1.0)
    close(st["value_error"], (1 + 1 + 0.0025) / 3)
    loss.backward()
    # tok0: clipped branch, v - old = .5 > .2 so v_clip is constant -> grad 0
    # tok1: unclipped: (v - R) / 3 = 1/3 ; tok2: (0 - .05)/3 ; padding 0
    close(v.grad, [[0.0, 1 / 3, -0.05 / 3, 0.0]])
    # clip=None: plain 0.5 * (v-R)^2 -> (.5 + .5 + .00125) / 3
    close(value_loss(v, old, ret, m, clip=None)[0], (0.5 + 0.5 + 0.00125) / 3)


# ----------------------------------------------------------------------------- aggregation, normalisers


def test_agg_loss_by_hand_and_padding():
    lm = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    m = t([[1, 1, 0], [1, 0, 0]])
    close(agg_loss(lm, m, "token-mean"), 7 / 3)
    close(agg_loss(lm, m, "seq-mean-token-mean"), (1.5 + 4) / 2)
    close(agg_loss(lm, m, "seq-mean-token-sum"), (3 + 4) / 2)
    close(agg_loss(lm, m, "seq-mean-token-sum-norm", norm_const=2.0), (1.5 + 2) / 2)
    # an all-padding row does not count as a sequence
    m2 = t([[1, 1, 0], [0, 0, 0]])
    close(agg_loss(lm, m2, "seq-mean-token-mean"), 1.5)


def test_global_normalizers_single_process():
    masks = [t([[1, 1, 0], [0, 0, 0]]), t([[1, 0], [1, 1], [1, 1]])]
    # tokens: 2 + 5 = 7 ; non-empty sequences: 1 + 3 = 4
    n = global_normalizers(masks, reduce=None)
    assert (n.tokens, n.seqs) == (7.0, 4.0)
    assert global_normalizers(masks[1].bool(), reduce=None) == (5.0, 3.0)
    # `reduce` gets the [tokens, seqs] counts and its result is what comes back (3 ranks alike)
    seen = []
    n3 = global_normalizers(masks, reduce=lambda c: seen.append(c.clone()) or c * 3)
    assert (n3.tokens, n3.seqs) == (21.0, 12.0) and seen[0].tolist() == [7.0, 4.0]


@pytest.fixture
def fake_nccl(monkeypatch):
    """torch.distributed looking initialised, with an all_reduce that refuses CPU tensors as NCCL does."""
    import torch.distributed as tdist

    calls = []

    def all_reduce(tensor, *args, **kwargs):
        calls.append(tensor.device)
        if tensor.device.type == "cpu":
            raise RuntimeError("No backend type associated with device type cpu")

    monkeypatch.setattr(tdist, "is_available", lambda: True)
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "all_reduce", all_reduce)
    return calls


def test_global_normalizers_needs_reduce_and_issues_no_collective(fake_nccl):
    """scripts/bench_gpu.py called global_normalizers(cpu_masks) under an NCCL process group and crashed in
    algo/'s own all_reduce; now algo/ issues none, and a missing `reduce` is an error naming the fix."""
    masks = [t([[1, 1, 0], [1, 0, 0]]), t([[1, 1, 1]])]
    with pytest.raises(TypeError, match=r"reduce is required.*collectives\.global_sum.*reduce=None"):
        global_normalizers(masks)
    assert global_normalizers(masks, reduce=None) == (6.0, 3.0)
    with pytest.raises(TypeError, match="callable"):
        global_normalizers(masks, reduce="sum")
    assert fake_nccl == []


def test_algo_does_not_use_torch_distributed():
    """docs/architecture.md: algo/ has no torch.distributed (collectives go through mathrl.dist.collectives)."""
    import ast
    from pathlib import Path

    import mathrl.algo

    found = []
    for path in sorted(Path(mathrl.algo.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Attribute) and node.attr == "distributed":
                names = ["torch.distributed"]
            found += [f"{path.name}:{node.lineno}" for n in names if n.startswith("torch.distributed")]
    assert not found, f"torch.distributed used in mathrl/algo: {found}"


# ----------------------------------------------------------------------------- logits reductions


def _naive_logp(logits, ids, temperature=1.0):
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _naive_entropy(logits, temperature=1.0):
    x = logits.float() / temperature
    return -(torch.softmax(x, -1) * torch.log_softmax(x, -1)).sum(-1)


def test_logprobs_by_hand():
    # logits [0, ln 2, ln 3]/1: softmax = [1, 2, 3]/6 -> log p(id=2) = ln(1/2), log p(id=0) = ln(1/6)
    logits = t([[0.0, math.log(2), math.log(3)], [0.0, math.log(2), math.log(3)]])
    close(logprobs_from_logits(logits, t([2, 0])), [math.log(0.5), math.log(1 / 6)])
    # entropy of [1,2,3]/6 = -(1/6 ln 1/6 + 2/6 ln 2/6 + 3/6 ln 3/6)
    h = -sum(p * math.log(p) for p in (1 / 6, 2 / 6, 3 / 6))
    close(entropy_from_logits(logits, torch.ones(2)), [h, h])


@pytest.mark.parametrize("chunk_size", [None, 1, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_and_entropy_match_naive_values_and_gradients(chunk_size, temperature):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 37, generator=g) * 3).requires_grad_()
    ids = torch.randint(0, 37, (3, 5), generator=g)
    m = torch.ones(3, 5)
    w1, w2 = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    lp = logprobs_from_logits(logits, ids, temperature=temperature, chunk_size=chunk_size)
    en = entropy_from_logits(logits, m, temperature=temperature, chunk_size=chunk_size)
    assert lp.dtype == torch.float32 and lp.shape == (3, 5)
    ((lp * w1).sum() + (en * w2).sum()).backward()
    ours = logits.grad.clone()
    logits.grad = None
    ref_lp, ref_en = _naive_logp(logits, ids, temperature), _naive_entropy(logits, temperature)
    ((ref_lp * w1).sum() + (ref_en * w2).sum()).backward()
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(en, ref_en, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, logits.grad, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 6, (2, 4), generator=g)
    m = t([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, ids, chunk_size=3), (x,))
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, ids, mask=m, temperature=0.7), (x,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, m, chunk_size=2, temperature=1.3), (x,))
    # second-order use is not supported, but first-order through a strided slice is:
    big = torch.randn(2, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda b: logprobs_from_logits(b[:, 2:-1], ids, chunk_size=3), (big,))


def test_bfloat16_logits_computed_in_float32():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 3, 50, generator=g) * 4).bfloat16().requires_grad_()
    ids = torch.randint(0, 50, (2, 3), generator=g)
    lp = logprobs_from_logits(logits, ids)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, _naive_logp(logits, ids), rtol=1e-5, atol=1e-5)
    lp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    ref = torch.autograd.grad(_naive_logp(logits, ids).sum(), logits)[0]
    torch.testing.assert_close(logits.grad.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_masked_rows_give_zero_and_no_nan_gradient():
    logits = torch.randn(2, 3, 8)
    logits[1, 2] = float("nan")  # garbage at a padding position
    logits.requires_grad_()
    ids = t([[1, 2, 3], [4, 5, -100]])  # padding id outside the vocabulary
    m = t([[1, 1, 1], [1, 1, 0]])
    lp = logprobs_from_logits(logits, ids, mask=m)
    en = entropy_from_logits(logits, m)
    assert lp[1, 2] == 0 and en[1, 2] == 0 and torch.isfinite(lp).all() and torch.isfinite(en).all()
    (lp.sum() + en.sum()).backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[1, 2] == 0).all()


def test_logprobs_validation():
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 4\)"):
        logprobs_from_logits(torch.zeros(2, 4), t([0, 4]))
    with pytest.raises(ValueError, match="ids shape"):
        logprobs_from_logits(torch.zeros(2, 4), t([0]))
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(2, 4), torch.ones(2), temperature=0)


def test_no_grad_path_and_2d_input():
    x = torch.randn(6, 9)
    ids = torch.randint(0, 9, (6,))
    with torch.no_grad():
        torch.testing.assert_close(logprobs_from_logits(x, ids, chunk_size=4), _naive_logp(x, ids))
        torch.testing.assert_close(entropy_from_logits(x, torch.ones(6), chunk_size=4), _naive_entropy(x))


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_combined_logprobs_and_entropy_match_separate(temperature):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 4, 23, generator=g, dtype=torch.float64) * 2).requires_grad_()
    ids = torch.randint(0, 23, (2, 4), generator=g)
    m = t([[1, 1, 1, 0], [1, 1, 1, 1]])
    w1, w2 = torch.randn(2, 4, generator=g, dtype=torch.float64), torch.randn(2, 4, generator=g, dtype=torch.float64)
    lp, en = logprobs_and_entropy_from_logits(logits, ids, m, temperature=temperature, chunk_size=3)
    ((lp * w1).sum() - (en * w2).sum()).backward()
    combined = logits.grad.clone()
    logits.grad = None
    lp2 = logprobs_from_logits(logits, ids, mask=m, temperature=temperature)
    en2 = entropy_from_logits(logits, m, temperature=temperature)
    ((lp2 * w1).sum() - (en2 * w2).sum()).backward()
    torch.testing.assert_close(lp, lp2)
    torch.testing.assert_close(en, en2)
    torch.testing.assert_close(combined, logits.grad)
    # only one of the two outputs used: the other's gradient is absent, not zero-filled work
    logits.grad = None
    lp, en = logprobs_and_entropy_from_logits(logits, ids, m, temperature=temperature)
    en.sum().backward()
    ref = torch.autograd.grad(entropy_from_logits(logits, m, temperature=temperature).sum(), logits)[0]
    torch.testing.assert_close(logits.grad, ref)
    assert torch.autograd.gradcheck(
        lambda x: logprobs_and_entropy_from_logits(x, ids, m, temperature=temperature, chunk_size=5), (logits,))
