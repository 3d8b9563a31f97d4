"""``model.autocast=bfloat16`` (mathrl/models/precision.py): bf16 matmuls on float32 weights.

On the real model (SmolLM2-135M-Instruct), one group of four real-text responses of 5 to 90 tokens,
the trainer's PPO-clip loss on the packed layout: the matmuls run in bf16 (a hook sees bf16
activations), the loss and gradients stay within bf16 rounding of the float32 ones, and weights and
gradients stay float32 (mixed precision, not bf16 training). Negative controls: an enable_autocast
that wraps nothing is caught by the dtype check, and pure bf16 weights (``model.to(bfloat16)``) by the
float32-gradient check. End to end: GRPO and PPO (critic through the shared-prompt path, which calls
the backbone and value head directly) run with autocast on the tiny model.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from mathrl.algo.losses import policy_loss
from mathrl.models.precision import ATTR, autocast_dtype, enable_autocast, resolve_autocast, without_autocast
from mathrl.train.rows import ForwardBatch
from mathrl.train.layouts import Packed

os.environ.setdefault("OMP_NUM_THREADS", "2")

RLENS = (5, 90, 37, 12)
TEXT = ("Natalia sold 48/2 = 24 clips in May. Natalia sold 48 + 24 = 72 clips altogether in April and May. "
        "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10. ") * 4


def test_config_names():
    assert autocast_dtype("off") is None and autocast_dtype("bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="allowed values are off, auto"):
        autocast_dtype("bf17")


def test_auto_is_bf16_only_where_it_is_fast(monkeypatch):
    """``auto``: bf16 on a GPU or a CPU with native bf16, float32 on an AVX2-only CPU; explicit choices stand."""
    assert resolve_autocast("auto", cuda=False, native=False) == "off"
    assert resolve_autocast("auto", cuda=False, native=True) == "bfloat16"
    assert resolve_autocast("auto", cuda=True, native=False) == "bfloat16"
    assert resolve_autocast("bfloat16", cuda=False, native=False) == "bfloat16"
    assert resolve_autocast("off", cuda=True, native=True) == "off"
    # the trainer's path (compute_dtype) follows the probe of this machine
    from mathrl.config import load_config
    from mathrl.models import precision
    from mathrl.train.models import compute_dtype
    from mathrl.dist.collectives import DistInfo

    cfg = load_config(None, ["model.autocast=auto"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native, want in ((False, None), (True, torch.bfloat16)):
        monkeypatch.setattr(precision, "native_bf16", lambda native=native: native)
        assert compute_dtype(cfg, torch.float32, DistInfo(0, 1, 0)) == want
    assert compute_dtype(cfg, torch.bfloat16, DistInfo(0, 1, 0)) is None  # bf16 parameters need no autocast


@pytest.fixture(scope="module")
def real(embedded_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path))
    prompt = tok("Natalia sold clips to 48 of her friends in April, and then half as many in May. "
                 "How many clips did she sell?")["input_ids"]
    text = tok(TEXT)["input_ids"]
    n, tw = len(RLENS), max(RLENS)
    pids = torch.tensor([prompt] * n)
    pmask = torch.ones_like(pids)
    rids = torch.full((n, tw), tok.pad_token_id or 0)
    rmask = torch.zeros(n, tw, dtype=torch.bool)
    for i, t in enumerate(RLENS):
        rids[i, :t] = torch.tensor(text[9 * i: 9 * i + t])
        rmask[i, :t] = True
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(n, generator=g)[:, None].expand(n, tw).contiguous()
    noise = 0.3 * torch.randn(n, tw, generator=g)

    def load():
        m = AutoModelForCausalLM.from_pretrained(str(embedded_model_path), dtype=torch.float32)
        m.config.use_cache = False
        return m.train()

    return load, (pids, pmask, rids, rmask), adv, noise


def _step(model, tensors, adv, noise, old=None):
    """Loss, gradients, the dtypes of one MLP projection's output and the old logprobs used, on the
    packed layout. ``old`` (default: this model's logprobs + noise) is passed in for a second model,
    so that its ratio, and so its loss, depends on its own logprobs."""
    pids, pmask, rids, rmask = tensors
    seen = []
    hook = model.model.layers[3].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        layout = Packed(len(RLENS))
        mb = layout.micro_batch(ForwardBatch(pids, pmask, rids, rmask.bool()), torch.arange(len(RLENS)), "cpu")
        model.zero_grad(set_to_none=True)
        logp, _ = layout.policy_forward(model, mb, temperature=1.0)
        m = mb.response_mask
        old = (logp.detach().float() + noise[:, : mb.T]) * m if old is None else old
        loss, _ = policy_loss(logp, old, adv[:, : mb.T], m, clip_low=0.2, clip_high=0.2, norm_tokens=float(m.sum()))
        loss.backward()
    finally:
        hook.remove()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, set(seen), old


def _check_mixed(model, result, ref) -> None:
    loss, grads, seen, _ = result
    loss32, grads32, _, _ = ref
    assert seen == {torch.bfloat16}, f"the projections ran in {seen}, not bf16"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(g.dtype == torch.float32 for g in grads.values()), "gradients are not float32"
    assert abs(loss - loss32) <= 3e-2 * max(abs(loss32), 1e-3), (loss, loss32)
    flat = torch.cat([grads[k].flatten() for k in grads32])
    flat32 = torch.cat([grads32[k].flatten() for k in grads32])
    cos = float(torch.nn.functional.cosine_similarity(flat, flat32, dim=0))
    assert cos > 0.99, cos


@pytest.mark.slow  # the real model, forward/backward passes in both precisions
def test_real_model_update_runs_bf16_matmuls_on_float32_weights(real):
    load, tensors, adv, noise = real
    model = load()
    ref = _step(model, tensors, adv, noise)
    assert ref[2] == {torch.float32}
    enable_autocast(model, torch.bfloat16)
    got = _step(model, tensors, adv, noise, old=ref[3])
    print(f"[autocast] loss fp32 {ref[0]:.6f} bf16-autocast {got[0]:.6f}")
    assert got[0] != ref[0]  # the loss does depend on the bf16 logprobs
    _check_mixed(model, got, ref)

    # negative control 1: an enable_autocast that wraps nothing
    plain = load()
    with pytest.raises(AssertionError, match="not bf16"):
        _check_mixed(plain, _step(plain, tensors, adv, noise, old=ref[3]), ref)
    # negative control 2: bf16 weights (what model.dtype=bfloat16 does) are not mixed precision
    pure = load().to(torch.bfloat16)
    with pytest.raises(AssertionError):
        _check_mixed(pure, _step(pure, tensors, adv, noise, old=ref[3]), ref)


def test_wrapped_module_copies_and_regions(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = enable_autocast(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32),
                            torch.bfloat16)
    ids = torch.tensor([[1, 2, 3, 4]])
    twin = copy.deepcopy(model)  # the copy's forward must run the copy's weights
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
        a, b = model(input_ids=ids).logits, twin(input_ids=ids).logits
        assert a.dtype == torch.bfloat16 and not torch.equal(a, b)
        with without_autocast(model):  # the hf rollout decodes in float32
            c = model(input_ids=ids).logits
        assert c.dtype == torch.float32 and model(input_ids=ids).logits.dtype == torch.bfloat16
    assert getattr(twin, ATTR) == torch.bfloat16
    import inspect  # callers choose keyword names (cache / past_key_values) from the signature

    assert inspect.signature(model.forward) == inspect.signature(type(model)(model.config).forward)
    off = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert enable_autocast(off, None) is off and not hasattr(off, ATTR)
    with without_autocast(off):
        assert off(input_ids=ids).logits.dtype == torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_runs_end_to_end_with_autocast(tiny_model_dir, tmp_path, algo):
    from _train_tasks import step_rows

    from mathrl.config import load_config
    from mathrl.train import checkpoint as ckpt
    from mathrl.train import run

    out = tmp_path / algo
    cfg = load_config("configs/demo.yaml", [
        f"model.name={tiny_model_dir}", f"algo.name={algo}", "model.autocast=bfloat16", "rollout.backend=hf",
        "rollout.max_tokens=8", "rollout.n=2", "train.batch_size=2", "train.steps=2", "data.eval_limit=2",
        "eval.n=1", "eval.k=1", "eval.max_tokens=4", f"train.output_dir={out}", "logging.tensorboard=false"])
    assert run(cfg) == 0
    for s in step_rows(out):
        assert all(v == v for k, v in s.items() if isinstance(v, float)), s  # no NaN
        assert s["tokens"] > 0
    (_, folder), = ckpt.list_checkpoints(out)
    from safetensors.torch import load_file

    weights = load_file(str(folder / "policy" / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.float32}
