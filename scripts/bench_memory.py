#!/usr/bin/env python
"""Peak memory of one training micro-batch (forward + backward) against mathrl's estimate.

Each configuration runs in a fresh process: the embedded SmolLM2 (or --model) in float32 and train mode,
one micro-batch of ``groups`` prompts x ``G`` responses through the trainer's own forward
(the shared-prompt layout's ``policy_forward``, fused logprob/entropy), a backward, and the
process's peak resident memory (``VmHWM``, reset with ``/proc/self/clear_refs`` after the model is loaded)
minus the memory before the forward. The estimate is
:func:`mathrl.train.memory.micro_batch_bytes`, which the trainer uses to size its micro-batches
(``train.micro_batch_tokens: auto``).

    OMP_NUM_THREADS=2 python scripts/bench_memory.py [--model embedded] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (groups, G, prompt tokens, response tokens)
SHAPES = [(1, 8, 128, 64), (2, 8, 128, 64), (4, 8, 128, 64), (2, 8, 256, 128), (4, 8, 256, 128), (8, 8, 150, 128),
          (4, 4, 512, 256)]


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(model: str, groups: int, G: int, P: int, T: int) -> dict:
    import torch

    from mathrl.models import load_causal_lm, resolve_model_path
    from mathrl.train.rows import ForwardBatch
    from mathrl.train.layouts import Padded
    from mathrl.train.memory import builds_score_matrix, micro_batch_bytes

    torch.manual_seed(0)
    path = resolve_model_path(model)
    lm = load_causal_lm(path, dtype=torch.float32)
    lm.train()
    V = lm.config.vocab_size
    n = groups * G
    prompt = torch.randint(10, V - 1, (groups, P)).repeat_interleave(G, 0)
    resp = torch.randint(10, V - 1, (n, T))
    layout = Padded(G)
    mb = layout.micro_batch(ForwardBatch(prompt, torch.ones_like(prompt), resp, torch.ones_like(resp)), torch.arange(n))
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # peak RSS := current RSS
    before = _rss_kb("VmRSS")
    logp, ent = layout.policy_forward(lm, mb, temperature=1.0, with_entropy=True)
    (-(logp.sum()) - 0.0 * ent.sum()).backward()
    peak = _rss_kb("VmHWM")
    est = micro_batch_bytes(lm.config, groups=groups, rows=n, prompt_len=P, response_len=T,
                            scores=builds_score_matrix(lm.config, "cpu", torch.float32))
    return {"groups": groups, "G": G, "P": P, "T": T, "tokens": groups * P + n * T,
            "measured_mb": (peak - before) / 1024, "estimate_mb": est / 2**20}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, *args.child)))
        return 0
    rows = []
    for shape in SHAPES:
        p = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", *map(str, shape)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr[-2000:], file=sys.stderr)
            return p.returncode
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        if not args.markdown:
            print(f"groups {r['groups']} x G {r['G']}, P {r['P']}, T {r['T']}: {r['tokens']} tokens, measured "
                  f"{r['measured_mb']:.0f} MB, estimate {r['estimate_mb']:.0f} MB", flush=True)
    print("| groups x G | prompt | response | tokens | measured peak MB | estimate MB | estimate / measured |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['groups']} x {r['G']} | {r['P']} | {r['T']} | {r['tokens']} | {r['measured_mb']:.0f} | "
              f"{r['estimate_mb']:.0f} | {r['estimate_mb'] / max(r['measured_mb'], 1):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
