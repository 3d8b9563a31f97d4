#!/usr/bin/env python
"""GPU benchmark: GRPO update tokens/s and MFU, and generation tokens/s, on one GPU.

Model: a randomly initialised Qwen2.5-0.5B-shaped causal LM (24 layers, width 896, 14 query / 2
key-value heads, MLP 4864, vocabulary 151,936, tied embeddings) in bfloat16. Nothing is
downloaded: the weights are random and the tokenizer is a word-level one built in memory for
the model's vocabulary (a real ``tokenizers`` object; it only names token ids).

1. *Matmul peak*: a large bf16 matmul, the achievable ceiling on this GPU (for reference).
2. *GRPO update* with mathrl's own pieces: token-budgeted micro-batches with shared prompts
   (the layout's ``plan``/``micro_batch``/``policy_forward``, mathrl/train/layouts.py), the clipped policy loss plus
   the k3 KL to reference logprobs with the global token normaliser, backward, one optimizer step,
   under DeepSpeed ZeRO-2 (``mathrl.dist.engines.build_engine``). Reports training tokens/s and
   model FLOPs utilisation (MFU = useful model FLOPs / time / peak; :func:`train_flops`).
3. *Generation* at G = 8: mathrl's hf backend (``HFRolloutEngine``: prefill once per prompt,
   finished rows dropped) and, for reference, raw ``model.generate(num_return_sequences=8)``.

Budget: well under 5 minutes on one H200 (default sizes: 8 prompts x G=8, 256 prompt tokens,
512 response tokens; 2 warm-up + 5 timed updates; 256 new tokens for generation).

    python scripts/bench_gpu.py --out gpu.json             # on the GPU machine, repo root
    python scripts/bench_gpu.py --smoke                    # CPU check of the script (seconds)
    OMP_NUM_THREADS=2 python scripts/bench_gpu.py --device cpu --prompts 2 --resp-len 64 --gen-tokens 64
                                                           # the same measurements on CPU, tiny shape

``--layout`` picks the update's micro-batch layout (mathrl/train/packing.py): ``packed`` (the
trainer's default, train.packing), ``one_call`` (ZeRO-3's: prompt and bins in one model call) or
``padded`` (the shared-prompt padded layout the first GPU run measured) or ``varlen`` (each row's real
tokens in one sequence without a mask: mathrl/train/varlen.py, train.padding_free). ``--attn`` picks
the attention kernel (model.attn_implementation); with ``flex_attention`` or ``flash_attention_2``
packing runs the varlen layout, as in the trainer. ``achieved_tflops`` counts the FLOPs the layout
computes (varlen recomputes each row's prompt); ``useful_tflops`` those of the shared-prompt update.

DeepSpeed: the GPU machine has torch and transformers but no DeepSpeed and no network. DeepSpeed
is a small pure-Python wheel; build it here and carry it along::

    pip wheel deepspeed==0.19.8 --no-deps -w wheels/
    pip wheel hjson py-cpuinfo msgpack ninja einops --no-deps -w wheels/   # its small dependencies,
    #   if that machine lacks them (add --python-version X.Y --only-binary=:all: when its Python differs)
    # there:  pip install --no-index --no-deps wheels/*.whl

(The device tool copies untracked files along; if ``wheels/`` is git-ignored, name it in its
``carry``.) ``bash scripts/gpu_wheelhouse.sh`` builds all of these (and math-verify) into
``gpu_wheels/``, and ``bash scripts/gpu_check.sh`` installs them and runs this benchmark as part of
the GPU check (scripts/gpu_check.sh). Without DeepSpeed the
script falls back to plain ``torch.optim.AdamW`` (fused) on bf16 parameters and says so; the
update then has no fp32 master weights, so its time is a lower bound of ZeRO-2's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # mathrl from this working tree (it is not installed on the GPU machine)
    sys.path.insert(0, str(REPO))

#: Dense bf16 peak of known GPUs, TFLOP/s (vendor datasheets, SXM parts, no sparsity).
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "H800": 989.4, "A100": 312.0, "A800": 312.0,
                    "L40S": 362.1, "A10": 125.0, "L4": 121.0}


@dataclass(frozen=True)
class Shape:
    """The transformer dimensions the FLOPs formula needs (a Llama/Qwen2 decoder)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


QWEN25_05B = Shape(layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=151936)
SMOKE = Shape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512)


