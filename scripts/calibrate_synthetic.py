"""Measure a model's pass@k on each synthetic level, to choose the default level.

RL needs a signal: the default level is one where pass@8 is neither near 0 nor
near 1. Prints one row per level: greedy accuracy (and greedy correct inside
\\boxed{}), pass@1, pass@n, maj@n, the share of samples with a \\boxed{} answer,
mean length.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/calibrate_synthetic.py --levels 1,2,3,4 --problems 24
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--levels", default="1,2,3,4")
    ap.add_argument("--problems", type=int, default=24)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--template", default="chat_boxed_oneshot")
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from mathrl.config import load_config
    from mathrl.models import load_tokenizer, resolve_model_path
    from mathrl.rollout import make_engine
    from mathrl.train.report import evaluate

    path = resolve_model_path(args.model)
    tok = load_tokenizer(path)
    engine = make_engine("hf", path, tokenizer=tok)
    print(f"model {args.model}, template {args.template}, {args.problems} problems x n={args.n}, "
          f"T={args.temperature}, max {args.max_tokens} tokens, {os.environ['OMP_NUM_THREADS']} threads")
    print(f"| level | greedy acc | greedy boxed | pass@1 | pass@{args.n} | maj@{args.n} | boxed rate | mean length | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    from mathrl.data import load_problems

    for level in [int(x) for x in args.levels.split(",")]:
        cfg = load_config(None, [f"data.template={args.template}", f"eval.n={args.n}", f"eval.k=1,{args.n}",
                                 f"eval.temperature={args.temperature}", "eval.top_p=1.0",
                                 f"eval.max_tokens={args.max_tokens}"])
        problems = load_problems("synthetic", None, "test", n=args.problems, level=level, seed=123)
        t0 = time.time()
        res = evaluate(engine, problems, cfg)
        print(f"| {level} | {res['greedy']:.3f} | {res['greedy_boxed']:.3f} | {res['pass@1']:.3f} | "
              f"{res[f'pass@{args.n}']:.3f} | {res[f'maj@{args.n}']:.3f} | {res['boxed_rate']:.3f} | "
              f"{res['length_mean']:.1f} | {time.time() - t0:.0f} |", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
