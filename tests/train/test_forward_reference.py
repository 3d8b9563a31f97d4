"""The trainer's forward passes against an independent reference.

``tests/train/test_forward.py`` compares the shared-prompt forward with the plain one, but both
sides go through :func:`make_micro_batch`, so a bug in its padding, masks or position ids would be
shared and invisible. Here the reference knows nothing of micro-batches: each row alone, its
prompt and response tokens without any padding, ``model(input_ids=row[None])`` with no attention
mask and no position ids (the model's defaults), then ``log_softmax(logits / temperature)`` at the
positions that predict the response tokens.

The mathrl side is what the trainer runs: :func:`plan_micro_batches` with a token budget that
gives several micro-batches (each holding rows of different prompt and response lengths), then
:func:`make_micro_batch` + :func:`policy_forward` with ``group_size`` 1 and G (the shared-prompt
path), gradients accumulated over the micro-batches. Compared: logprobs, entropies, gradients
parameter by parameter, critic values (:func:`value_forward`, :func:`batch_values`), the no-grad
:func:`batch_logprobs`, and the same through DeepSpeed engines (ZeRO-1 and ZeRO-3, gloo on CPU).
Two architectures (tiny Llama: tied head, no biases; tiny Qwen2: q/k/v biases, untied head) and
two attention kernels (sdpa, eager).

Padding columns hold random tokens, not a pad id: a mask that lets padding through changes the
result instead of attending to a near-zero embedding. Negative controls feed mutated micro-batch
builders through the same comparison and require it to fail.

Tolerances (float32 throughout): values atol 1e-5 / rtol 1e-5, gradients atol 1e-5 / rtol 1e-4.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import pytest
import torch

from mathrl.testing.tiny import build_tiny_model, build_tiny_qwen2_model
from mathrl.models.value_head import ValueModel
from mathrl.procs import DIST_ENV_VARS
from mathrl.train.forward import (batch_logprobs, batch_values, layout_choice, make_micro_batch,
                                  plan_micro_batches, policy_forward, value_forward)
from mathrl.train.packing import make_packed_micro_batch
from mathrl.train.varlen import make_varlen_micro_batch

VOCAB = 256
G = 4                                  # responses per prompt
PLENS = (5, 11, 3, 8)                  # prompt length of each group
RLENS = (3, 12, 7, 5, 10, 4, 9, 6, 11, 3, 8, 4, 12, 5, 9, 7)  # response length of each row
PW, TW = 13, 14                        # padded widths: wider than any row (make_micro_batch trims)
TEMP = 0.7
BUDGET = 120                           # tokens per micro-batch: several micro-batches for group_size 1 and G
ATOL, RTOL = 1e-5, 1e-5                # logprobs, entropies, values (float32)
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4      # gradients (float32, summed over 16 rows)
ARCHS = {"llama": build_tiny_model, "qwen2": build_tiny_qwen2_model}


class _Vocab:
    """What the tiny builders read from a tokenizer: a 256-token vocabulary keeps the test fast."""
    pad_token_id, eos_token_id, bos_token_id = 0, 1, None

    def __len__(self) -> int:
        return VOCAB


def _model(arch: str, attn: str, seed: int = 0):
    return ARCHS[arch](_Vocab(), seed=seed, attn_implementation=attn)


@dataclass
class Batch:
    pids: torch.Tensor    # [N, PW] left-padded prompts (identical within a group)
    pmask: torch.Tensor   # [N, PW] long
    rids: torch.Tensor    # [N, TW] right-padded responses
    rmask: torch.Tensor   # [N, TW] bool
    w_lp: torch.Tensor    # [N, TW] loss weights of the logprobs
    w_ent: torch.Tensor   # [N, TW] loss weights of the entropies (and of the values)

    def prompt(self, i: int) -> torch.Tensor:
        return self.pids[i, PW - int(self.pmask[i].sum()):]

    def response(self, i: int) -> torch.Tensor:
        return self.rids[i, : int(self.rmask[i].sum())]


def _batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    n = len(RLENS)
    pids = torch.randint(2, VOCAB, (n, PW), generator=g)   # padding columns keep their random tokens
    pmask = torch.zeros(n, PW, dtype=torch.long)
    for b, plen in enumerate(PLENS):
        prompt = torch.randint(2, VOCAB, (PW,), generator=g)
        prompt[PW - plen:] = torch.randint(2, VOCAB, (plen,), generator=g)
        pids[b * G:(b + 1) * G] = prompt
        pmask[b * G:(b + 1) * G, PW - plen:] = 1
    rids = torch.randint(2, VOCAB, (n, TW), generator=g)
    rmask = torch.arange(TW)[None, :] < torch.tensor(RLENS)[:, None]
    w_lp = torch.randn(n, TW, generator=g)
    w_ent = torch.randn(n, TW, generator=g)
    return Batch(pids, pmask, rids, rmask, w_lp, w_ent)


# ---- the reference: one row at a time, unpadded, default mask and positions -----------------------

def _reference_policy(model, b: Batch, grad: bool = True):
    """Per row: logprobs [R_i] and entropies [R_i] of softmax(logits / TEMP); gradients of
    sum(w_lp * logp + w_ent * entropy) accumulated over the rows."""
    model.zero_grad(set_to_none=True)
    lps, ents = [], []
    for i in range(len(RLENS)):
        p, r = b.prompt(i), b.response(i)
        logits = model(input_ids=torch.cat([p, r])[None]).logits[0].float()
        # the logit at position j predicts token j + 1: response token t sits at len(p) + t
        logsm = torch.log_softmax(logits[len(p) - 1: len(p) - 1 + len(r)] / TEMP, -1)
        lp = logsm.gather(-1, r[:, None])[:, 0]
        ent = -(logsm.exp() * logsm).sum(-1)
        if grad:
            ((b.w_lp[i, : len(r)] * lp).sum() + (b.w_ent[i, : len(r)] * ent).sum()).backward()
        lps.append(lp.detach())
        ents.append(ent.detach())
    return lps, ents, _grads(model)


def _reference_values(critic: ValueModel, b: Batch):
    """Per row: V(state before each response token) = head(hidden state at len(p) - 1 + t)."""
    critic.zero_grad(set_to_none=True)
    vals = []
    for i in range(len(RLENS)):
        p, r = b.prompt(i), b.response(i)
        hidden = critic.backbone(input_ids=torch.cat([p, r])[None]).last_hidden_state[0]
        v = critic.value_head(hidden).squeeze(-1).float()[len(p) - 1: len(p) - 1 + len(r)]
        (b.w_ent[i, : len(r)] * v).sum().backward()
        vals.append(v.detach())
    return vals, _grads(critic)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# ---- the mathrl path ------------------------------------------------------------------------------

def _plan(b: Batch, gs: int) -> list[torch.Tensor]:
    plan = plan_micro_batches(b.pmask, b.rmask, BUDGET, group_size=gs)
    assert len(plan) >= 2, plan
    assert any(len(rows) > gs for rows in plan), plan  # some micro-batch mixes prompt lengths
    return plan


def _mathrl_policy(model, b: Batch, gs: int, builder=make_micro_batch, grad: bool = True):
    """Full [N, TW] logprobs and entropies via the trainer's micro-batches; gradients accumulated."""
    model.zero_grad(set_to_none=True)
    lp_full, ent_full = torch.zeros(b.rids.shape), torch.zeros(b.rids.shape)
    for rows in _plan(b, gs):
        mb = builder(b.pids, b.pmask, b.rids, b.rmask, rows, "cpu", gs)
        with torch.set_grad_enabled(grad):
            lp, ent = policy_forward(model, mb, temperature=TEMP, with_entropy=True)
        if grad:
            ((b.w_lp[rows, : mb.T] * lp).sum() + (b.w_ent[rows, : mb.T] * ent).sum()).backward()
        lp_full[rows, : mb.T], ent_full[rows, : mb.T] = lp.detach(), ent.detach()
    return lp_full, ent_full, _grads(model)