def shape_of(config) -> Shape:
    return Shape(layers=config.num_hidden_layers, hidden=config.hidden_size, heads=config.num_attention_heads,
                 kv_heads=config.num_key_value_heads, intermediate=config.intermediate_size,
                 vocab=config.vocab_size)


# --------------------------------------------------------------------------- FLOPs


def linear_flops_per_token(s: Shape) -> int:
    """Matmul FLOPs of one token through all decoder layers, projections only (2 per multiply-add):
    q and o (d x h*hd), k and v (d x kv*hd each), gate/up/down (d x I each)."""
    hd = s.head_dim
    per_layer = 2 * (s.hidden * s.heads * hd * 2 + s.hidden * s.kv_heads * hd * 2 + 3 * s.hidden * s.intermediate)
    return s.layers * per_layer


def attention_flops(s: Shape, keys_per_query: int) -> int:
    """Score and value matmuls of ``keys_per_query`` query-key pairs summed over queries, all layers:
    ``2 * 2 * heads * head_dim`` FLOPs per pair (QK^T and PV)."""
    return s.layers * 4 * s.heads * s.head_dim * keys_per_query


def forward_flops(s: Shape, seq_len: int, logits_positions: int, *, causal: bool = True,
                  prefix_len: int = 0, rows: int = 1) -> int:
    """Forward FLOPs of ``rows`` sequences of ``seq_len`` new tokens (after a cached prefix of
    ``prefix_len`` tokens), with the vocabulary projection for ``logits_positions`` positions each.

    Attention counts the query-key pairs actually needed: with ``causal`` query ``i`` (0-based,
    after the prefix) sees ``prefix_len + i + 1`` keys; without, every query sees all
    ``prefix_len + seq_len`` keys (what a dense SDPA kernel multiplies, and what
    ``torch.utils.flop_counter`` counts). Embedding lookups, norms, softmax and activations are not
    matmuls and are left out (the usual MFU convention, PaLM appendix B)."""
    if causal:
        pairs = seq_len * prefix_len + seq_len * (seq_len + 1) // 2
    else:
        pairs = seq_len * (prefix_len + seq_len)
    lm_head = logits_positions * 2 * s.hidden * s.vocab
    return rows * (seq_len * linear_flops_per_token(s) + attention_flops(s, pairs) + lm_head)


def train_flops(s: Shape, prompt_lens: list[int], response_lens: list[list[int]], *, shared_prompt: bool = True,
                causal: bool = True) -> int:
    """Useful FLOPs of one GRPO update (forward + backward = 3 x forward) over groups: group ``g``
    has prompt ``prompt_lens[g]`` and responses ``response_lens[g]``. With ``shared_prompt`` each
    prompt runs once and its responses attend to its cache (mathrl's ``train.share_prompt``);
    otherwise every row is ``[prompt | response]``. Logits are computed for the response tokens
    only (the last prompt position scores response token 0). ``causal=False`` counts dense
    attention rectangles (see :func:`forward_flops`)."""
    total = 0
    for p, rs in zip(prompt_lens, response_lens):
        if shared_prompt:
            total += forward_flops(s, p, 1, causal=causal)  # the prompt, once; its last position scores token 0
            for r in rs:
                total += forward_flops(s, r, max(r - 1, 0), prefix_len=p, causal=causal)
        else:
            for r in rs:
                total += forward_flops(s, p + r, r, causal=causal)
    return 3 * total


# --------------------------------------------------------------------------- model and tokenizer


