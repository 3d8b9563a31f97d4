"""The trainer's forward passes against an independent reference.

``tests/train/test_forward.py`` compares the shared-prompt forward with the plain one, but both
sides go through the padded layout's micro-batch builder, so a bug in its padding, masks or position ids would be
shared and invisible. Here the reference knows nothing of micro-batches: each row alone, its
prompt and response tokens without any padding, ``model(input_ids=row[None])`` with no attention
mask and no position ids (the model's defaults), then ``log_softmax(logits / temperature)`` at the
positions that predict the response tokens.

The mathrl side is what the trainer runs: a layout (:mod:`mathrl.train.layouts`: padded, shared-prompt,
packed, packed in one call, padding-free) plans micro-batches with a token budget that gives several
(each holding rows of different prompt and response lengths), builds each and runs its
``policy_forward``, gradients accumulated over the micro-batches. Compared: logprobs, entropies,
gradients parameter by parameter, critic values (``value_forward``, ``Layout.values``), the no-grad
``Layout.logprobs``, and the same through DeepSpeed engines (ZeRO-1 and ZeRO-3, gloo on CPU).
Two architectures (tiny Llama: tied head, no biases; tiny Qwen2: q/k/v biases, untied head) and
two attention kernels (sdpa, eager).

Padding columns hold random tokens, not a pad id: a mask that lets padding through changes the
result instead of attending to a near-zero embedding. Negative controls feed layouts with mutated
micro-batch builders through the same comparison and require it to fail.

Tolerances (float32 throughout): values atol 1e-5 / rtol 1e-5, gradients atol 1e-5 / rtol 1e-4.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import pytest
import torch

from mathrl.testing.tiny import build_tiny_model, build_tiny_qwen2_model
from mathrl.models.value_head import ValueModel
from mathrl.procs import DIST_ENV_VARS
from mathrl.train.rows import ForwardBatch
from mathrl.train.layouts import Layout, Packed, Padded, Varlen, choose_layout

VOCAB = 256
G = 4                                  # responses per prompt
PLENS = (5, 11, 3, 8)                  # prompt length of each group
RLENS = (3, 12, 7, 5, 10, 4, 9, 6, 11, 3, 8, 4, 12, 5, 9, 7)  # response length of each row
PW, TW = 13, 14                        # padded widths: wider than any row (the micro-batches trim)
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

def _tokens(b: Batch) -> ForwardBatch:
    return ForwardBatch(b.pids, b.pmask, b.rids, b.rmask)


def _plan(b: Batch, layout: Layout) -> list[torch.Tensor]:
    plan = layout.plan(_tokens(b), BUDGET)
    assert len(plan) >= 2, plan
    assert any(len(rows) > layout.group_size for rows in plan), plan  # some micro-batch mixes prompt lengths
    return plan


def _mathrl_policy(model, b: Batch, layout: Layout, grad: bool = True):
    """Full [N, TW] logprobs and entropies via the layout's micro-batches; gradients accumulated."""
    model.zero_grad(set_to_none=True)
    lp_full, ent_full = torch.zeros(b.rids.shape), torch.zeros(b.rids.shape)
    for rows in _plan(b, layout):
        mb = layout.micro_batch(_tokens(b), rows, "cpu")
        with torch.set_grad_enabled(grad):
            lp, ent = layout.policy_forward(model, mb, temperature=TEMP, with_entropy=True)
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
    for layout in (Padded(1), Padded(G)):
        _plan(batch, layout)


# ---- policy: logprobs, entropies, gradients ------------------------------------------------------