# ---- comparisons ----------------------------------------------------------------------------------

def _compare_rows(full: torch.Tensor, ref: list[torch.Tensor], b: Batch, what: str) -> float:
    """``full[i, :R_i]`` == ``ref[i]`` and exact zeros at padding; returns the max abs difference."""
    worst = 0.0
    for i, r in enumerate(ref):
        n = len(r)
        torch.testing.assert_close(full[i, :n], r, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}, row {i}: {m}")
        assert (full[i, n:] == 0).all(), f"{what}, row {i}: non-zero at padding"
        worst = max(worst, float((full[i, :n] - r).abs().max()))
    return worst


def _compare_grads(got: dict, ref: dict, what: str) -> float:
    assert got.keys() == ref.keys(), (what, set(got) ^ set(ref))
    assert all(float(g.abs().max()) > 0 for g in ref.values()), what  # every parameter gets a gradient
    worst = 0.0
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=GRAD_ATOL, rtol=GRAD_RTOL, msg=lambda m: f"{what}: {k}: {m}")
        worst = max(worst, float((got[k] - ref[k]).abs().max()))
    return worst


def _max_diff(full: torch.Tensor, ref: list[torch.Tensor]) -> float:
    return max(float((full[i, : len(r)] - r).abs().max()) for i, r in enumerate(ref))