def build_model(shape: Shape, dtype, device, attn: str = "sdpa"):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=32768, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(dtype)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def build_tokenizer(vocab: int):
    """A word-level tokenizer naming the ids ``t0 .. t{vocab-1}`` (pad t0, eos t2): enough for an
    engine to decode random-model output; built in memory, nothing downloaded."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t2", bos_token="t1",
                                   unk_token="t3")
    fast.padding_side = "left"
    return fast


# --------------------------------------------------------------------------- measurements


def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device, dtype, n: int, repeats: int) -> float:
    """TFLOP/s of an ``n x n x n`` matmul (median of ``repeats``)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def synthetic_batch(B: int, G: int, P: int, R: int, vocab: int, seed: int):
    """Prompt ids ``[B*G, P]`` (each group's prompt repeated), response ids ``[B*G, R]`` with a
    mask whose lengths are uniform in ``[R/2, R]``, rewards 0/1 and GRPO advantages."""
    import torch

    from mathrl.algo import advantages as adv

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (B, P), generator=g).repeat_interleave(G, 0)
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    resp = torch.randint(3, vocab, (B * G, R), generator=g)
    lens = torch.randint(R // 2, R + 1, (B * G,), generator=g)
    rmask = torch.arange(R)[None, :] < lens[:, None]
    scores = (torch.rand(B * G, generator=g) < 0.5).float()
    group = torch.arange(B).repeat_interleave(G)
    a = adv.broadcast_to_tokens(adv.grpo(scores, group), rmask)
    return prompts, pmask, resp, rmask, a, lens


def grpo_update_bench(args, shape: Shape, device, dtype, stage: int = 2) -> dict:
    """One GRPO update of the synthetic batch, timed; through mathrl's DeepSpeed engine at ZeRO ``stage``."""
    import torch

    from mathrl.algo import kl as kl_mod
    from mathrl.algo.losses import agg_loss, global_normalizers, policy_loss
    from mathrl.train.rows import ForwardBatch
    from mathrl.train.layouts import choose_layout

    B, G, P, R = args.prompts, args.G, args.prompt_len, args.resp_len
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.reset_peak_memory_stats()  # this stage's own peak, not an earlier stage's
    model = build_model(shape, dtype, device, attn=args.attn)
    n_params = sum(p.numel() for p in model.parameters())
    engine, opt, how = None, None, ""
    if not args.no_deepspeed:
        try:
            import deepspeed  # noqa: F401

            from mathrl.dist.collectives import init_distributed
            from mathrl.dist.engines import build_engine

            init_distributed()
            engine = build_engine(model, lr=1e-6, weight_decay=0.0, schedule="constant", warmup=0, total_steps=1000,
                                  stage=stage, offload="none", grad_clip=1.0, dtype=dtype, world_size=1)
            how = f"DeepSpeed ZeRO-{stage} (mathrl.dist.engines.build_engine), torch AdamW client optimizer"
        except ImportError as exc:
            print(f"NOTE: DeepSpeed is not importable ({exc}); falling back to plain torch.optim.AdamW on bf16 "
                  "parameters (no fp32 master weights). Carry the wheel: pip wheel deepspeed==0.19.8 --no-deps "
                  "-w wheels/ (see this script's docstring).", flush=True)
        except Exception as exc:  # noqa: BLE001 - e.g. an op that needs a compiler; the measurement goes on
            engine = None
            print(f"NOTE: DeepSpeed is installed but its engine could not be built ({type(exc).__name__}: {exc}); "
                  "falling back to plain torch.optim.AdamW on bf16 parameters.", flush=True)
            how = f"plain torch.optim.AdamW (DeepSpeed failed: {type(exc).__name__})"
    if engine is None:
        fused = getattr(device, "type", str(device)) == "cuda"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=fused)
        how = how or f"plain torch.optim.AdamW (fused={fused}), no DeepSpeed"
    module = engine.module if engine is not None else model
    # the layout the trainer would run for this request and attention kernel (mathrl/train/layouts.py),
    # each group's prompt run once (train.share_prompt) where the layout shares it
    lay = choose_layout(engine if engine is not None else module,
                        {"padded": False, "packed": True, "one_call": "one_call", "varlen": "varlen"}[args.layout], G)
    layout = {"shared-prompt": "padded", "packed-one-call": "one_call"}.get(lay.name, lay.name)
    shared = layout != "varlen"  # the padding-free layout runs each row's prompt
    prompts, pmask, resp, rmask, advs, lens = synthetic_batch(B, G, P, R, shape.vocab, args.seed)
    tokens = ForwardBatch(prompts, pmask, resp, rmask)
    t0 = time.perf_counter()
    module.eval()
    ref_logp = lay.logprobs(module, tokens, token_budget=args.micro_batch_tokens, temperature=1.0, device=device)
    _sync(device)
    ref_s = time.perf_counter() - t0
    plan = lay.plan(tokens, args.micro_batch_tokens)
    # the counts all-reduced on the engine's device (NCCL refuses the CPU masks' tensors)
    from mathrl.dist.collectives import global_sum

    norms = global_normalizers([rmask[r] for r in plan], reduce=global_sum)

    def one_update() -> float:
        module.train()
        _sync(device)
        t = time.perf_counter()
        for rows in plan:
            mb = lay.micro_batch(tokens, rows, device)
            logp, _ = lay.policy_forward(engine if engine is not None else module, mb, temperature=1.0,
                                         with_entropy=True)
            m = mb.response_mask
            old = logp.detach()  # on-policy, one epoch: old = current (mathrl skips their recomputation)
            adv = advs[rows, : mb.T].to(logp.device)
            pg, _st = policy_loss(logp, old, adv, m, agg="token-mean", norm_tokens=norms.tokens)
            kl_tok = kl_mod.estimate(logp, ref_logp[rows, : mb.T].to(logp.device), "k3")
            loss = pg + 0.04 * agg_loss(kl_tok, m, agg="token-mean", norm_tokens=norms.tokens)
            if engine is not None:
                engine.backward(loss, scale_wrt_gas=False)
            else:
                loss.backward()
        if engine is not None:
            engine.step()
        else:
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - t

    for _ in range(args.warmup):
        one_update()
    times = [one_update() for _ in range(args.steps)]
    if getattr(device, "type", str(device)) == "cuda":
        peak_mem = torch.cuda.max_memory_allocated() / 2 ** 30
    else:
        peak_mem = float("nan")
    t_med = statistics.median(times)
    resp_tokens = int(rmask.sum())
    seq_tokens = resp_tokens + B * P * (1 if shared else G)  # what is computed: prompts once per group or per row
    groups = [lens[g * G:(g + 1) * G].tolist() for g in range(B)]
    flops = train_flops(shape, [P] * B, groups, shared_prompt=shared)
    useful = train_flops(shape, [P] * B, groups, shared_prompt=True)  # the least work that gives the same update
    out = {"optimizer": how, "layout": layout, "attn": args.attn, "params": n_params, "micro_batches": len(plan),
           "update_s_median": t_med, "useful_flops": useful, "useful_tflops": useful / t_med / 1e12,
           "update_s": times, "response_tokens": resp_tokens, "computed_tokens": seq_tokens,
           "response_tok_s": resp_tokens / t_med, "computed_tok_s": seq_tokens / t_med,
           "train_flops": flops, "achieved_tflops": flops / t_med / 1e12, "ref_forward_s": ref_s,
           "peak_mem_gib": peak_mem, "zero_stage": stage if engine is not None else None}
    return out


