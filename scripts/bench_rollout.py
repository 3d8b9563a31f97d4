#!/usr/bin/env python
"""Rollout throughput: mathrl's backends against their raw engines, in one run.

For SmolLM2-135M-Instruct (embedded), B prompts x n samples x max_tokens new tokens
(default 8 x 8 x 128), temperature 1, top_p 1, the same seed everywhere, it measures generated
tokens per second for

  (a) raw ``vllm.LLM.generate`` (same engine and SamplingParams as (b), timed inside the process
      that owns the engine: the worker interpreter on a CPU machine),
  (b) mathrl's vllm backend (``VLLMRolloutEngine.generate``: tokenization, the pipe to the worker,
      the RolloutBatch),
  (c) raw transformers ``model.generate(num_return_sequences=n)`` (each prompt repeated n times
      before the prefill), sampling with KV cache,
  (d) mathrl's hf backend (prefill once per prompt, cache expanded n times).

Each is warmed up once; then the two methods of a pair run alternately ``--repeats`` times (best
and mean reported), so that load from other processes hits both alike. Ratios: (b)/(a) and (d)/(c). Run:

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_rollout.py --threads 2

The vLLM worker interpreter is found as in `mathrl.rollout.vllm` (``--vllm-python``,
``$MATHRL_VLLM_PYTHON``, ``.venv-vllm``); without one (a) and (b) are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "What is the sum of the first 20 positive odd integers?",
    "A rectangle has a perimeter of 30 cm and a length of 9 cm. What is its area?",
    "If 3x + 7 = 25, what is x?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "What is the remainder when 2^10 is divided by 7?",
    "A train travels 180 km in 2.5 hours. What is its average speed in km/h?",
]
FULL = WARMUP = None  # set in main
SYSTEM = "Solve the problem step by step and put the final answer in \\boxed{}."


NAMES = {"a": "raw vllm.LLM.generate", "b": "mathrl vllm backend", "c": "raw HF generate, prompt repeated G times",
         "d": "mathrl hf backend (prefill once, cache expanded)"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="rollout throughput: mathrl backends vs raw engines")
    ap.add_argument("--model", default="embedded", help="model spec (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", type=int, default=8, help="B (<= %d)" % len(QUESTIONS))
    ap.add_argument("--n", type=int, default=8, help="samples per prompt G")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                    help="CPU threads for torch here and in the vLLM worker")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per method after one warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-python", default=None, help="worker interpreter for vLLM (default: auto)")
    ap.add_argument("--skip", default="", help="comma list of methods to skip: a,b,c,d")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    return ap.parse_args(argv)


def _run(fn, sp):
    t0 = time.perf_counter()
    toks = fn(sp)
    dt = time.perf_counter() - t0
    if isinstance(toks, dict):  # (a) reports its own inner timing
        dt, toks = toks["seconds"], toks["num_tokens"]
    return toks, dt


def timed_pair(fns: dict, repeats: int) -> dict:
    """Each ``fn(sampling)`` returns generated tokens (or ``{seconds, num_tokens}``). One short
    warm-up call each (16 tokens: compiles kernels, fills caches), then ``repeats`` rounds in which
    the methods run alternately, so that load from other processes hits them alike."""
    from mathrl.progress import Progress

    runs: dict = {k: [] for k in fns}
    with Progress(len(fns) * (1 + repeats), f"bench_rollout ({', '.join(fns)})", unit="call") as bar:
        for fn in fns.values():
            fn(WARMUP)
            bar.update()
        for _ in range(repeats):
            for k, fn in fns.items():
                runs[k].append(_run(fn, FULL))
                bar.update()
    return runs


def summarize(runs):
    rates = [t / s for t, s in runs]
    return {"tokens": runs[-1][0], "seconds": runs[-1][1], "best_tok_s": max(rates), "mean_tok_s": sum(rates) / len(rates)}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mathrl.models import load_causal_lm, load_tokenizer, resolve_model_path
    from mathrl.rollout import SamplingConfig
    from mathrl.rollout.hf import HFRolloutEngine

    skip = set(filter(None, args.skip.split(",")))
    path = resolve_model_path(args.model)
    tok = load_tokenizer(path)
    prompts = [tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                       tokenize=False, add_generation_prompt=True) for q in QUESTIONS[: args.prompts]]
    sp = SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=args.seed)
    global FULL, WARMUP
    FULL, WARMUP = sp, SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=16, seed=args.seed + 1)
    g = args.n
    res: dict[str, dict] = {}
    info = {"B": len(prompts), "n": g, "max_tokens": args.max_tokens, "threads": args.threads, "model": path,
            "torch": torch.__version__}
    print(f"bench_rollout: B={len(prompts)} n={g} max_tokens={args.max_tokens} threads={args.threads} model={path}",
          flush=True)

    # ---- vLLM (a, b): one engine -----------------------------------------------------------------
    if not {"a", "b"} <= skip:
        from mathrl.rollout.vllm import VLLMRolloutEngine, default_vllm_python, vllm_importable

        py = args.vllm_python or ("inprocess" if vllm_importable() else default_vllm_python())
        if py is None:
            print("  vLLM: no interpreter with vllm (run scripts/setup_vllm_env.sh); skipping (a) and (b)")
        else:
            t0 = time.perf_counter()
            eng = VLLMRolloutEngine(path, vllm_python=py, worker_env={"OMP_NUM_THREADS": str(args.threads)},
                                    tokenizer=tok)
            info["vllm_startup_s"] = round(time.perf_counter() - t0, 1)
            info["vllm"] = eng.info.get("vllm_version")
            info["vllm_mode"] = eng.mode
            print(f"  vLLM {info['vllm']} ({eng.mode}) started in {info['vllm_startup_s']} s", flush=True)
            try:
                fns = {}
                if "a" not in skip:
                    fns["a"] = lambda s: eng.raw_generate_timed(prompts, g, s)
                if "b" not in skip:
                    fns["b"] = lambda s: eng.generate(prompts, g, s).num_tokens
                for k, runs in timed_pair(fns, args.repeats).items():
                    res[k] = summarize(runs)
                    print(f"  ({k}) {NAMES[k]:48s} {res[k]['best_tok_s']:8.1f} tok/s (mean {res[k]['mean_tok_s']:.1f})",
                          flush=True)
            finally:
                eng.close()

    # ---- transformers (c, d): one model ----------------------------------------------------------
    if not {"c", "d"} <= skip:
        model = load_causal_lm(path, dtype=torch.float32).eval()
        eos = tok.eos_token_id
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)

        def raw_hf(s):
            torch.manual_seed(args.seed)
            with torch.inference_mode():
                out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                     max_new_tokens=s.max_tokens, num_return_sequences=g,
                                     pad_token_id=tok.pad_token_id, eos_token_id=eos)
            gen = out[:, enc["input_ids"].shape[1]:]
            # tokens up to and including the first EOS in each row
            is_eos = gen == eos
            first = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, torch.full_like(gen[:, 0], gen.shape[1]))
            return int(first.sum())

        hf_eng = HFRolloutEngine(model=model, tokenizer=tok)
        fns = {}
        if "c" not in skip:
            fns["c"] = raw_hf
        if "d" not in skip:
            fns["d"] = lambda s: hf_eng.generate(prompts, g, s).num_tokens
        for k, runs in timed_pair(fns, args.repeats).items():
            res[k] = summarize(runs)
            print(f"  ({k}) {NAMES[k]:48s} {res[k]['best_tok_s']:8.1f} tok/s (mean {res[k]['mean_tok_s']:.1f})",
                  flush=True)

    # ---- table -----------------------------------------------------------------------------------
    print()
    print(f"| method | generated tokens | seconds | tokens/s (best of {args.repeats}) | tokens/s (mean) |")
    print("|---|---:|---:|---:|---:|")
    for k in "abcd":
        if k in res:
            r = res[k]
            print(f"| ({k}) {NAMES[k]} | {r['tokens']} | {r['seconds']:.1f} | {r['best_tok_s']:.1f} | "
                  f"{r['mean_tok_s']:.1f} |")
    if "a" in res and "b" in res:
        info["ratio_b_over_a"] = res["b"]["best_tok_s"] / res["a"]["best_tok_s"]
        print(f"\nmathrl vllm / raw vllm = {info['ratio_b_over_a']:.3f} (target >= 0.95)")
    if "c" in res and "d" in res:
        info["ratio_d_over_c"] = res["d"]["best_tok_s"] / res["c"]["best_tok_s"]
        print(f"mathrl hf / raw HF generate = {info['ratio_d_over_c']:.3f} (target > 1)")
    if "b" in res and "d" in res:
        print(f"mathrl vllm / mathrl hf = {res['b']['best_tok_s'] / res['d']['best_tok_s']:.3f}")
    print(json.dumps(info))
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "results": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