def _report(case: str, **diffs: float) -> None:
    print(f"[forward-reference] {case}: " + ", ".join(f"{k}={v:.2e}" for k, v in diffs.items()))


@pytest.fixture(scope="module")
def batch() -> Batch:
    return _batch()


_REF_CACHE: dict = {}


def _policy_reference(arch: str, attn: str, b: Batch):
    key = (arch, attn)
    if key not in _REF_CACHE:
        _REF_CACHE[key] = _reference_policy(_model(arch, attn).train(), b)
    return _REF_CACHE[key]


def test_batch_shape_is_what_the_reference_needs(batch):
    """The fixture itself: groups share one prompt, prompts and responses of clearly different lengths."""
    assert batch.pmask.sum(1).tolist() == [p for p in PLENS for _ in range(G)]
    assert batch.rmask.sum(1).tolist() == list(RLENS) and min(RLENS) >= 3 and max(RLENS) >= 12
    for b in range(len(PLENS)):
        assert (batch.pids[b * G:(b + 1) * G] == batch.pids[b * G]).all()
    for gs in (1, G):
        _plan(batch, gs)


# ---- policy: logprobs, entropies, gradients ------------------------------------------------------

PACKED = functools.partial(make_micro_batch, packed=True)
# (group size, packed): padded rows alone, padded with a shared prompt, the shared prompt with each
# group's responses packed into bins (mathrl/train/packing.py), the same in one model call per
# micro-batch (ZeRO-3's layout), and every row's real tokens in one sequence without a mask
# (mathrl/train/varlen.py: train.padding_free, flash-attention's layout)
LAYOUTS = {"plain": (1, False), "shared": (G, False), "packed": (G, True), "one_call": (G, "one_call"),
           "varlen": (G, "varlen")}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_policy_forward_matches_row_alone_reference(batch, arch, attn, layout):
    gs, packed = LAYOUTS[layout]
    ref_lp, ref_ent, ref_grads = _policy_reference(arch, attn, batch)
    model = _model(arch, attn).train()
    lp, ent, grads = _mathrl_policy(model, batch, gs, builder=functools.partial(make_micro_batch, packed=packed)
                                    if packed else make_micro_batch)
    d_lp = _compare_rows(lp, ref_lp, batch, f"{arch}/{attn}/gs={gs} logprobs")
    d_ent = _compare_rows(ent, ref_ent, batch, f"{arch}/{attn}/gs={gs} entropies")
    d_grad = _compare_grads(grads, ref_grads, f"{arch}/{attn}/gs={gs}")
    _report(f"policy {arch}/{attn}/gs={gs}", logp=d_lp, entropy=d_ent, grad=d_grad)