def generation_bench(args, shape: Shape, device, dtype) -> dict:
    import torch

    from mathrl.rollout import SamplingConfig
    from mathrl.rollout.hf import HFRolloutEngine

    model = build_model(shape, dtype, device).eval()
    tok = build_tokenizer(shape.vocab)
    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = torch.randint(3, shape.vocab, (args.gen_prompts, args.prompt_len), generator=g).tolist()
    engine = HFRolloutEngine(model=model, tokenizer=tok, device=device, max_batch_rows=args.gen_prompts * args.G)
    out: dict = {}

    def mathrl_run(max_tokens: int) -> tuple[int, float]:
        sp = SamplingConfig(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, seed=args.seed)
        _sync(device)
        t = time.perf_counter()
        batch = engine.generate(prompts, args.G, sp)
        _sync(device)
        return int(batch.response_mask.sum()), time.perf_counter() - t

    mathrl_run(8)  # warm-up
    n, s = mathrl_run(args.gen_tokens)
    out["mathrl_hf"] = {"tokens": n, "seconds": s, "tok_s": n / s}

    ids = torch.tensor(prompts, device=device)
    attn = torch.ones_like(ids)

    def raw_run(max_tokens: int) -> tuple[int, float]:
        torch.manual_seed(args.seed)
        _sync(device)
        t = time.perf_counter()
        with torch.inference_mode():
            seq = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_p=1.0,
                                 top_k=0, max_new_tokens=max_tokens, num_return_sequences=args.G,
                                 pad_token_id=0, eos_token_id=2)
        _sync(device)
        gen = seq[:, ids.shape[1]:]
        ended = (gen == 2).int().cumsum(1)
        n_tok = int(((ended == 0) | ((ended == 1) & (gen == 2))).sum())  # up to and including EOS
        return n_tok, time.perf_counter() - t

    raw_run(8)
    n, s = raw_run(args.gen_tokens)
    out["raw_hf_generate"] = {"tokens": n, "seconds": s, "tok_s": n / s}
    out["rows"] = args.gen_prompts * args.G
    return out