# padded rows alone, padded with a shared prompt, the shared prompt with each group's responses packed
# into bins (mathrl/train/packing.py), the same in one model call per micro-batch (ZeRO-3's layout), and
# every row's real tokens in one sequence without a mask (mathrl/train/varlen.py: train.padding_free,
# flash-attention's layout)
LAYOUTS = {"plain": Padded(1), "shared": Padded(G), "packed": Packed(G), "one_call": Packed(G, one_call=True),
           "varlen": Varlen(G)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_policy_forward_matches_row_alone_reference(batch, arch, attn, layout):
    ref_lp, ref_ent, ref_grads = _policy_reference(arch, attn, batch)
    model = _model(arch, attn).train()
    lp, ent, grads = _mathrl_policy(model, batch, LAYOUTS[layout])
    d_lp = _compare_rows(lp, ref_lp, batch, f"{arch}/{attn}/{layout} logprobs")
    d_ent = _compare_rows(ent, ref_ent, batch, f"{arch}/{attn}/{layout} entropies")
    d_grad = _compare_grads(grads, ref_grads, f"{arch}/{attn}/{layout}")
    _report(f"policy {arch}/{attn}/{layout}", logp=d_lp, entropy=d_ent, grad=d_grad)


@pytest.mark.parametrize("layout,calls", [("shared", 2), ("packed", 2), ("one_call", 1), ("varlen", 1)])
def test_model_calls_per_micro_batch(batch, layout, calls):
    """Forward calls per micro-batch of the shared-prompt layouts (policy and critic): the prompt pass
    and the response pass, or one call (ZeRO-3 gathers the parameters once per call, issue 37 point 9)."""
    lay = LAYOUTS[layout]
    model = _model("llama", "sdpa").train()
    critic = _critic("llama", "sdpa")
    for net, body in ((model, model.model), (critic, critic.backbone)):
        seen = []
        hook = body.register_forward_pre_hook(lambda *_: seen.append(1))
        try:
            for rows in _plan(batch, lay):
                mb = lay.micro_batch(_tokens(batch), rows, "cpu")
                seen.clear()
                if net is model:
                    lay.policy_forward(model, mb, temperature=TEMP, with_entropy=True)[0].sum().backward()
                else:
                    lay.value_forward(critic, mb).sum().backward()
                assert len(seen) == calls, (layout, type(net).__name__, len(seen))
        finally:
            hook.remove()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_batch_logprobs_matches_row_alone_reference(batch, arch, attn):
    ref_lp, _, _ = _policy_reference(arch, attn, batch)
    model = _model(arch, attn).eval()
    diffs = {}
    for layout, lay in LAYOUTS.items():
        _plan(batch, lay)
        full = lay.logprobs(model, _tokens(batch), token_budget=BUDGET, temperature=TEMP, device="cpu")
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
    for layout, lay in LAYOUTS.items():
        critic.zero_grad(set_to_none=True)
        full = torch.zeros(batch.rids.shape)
        for rows in _plan(batch, lay):
            mb = lay.micro_batch(_tokens(batch), rows, "cpu")
            v = lay.value_forward(critic, mb)
            (batch.w_ent[rows, : mb.T] * v).sum().backward()
            full[rows, : mb.T] = v.detach()
        diffs[f"values {layout}"] = _compare_rows(full, ref_v, batch, f"values {arch}/{attn}/{layout}")
        diffs[f"grad {layout}"] = _compare_grads(_grads(critic), ref_grads, f"critic {arch}/{attn}/{layout}")
        with torch.no_grad():
            bv = lay.values(critic, _tokens(batch), token_budget=BUDGET, device="cpu")
        diffs[f"batch_values {layout}"] = _compare_rows(bv, ref_v, batch, f"batch_values {arch}/{attn}/{layout}")
    _report(f"critic {arch}/{attn}", **diffs)


# ---- negative controls: a wrong micro-batch builder must fail the comparison ---------------------

class _Mutated(Layout):
    """``inner`` with each micro-batch changed by ``change`` before its forward."""

    def __init__(self, inner: Layout, change):
        super().__init__(inner.group_size)
        self.inner, self.change, self.plans_real_tokens = inner, change, inner.plans_real_tokens

    def micro_batch(self, tokens, rows, device="cpu"):
        return self.change(self.inner.micro_batch(tokens, rows, device))

    def policy_forward(self, model, mb, **kw):
        return self.inner.policy_forward(model, mb, **kw)

    def value_forward(self, critic, mb):
        return self.inner.value_forward(critic, mb)


def _response_positions_count_prompt_padding(mb):
    """Response positions start at the padded prompt width P, not at the row's own prompt length."""
    pos = mb.position_ids.clone()
    pos[:, mb.P:] = mb.P + torch.arange(mb.T)
    return dataclasses.replace(mb, position_ids=pos)


def _attend_to_padding(mb):
    """An all-ones attention mask: the padding tokens become visible."""
    return dataclasses.replace(mb, attention_mask=torch.ones_like(mb.attention_mask))


def _response_shifted_by_one(mb):
    """Off by one: each logit scores the token it was fed, not the one it predicts."""
    return dataclasses.replace(mb, response_ids=mb.input_ids[:, mb.P - 1: mb.P - 1 + mb.T])


def _prompt_positions_from_zero(mb):
    """Positions counted from column 0 for the prompt, but from the row's real length for the response."""
    pos = mb.position_ids.clone()
    pos[:, : mb.P] = torch.arange(mb.P)
    return dataclasses.replace(mb, position_ids=pos)


MUTATIONS = {f.__name__.lstrip("_"): f for f in (_response_positions_count_prompt_padding, _attend_to_padding,
                                                 _response_shifted_by_one, _prompt_positions_from_zero)}


def _packed_responses_see_each_other(mb):
    """Packed bins with a plain causal mask: a response attends to the responses packed before it."""
    mask = mb.attention_mask.clone()
    mask[..., mb.P:] |= torch.ones(mb.W, mb.W, dtype=torch.bool).tril()
    return dataclasses.replace(mb, attention_mask=mask)


def _packed_positions_run_on(mb):
    """Packed bins whose positions run on through the bin instead of restarting for each response."""
    start = mb.prompt_mask.sum(1)[mb.bin_group]
    return dataclasses.replace(mb, pos=start[:, None] + torch.arange(mb.W))


def _packed_targets_shifted(mb):
    """Packed bins where each column scores the token it was fed instead of the next one."""
    return dataclasses.replace(mb, targets=mb.ids)


# name -> (the layout mutated, the change)
PACKED_MUTATIONS = {f.__name__.lstrip("_"): (Packed(G), f) for f in (
    _packed_responses_see_each_other, _packed_positions_run_on, _packed_targets_shifted)}


def _varlen_positions_run_on(mb):
    """Padding-free rows whose positions run on through the sequence: no boundary is found, every row
    attends to the rows before it."""
    return dataclasses.replace(mb, pos=torch.arange(mb.ids.shape[1])[None])


def _varlen_keep_shifted(mb):
    """Padding-free rows scored one position late: each logit scores the token it was fed."""
    return dataclasses.replace(mb, keep=mb.keep + 1)


def _varlen_first_position_wrong(mb):
    """Padding-free rows where one token (the first row's first) has a wrong position."""
    pos = mb.pos.clone()
    pos[0, 0] = 7  # the first row's first token claims a later position: RoPE sees a different distance
    return dataclasses.replace(mb, pos=pos)


PACKED_MUTATIONS.update({f.__name__.lstrip("_"): (Varlen(G), f) for f in (
    _varlen_positions_run_on, _varlen_keep_shifted, _varlen_first_position_wrong)})


@pytest.mark.parametrize("mutation", list(PACKED_MUTATIONS))
def test_negative_control_mutated_packing_is_detected(batch, mutation):
    ref_lp, _, _ = _policy_reference("llama", "sdpa", batch)
    model = _model("llama", "sdpa").eval()
    lp, _, _ = _mathrl_policy(model, batch, _Mutated(*PACKED_MUTATIONS[mutation]), grad=False)

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
    lp, _, _ = _mathrl_policy(model, batch, _Mutated(Padded(gs), MUTATIONS[mutation]), grad=False)
    diff = _max_diff(lp, ref_lp)
    _report(f"negative control {arch}/{mutation}/gs={gs}", logp=diff)
    with pytest.raises(AssertionError):
        _compare_rows(lp, ref_lp, batch, mutation)
    assert diff > 100 * ATOL  # detected by a wide margin, not by rounding


def test_constant_position_offset_is_invisible_under_rope(batch):
    """Why there is no 'positions count the left padding' control: RoPE attention depends on position
    differences only, so shifting a whole row's positions by its padding count changes nothing (to
    float32 rounding). Such a builder is not wrong for these models, and the comparison accepts it."""
    def count_padding(mb):
        return dataclasses.replace(mb, position_ids=torch.arange(mb.P + mb.T).expand_as(mb.position_ids))

    ref_lp, _, _ = _policy_reference("llama", "sdpa", batch)
    lp, _, _ = _mathrl_policy(_model("llama", "sdpa").eval(), batch, _Mutated(Padded(1), count_padding), grad=False)
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
    from mathrl.dist.collectives import init_distributed

    info = init_distributed()
    assert info.world_size == 1
    return info


@pytest.mark.slow  # starts DeepSpeed
@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("packed", [False, True, "varlen"], ids=["padded", "packed", "varlen"])
def test_deepspeed_engine_matches_row_alone_reference(batch, process_group, arch, stage, packed):
    from deepspeed.utils import safe_get_full_grad

    from mathrl.dist.engines import build_engine

    ref_lp, ref_ent, ref_grads = _policy_reference(arch, "sdpa", batch)
    engine = build_engine(_model(arch, "sdpa").train(), lr=1e-3, weight_decay=0.0, schedule="constant", warmup=0,
                          total_steps=1, stage=stage, offload="none", grad_clip=1.0, dtype=torch.float32,
                          world_size=1)
    if stage == 3:  # the parameters really are partitioned: forwards gather them
        assert any(p.numel() == 0 for p in engine.module.parameters())
    layout = choose_layout(engine, packed, G)  # ZeRO-3 packs in one call per micro-batch
    assert layout.name == ("varlen" if packed == "varlen" else "packed-one-call" if packed and stage == 3
                           else "packed" if packed else "shared-prompt")
    calls = []
    engine.module.register_forward_pre_hook(lambda *_: calls.append(1))
    diffs = {}
    for gs in (1, G):
        with torch.no_grad():
            full = choose_layout(engine, packed, gs).logprobs(engine, _tokens(batch), token_budget=BUDGET,
                                                              temperature=TEMP, device="cpu")
        diffs[f"batch_logprobs gs={gs}"] = _compare_rows(full, ref_lp, batch, f"engine z{stage} batch_logprobs")
    # policy_forward(engine, mb) with gradients, as the trainer runs it (one backward per micro-batch)
    lp_full, ent_full = torch.zeros(batch.rids.shape), torch.zeros(batch.rids.shape)
    for rows in _plan(batch, layout):
        mb = layout.micro_batch(_tokens(batch), rows, "cpu")
        calls.clear()
        lp, ent = layout.policy_forward(engine, mb, temperature=TEMP, with_entropy=True)
        assert len(calls) == (1 if layout.name in ("packed-one-call", "varlen") else 2), (layout, len(calls))
        loss = (batch.w_lp[rows, : mb.T] * lp).sum() + (batch.w_ent[rows, : mb.T] * ent).sum()
        engine.backward(loss, scale_wrt_gas=False)
        lp_full[rows, : mb.T], ent_full[rows, : mb.T] = lp.detach(), ent.detach()
    diffs["logp"] = _compare_rows(lp_full, ref_lp, batch, f"engine z{stage} policy_forward logprobs")
    diffs["entropy"] = _compare_rows(ent_full, ref_ent, batch, f"engine z{stage} policy_forward entropies")
    grads = {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters()}
    diffs["grad"] = _compare_grads({n: g.float().reshape(ref_grads[n].shape) for n, g in grads.items()
                                    if g is not None}, ref_grads, f"engine z{stage} {arch}")
    _report(f"engine {arch}/zero{stage}/{layout.name}", **diffs)