@pytest.mark.parametrize("layout,calls", [("shared", 2), ("packed", 2), ("one_call", 1), ("varlen", 1)])
def test_model_calls_per_micro_batch(batch, layout, calls):
    """Forward calls per micro-batch of the shared-prompt layouts (policy and critic): the prompt pass
    and the response pass, or one call (ZeRO-3 gathers the parameters once per call, issue 37 point 9)."""
    gs, packed = LAYOUTS[layout]
    model = _model("llama", "sdpa").train()
    critic = _critic("llama", "sdpa")
    for net, body in ((model, model.model), (critic, critic.backbone)):
        seen = []
        hook = body.register_forward_pre_hook(lambda *_: seen.append(1))
        try:
            for rows in _plan(batch, gs):
                mb = make_micro_batch(batch.pids, batch.pmask, batch.rids, batch.rmask, rows, "cpu", gs, packed)
                seen.clear()
                if net is model:
                    policy_forward(model, mb, temperature=TEMP, with_entropy=True)[0].sum().backward()
                else:
                    value_forward(critic, mb).sum().backward()
                assert len(seen) == calls, (layout, type(net).__name__, len(seen))
        finally:
            hook.remove()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_batch_logprobs_matches_row_alone_reference(batch, arch, attn):
    ref_lp, _, _ = _policy_reference(arch, attn, batch)
    model = _model(arch, attn).eval()
    diffs = {}
    for layout, (gs, packed) in LAYOUTS.items():
        _plan(batch, gs)
        full = batch_logprobs(model, batch.pids, batch.pmask, batch.rids, batch.rmask, token_budget=BUDGET,
                              temperature=TEMP, device="cpu", group_size=gs, packed=packed)
        diffs[layout] = _compare_rows(full, ref_lp, batch, f"batch_logprobs {arch}/{attn}/{layout}")
    _report(f"batch_logprobs {arch}/{attn}", **diffs)


# ---- critic: values and gradients ----------------------------------------------------------------

def _critic(arch: str, attn: str) -> ValueModel:
    critic = ValueModel.from_causal_lm(_model(arch, attn)).train()
    with torch.no_grad():  # a zero head (the default) would hide the backbone's gradients
        critic.value_head.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
        critic.value_head.bias.fill_(0.25)
    return critic


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_values_match_row_alone_reference(batch, arch, attn):
    critic = _critic(arch, attn)
    ref_v, ref_grads = _reference_values(critic, batch)
    diffs = {}
    for layout, (gs, packed) in LAYOUTS.items():
        critic.zero_grad(set_to_none=True)
        full = torch.zeros(batch.rids.shape)
        for rows in _plan(batch, gs):
            mb = make_micro_batch(batch.pids, batch.pmask, batch.rids, batch.rmask, rows, "cpu", gs, packed)
            v = value_forward(critic, mb)
            (batch.w_ent[rows, : mb.T] * v).sum().backward()
            full[rows, : mb.T] = v.detach()
        diffs[f"values {layout}"] = _compare_rows(full, ref_v, batch, f"values {arch}/{attn}/{layout}")
        diffs[f"grad {layout}"] = _compare_grads(_grads(critic), ref_grads, f"critic {arch}/{attn}/{layout}")
        with torch.no_grad():
            bv = batch_values(critic, batch.pids, batch.pmask, batch.rids, batch.rmask, token_budget=BUDGET,
                              device="cpu", group_size=gs, packed=packed)
        diffs[f"batch_values {layout}"] = _compare_rows(bv, ref_v, batch, f"batch_values {arch}/{attn}/{layout}")
    _report(f"critic {arch}/{attn}", **diffs)


# ---- negative controls: a wrong micro-batch builder must fail the comparison ---------------------

def _response_positions_count_prompt_padding(*args, **kw):
    """Response positions start at the padded prompt width P, not at the row's own prompt length."""
    mb = make_micro_batch(*args, **kw)
    pos = mb.position_ids.clone()
    pos[:, mb.P:] = mb.P + torch.arange(mb.T)
    return dataclasses.replace(mb, position_ids=pos)


def _attend_to_padding(*args, **kw):
    """An all-ones attention mask: the padding tokens become visible."""
    mb = make_micro_batch(*args, **kw)
    return dataclasses.replace(mb, attention_mask=torch.ones_like(mb.attention_mask))


def _response_shifted_by_one(*args, **kw):
    """Off by one: each logit scores the token it was fed, not the one it predicts."""
    mb = make_micro_batch(*args, **kw)
    return dataclasses.replace(mb, response_ids=mb.input_ids[:, mb.P - 1: mb.P - 1 + mb.T])


def _prompt_positions_from_zero(*args, **kw):
    """Positions counted from column 0 for the prompt, but from the row's real length for the response."""
    mb = make_micro_batch(*args, **kw)
    pos = mb.position_ids.clone()
    pos[:, : mb.P] = torch.arange(mb.P)
    return dataclasses.replace(mb, position_ids=pos)