def peak_tflops(device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, "--peak-tflops"
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None, "no GPU"
    name = torch.cuda.get_device_name(device)
    for key, val in PEAK_BF16_TFLOPS.items():
        if key in name:
            return val, f"{name} datasheet (dense bf16)"
    return None, f"{name}: unknown peak; pass --peak-tflops"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="GPU benchmark: GRPO update tokens/s + MFU (DeepSpeed ZeRO-2, bf16) "
                                 "and HF generation tokens/s at G=8 for a random Qwen2.5-0.5B-shaped model",
                                 epilog="DeepSpeed missing? pip wheel deepspeed==0.19.8 --no-deps -w wheels/ here, "
                                 "carry wheels/, pip install --no-index --no-deps wheels/*.whl there; without it "
                                 "the update falls back to torch AdamW (printed).")
    ap.add_argument("--prompts", type=int, default=8, help="B prompts per update")
    ap.add_argument("--G", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--resp-len", type=int, default=512, help="max response tokens (lengths uniform in [R/2, R])")
    ap.add_argument("--micro-batch-tokens", type=int, default=16384, help="mathrl's train.micro_batch_tokens")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed updates")
    ap.add_argument("--gen-prompts", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=256, help="new tokens per sample in the generation test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zero-stages", default="2",
                    help="comma list of ZeRO stages to time the update under, each in a fresh engine (e.g. 2,3: "
                    "ZeRO-3's peak memory against ZeRO-2's on one device); the first is the headline")
    ap.add_argument("--no-deepspeed", action="store_true", help="plain torch AdamW even when DeepSpeed is there")
    ap.add_argument("--skip-gen", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak for MFU (default: from the GPU name)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in float32 on CPU: checks the script, not speed")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="cpu: a tiny model (2 layers, width 64) in float32 with the given sizes, so CPU numbers "
                    "compare before/after a change (default: the GPU)")
    ap.add_argument("--layout", choices=["packed", "one_call", "padded", "varlen"], default="packed",
                    help="the update's micro-batch layout (default: the trainer's, train.packing; varlen: "
                    "train.padding_free). With a varlen attention kernel --layout packed runs varlen, as the trainer does")
    ap.add_argument("--attn", choices=["sdpa", "eager", "flex_attention", "flash_attention_2"], default="sdpa",
                    help="the model's attention kernel (mathrl's model.attn_implementation)")
    ap.add_argument("--out", default=None, help="write results as JSON")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    t_all = time.perf_counter()
    cpu_run = args.smoke or args.device == "cpu"
    cuda = torch.cuda.is_available() and not cpu_run
    if not cuda and not cpu_run:
        print("bench_gpu: no CUDA device; run it on the GPU machine, or use --smoke for a CPU check of the script")
        return 2
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = QWEN25_05B
    if cpu_run:
        shape = SMOKE
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.smoke:
        args.prompts, args.G, args.prompt_len, args.resp_len = min(args.prompts, 2), min(args.G, 2), 16, 16
        args.gen_prompts, args.gen_tokens, args.warmup, args.steps = 2, 8, 1, 1
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    res: dict = {"device": torch.cuda.get_device_name(0) if cuda else ("cpu (smoke)" if args.smoke else "cpu"), "dtype": str(dtype),
                 "torch": torch.__version__, "transformers": __import__("transformers").__version__,
                 "shape": asdict(shape), "args": vars(args)}
    try:
        import deepspeed

        res["deepspeed"] = deepspeed.__version__
    except ImportError:
        res["deepspeed"] = None
    print(f"bench_gpu: {res['device']}, {dtype}, torch {res['torch']}, transformers {res['transformers']}, "
          f"deepspeed {res['deepspeed'] or 'not installed'}", flush=True)
    peak, peak_src = peak_tflops(device, args.peak_tflops)
    res["peak_tflops"], res["peak_source"] = peak, peak_src
    res["matmul_tflops"] = matmul_peak(device, dtype, 8192 if cuda else 256, 10 if cuda else 2)
    print(f"matmul ceiling: {res['matmul_tflops']:.1f} TFLOP/s measured; peak {peak} ({peak_src})", flush=True)
    stages = [int(x) for x in str(args.zero_stages).split(",") if x.strip()]
    if not args.skip_train and stages[1:]:
        by_stage = {}
        for stage in stages[1:]:  # the others first: the headline's figures are then printed last
            other = grpo_update_bench(args, shape, device, dtype, stage=stage)
            by_stage[stage] = {k: other[k] for k in ("optimizer", "update_s_median", "computed_tok_s",
                                                     "peak_mem_gib", "zero_stage")}
            if cuda:
                torch.cuda.empty_cache()
            print(f"GRPO update under {other['optimizer'].split(' (')[0]}: {other['update_s_median']:.3f} s, "
                  f"peak memory {other['peak_mem_gib']:.1f} GiB", flush=True)
        res["grpo_update_other_stages"] = by_stage
    if not args.skip_train:
        tr = grpo_update_bench(args, shape, device, dtype, stage=stages[0])
        if peak:
            tr["mfu"] = tr["achieved_tflops"] / peak
        tr["fraction_of_matmul_ceiling"] = tr["achieved_tflops"] / res["matmul_tflops"]
        res["grpo_update"] = tr
        for other in res.get("grpo_update_other_stages", {}).values():
            other["peak_mem_vs_headline"] = other["peak_mem_gib"] / tr["peak_mem_gib"] if cuda else None
        if cuda:
            torch.cuda.empty_cache()  # the update's model and optimizer are gone with the function's frame
        print(f"GRPO update ({args.prompts} prompts x G={args.G}, prompt {args.prompt_len}, responses <= "
              f"{args.resp_len}, {tr['layout']} layout, {args.attn}; {tr['optimizer']}): {tr['update_s_median']:.3f} s median of {args.steps}, "
              f"{tr['computed_tok_s']:.0f} tok/s ({tr['response_tok_s']:.0f} response tok/s), "
              f"{tr['achieved_tflops']:.1f} TFLOP/s, MFU {tr.get('mfu', float('nan')):.1%}, "
              f"peak memory {tr['peak_mem_gib']:.1f} GiB", flush=True)
    if not args.skip_gen:
        ge = generation_bench(args, shape, device, dtype)
        res["generation"] = ge
        print(f"generation ({args.gen_prompts} prompts x G={args.G}, {args.gen_tokens} new tokens): mathrl hf "
              f"{ge['mathrl_hf']['tok_s']:.0f} tok/s ({ge['mathrl_hf']['seconds']:.1f} s); raw HF generate "
              f"{ge['raw_hf_generate']['tok_s']:.0f} tok/s ({ge['raw_hf_generate']['seconds']:.1f} s)", flush=True)
    res["total_s"] = time.perf_counter() - t_all
    md = ["| GPU measurement | value |", "|---|---|"]
    if "grpo_update" in res:
        tr = res["grpo_update"]
        md += [f"| GRPO update, training tokens/s (Qwen2.5-0.5B shape, bf16, {tr['optimizer'].split(' (')[0]}) | "
               f"{tr['computed_tok_s']:.0f} ({tr['response_tok_s']:.0f} response) |",
               f"| GRPO update MFU (vs {peak} TFLOP/s) | "
               f"{'n/a' if not peak else format(tr['mfu'], '.1%')} ({tr['achieved_tflops']:.0f} TFLOP/s) |"]
    if "generation" in res:
        ge = res["generation"]
        md += [f"| HF generation tokens/s, G={args.G} (mathrl hf backend) | {ge['mathrl_hf']['tok_s']:.0f} |",
               f"| HF generation tokens/s, G={args.G} (raw model.generate) | {ge['raw_hf_generate']['tok_s']:.0f} |"]
    for stage, other in res.get("grpo_update_other_stages", {}).items():
        ratio = other.get("peak_mem_vs_headline")
        md.append(f"| GRPO update peak memory, ZeRO-{stage} vs ZeRO-{stages[0]} (one device) | "
                  f"{other['peak_mem_gib']:.1f} GiB vs {res['grpo_update']['peak_mem_gib']:.1f} GiB"
                  f"{'' if ratio is None else f' ({ratio:.2f}x)'} |")
    md.append(f"| bf16 matmul ceiling measured | {res['matmul_tflops']:.0f} TFLOP/s |")
    res["markdown"] = "\n".join(md)
    print("\n" + res["markdown"] + f"\n\ntotal {res['total_s']:.0f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