MUTATIONS = {f.__name__.lstrip("_"): f for f in (_response_positions_count_prompt_padding, _attend_to_padding,
                                                 _response_shifted_by_one, _prompt_positions_from_zero)}


def _packed_responses_see_each_other(*args, **kw):
    """Packed bins with a plain causal mask: a response attends to the responses packed before it."""
    mb = make_packed_micro_batch(*args, **kw)
    mask = mb.attention_mask.clone()
    mask[..., mb.P:] |= torch.ones(mb.W, mb.W, dtype=torch.bool).tril()
    return dataclasses.replace(mb, attention_mask=mask)


def _packed_positions_run_on(*args, **kw):
    """Packed bins whose positions run on through the bin instead of restarting for each response."""
    mb = make_packed_micro_batch(*args, **kw)
    start = mb.prompt_mask.sum(1)[mb.bin_group]
    return dataclasses.replace(mb, pos=start[:, None] + torch.arange(mb.W))


def _packed_targets_shifted(*args, **kw):
    """Packed bins where each column scores the token it was fed instead of the next one."""
    mb = make_packed_micro_batch(*args, **kw)
    return dataclasses.replace(mb, targets=mb.ids)


PACKED_MUTATIONS = {f.__name__.lstrip("_"): f for f in (_packed_responses_see_each_other, _packed_positions_run_on,
                                                        _packed_targets_shifted)}


def _varlen_positions_run_on(*args, **kw):
    """Padding-free rows whose positions run on through the sequence: no boundary is found, every row
    attends to the rows before it."""
    mb = make_varlen_micro_batch(*args[:6])
    return dataclasses.replace(mb, pos=torch.arange(mb.ids.shape[1])[None])


def _varlen_keep_shifted(*args, **kw):
    """Padding-free rows scored one position late: each logit scores the token it was fed."""
    mb = make_varlen_micro_batch(*args[:6])
    return dataclasses.replace(mb, keep=mb.keep + 1)


def _varlen_first_position_wrong(*args, **kw):
    """Padding-free rows where one token (the first row's first) has a wrong position."""
    mb = make_varlen_micro_batch(*args[:6])
    pos = mb.pos.clone()
    pos[0, 0] = 7  # the first row's first token claims a later position: RoPE sees a different distance
    return dataclasses.replace(mb, pos=pos)


PACKED_MUTATIONS.update({f.__name__.lstrip("_"): f for f in (_varlen_positions_run_on, _varlen_keep_shifted,
                                                             _varlen_first_position_wrong)})


@pytest.mark.parametrize("mutation", list(PACKED_MUTATIONS))
def test_negative_control_mutated_packing_is_detected(batch, mutation):
    ref_lp, _, _ = _policy_reference("llama", "sdpa", batch)
    model = _model("llama", "sdpa").eval()
    lp, _, _ = _mathrl_policy(model, batch, G, builder=PACKED_MUTATIONS[mutation], grad=False)

    diff = _max_diff(lp, ref_lp)
    _report(f"negative control packed/{mutation}", logp=diff)
    with pytest.raises(AssertionError):
        _compare_rows(lp, ref_lp, batch, mutation)
    assert diff > 100 * ATOL


@pytest.mark.parametrize("gs", [1, G], ids=["plain", "shared"])
@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_negative_control_mutated_builder_is_detected(batch, arch, mutation, gs):
    ref_lp, _, _ = _policy_reference(arch, "sdpa", batch)
    model = _model(arch, "sdpa").eval()
    lp, _, _ = _mathrl_policy(model, batch, gs, builder=MUTATIONS[mutation], grad=False)
    diff = _max_diff(lp, ref_lp)
    _report(f"negative control {arch}/{mutation}/gs={gs}", logp=diff)
    with pytest.raises(AssertionError):
        _compare_rows(lp, ref_lp, batch, mutation)
    assert diff > 100 * ATOL  # detected by a wide margin, not by rounding


def test_constant_position_offset_is_invisible_under_rope(batch):
    """Why there is no 'positions count the left padding' control: RoPE attention depends on position
    differences only, so shifting a whole row's positions by its padding count changes nothing (to
    float32 rounding). Such a builder is not wrong for these models, and the comparison accepts it."""
    def count_padding(*args, **kw):
        mb = make_micro_batch(*args, **kw)
        return dataclasses.replace(mb, position_ids=torch.arange(mb.P + mb.T).expand_as(mb.position_ids))

    ref_lp, _, _ = _policy_reference("llama", "sdpa", batch)
    lp, _, _ = _mathrl_policy(_model("llama", "sdpa").eval(), batch, 1, builder=count_padding, grad=False)
    _report("constant offset llama/gs=1", logp=_compare_rows(lp, ref_lp, batch, "constant offset"))


# ---- DeepSpeed engines (ZeRO-1, ZeRO-3; gloo on CPU) ---------------------------------------------

@pytest.fixture()
def process_group(monkeypatch):
    """A world of one (init_distributed); the process-group variables it sets are restored afterwards."""
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    for k in DIST_ENV_VARS:
        if k in os.environ:
            monkeypatch.setenv(k, os.environ[k])
        else:
            monkeypatch.delenv(k, raising=False)
    from mathrl.train.engines import init_distributed

    info = init_distributed()
    assert info.world_size == 1
    return info


@pytest.mark.slow  # starts DeepSpeed
@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("packed", [False, True, "varlen"], ids=["padded", "packed", "varlen"])
def test_deepspeed_engine_matches_row_alone_reference(batch, process_group, arch, stage, packed):
    from deepspeed.utils import safe_get_full_grad

    from mathrl.train.engines import build_engine

    ref_lp, ref_ent, ref_grads = _policy_reference(arch, "sdpa", batch)
    engine = build_engine(_model(arch, "sdpa").train(), lr=1e-3, weight_decay=0.0, schedule="constant", warmup=0,
                          total_steps=1, stage=stage, offload="none", grad_clip=1.0, dtype=torch.float32,
                          world_size=1)
    if stage == 3:  # the parameters really are partitioned: forwards gather them
        assert any(p.numel() == 0 for p in engine.module.parameters())
    layout = layout_choice(engine, packed)  # ZeRO-3 packs in one call per micro-batch
    assert layout == ("varlen" if packed == "varlen" else "one_call" if packed and stage == 3 else packed)
    calls = []
    engine.module.register_forward_pre_hook(lambda *_: calls.append(1))
    diffs = {}
    for gs in (1, G):
        with torch.no_grad():
            full = batch_logprobs(engine, batch.pids, batch.pmask, batch.rids, batch.rmask, token_budget=BUDGET,
                                  temperature=TEMP, device="cpu", group_size=gs, packed=packed)
        diffs[f"batch_logprobs gs={gs}"] = _compare_rows(full, ref_lp, batch, f"engine z{stage} batch_logprobs")
    # policy_forward(engine, mb) with gradients, as the trainer runs it (one backward per micro-batch)
    lp_full, ent_full = torch.zeros(batch.rids.shape), torch.zeros(batch.rids.shape)
    for rows in _plan(batch, G):
        mb = make_micro_batch(batch.pids, batch.pmask, batch.rids, batch.rmask, rows, "cpu", G, layout)
        calls.clear()
        lp, ent = policy_forward(engine, mb, temperature=TEMP, with_entropy=True)
        assert len(calls) == (1 if layout in ("one_call", "varlen") else 2), (layout, len(calls))
        loss = (batch.w_lp[rows, : mb.T] * lp).sum() + (batch.w_ent[rows, : mb.T] * ent).sum()
        engine.backward(loss, scale_wrt_gas=False)
        lp_full[rows, : mb.T], ent_full[rows, : mb.T] = lp.detach(), ent.detach()
    diffs["logp"] = _compare_rows(lp_full, ref_lp, batch, f"engine z{stage} policy_forward logprobs")
    diffs["entropy"] = _compare_rows(ent_full, ref_ent, batch, f"engine z{stage} policy_forward entropies")
    grads = {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters()}
    diffs["grad"] = _compare_grads({n: g.float().reshape(ref_grads[n].shape) for n, g in grads.items()
                                    if g is not None}, ref_grads, f"engine z{stage} {arch}")
    _report(f"engine {arch}/zero{stage}/{layout or 'padded'}", **diffs)
