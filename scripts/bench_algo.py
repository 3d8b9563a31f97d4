#!/usr/bin/env python
"""Microbenchmark: memory-lean logprobs/entropy from logits versus the naive versions.

Compares, on CPU, for logits of shape [N, T, V] (default 16 x 512 x 49152, float32):

* ``logprobs``: ``mathrl.algo.logprobs.logprobs_from_logits`` vs
  ``torch.log_softmax(logits, -1).gather(-1, ids)``;
* ``entropy``: ``mathrl.algo.logprobs.entropy_from_logits`` vs
  ``-(softmax(logits) * log_softmax(logits)).sum(-1)``;

each forward only (``torch.no_grad``) and forward + backward (the trainer backpropagates
through both). Every variant runs in a fresh subprocess; its peak memory is the process's
resident-set high-water mark (``getrusage(RUSAGE_SELF).ru_maxrss``) after the variant
minus the high-water mark just before it (logits, ids and weights already allocated), so
every torch allocation is counted (``tracemalloc`` would see none of them). Time: the
median and the minimum wall time of ``--repeats`` runs after one warm-up run (on a busy
machine the minimum is the steadier figure).

Usage::

    OMP_NUM_THREADS=1 python scripts/bench_algo.py [--n 16 --t 512 --v 49152 --repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "logprobs naive fwd": ("logprobs", "naive", False),
    "logprobs mathrl fwd": ("logprobs", "mathrl", False),
    "entropy naive fwd": ("entropy", "naive", False),
    "entropy mathrl fwd": ("entropy", "mathrl", False),
    "logprobs naive fwd+bwd": ("logprobs", "naive", True),
    "logprobs mathrl fwd+bwd": ("logprobs", "mathrl", True),
    "entropy naive fwd+bwd": ("entropy", "naive", True),
    "entropy mathrl fwd+bwd": ("entropy", "mathrl", True),
    "logprobs+entropy naive fwd+bwd": ("both", "naive", True),
    "logprobs+entropy mathrl fwd+bwd": ("both", "mathrl", True),
}


def _maxrss_bytes() -> int:
    # Linux reports KiB (macOS reports bytes).
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def _worker(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from mathrl.algo.logprobs import (
        entropy_from_logits,
        logprobs_and_entropy_from_logits,
        logprobs_from_logits,
    )

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    kind, impl, backward = VARIANTS[args.worker]
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(args.n, args.t, args.v, generator=g, dtype=dtype)
    ids = torch.randint(0, args.v, (args.n, args.t), generator=g)
    mask = torch.ones(args.n, args.t, dtype=torch.bool)
    w = torch.randn(args.n, args.t, generator=g)

    def run() -> float:
        x = logits.detach().requires_grad_(backward)
        with torch.set_grad_enabled(backward):
            if kind == "logprobs":
                if impl == "naive":
                    out = torch.log_softmax(x.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
                else:
                    out = logprobs_from_logits(x, ids)
            elif kind == "entropy":
                if impl == "naive":
                    xf = x.float()
                    out = -(torch.softmax(xf, -1) * torch.log_softmax(xf, -1)).sum(-1)
                else:
                    out = entropy_from_logits(x, mask)
            else:  # a loss using both, as a policy loss with an entropy bonus does
                if impl == "naive":
                    ls = torch.log_softmax(x.float(), -1)
                    lp = ls.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
                    out = lp - 0.01 * -(ls.exp() * ls).sum(-1)
                else:
                    lp, ent = logprobs_and_entropy_from_logits(x, ids, mask)
                    out = lp - 0.01 * ent
            s = (out * w).sum()
            if backward:
                s.backward()  # writes the full [N, T, V] gradient into x.grad
        return float(s)

    # Warm-up on a small slice (loads kernels, thread pools) so it does not count.
    logprobs_from_logits(logits[:1, :4], ids[:1, :4])
    entropy_from_logits(logits[:1, :4], mask[:1, :4])
    torch.log_softmax(logits[:1, :4], -1)
    base = _maxrss_bytes()
    times, checksum = [], 0.0
    for _ in range(args.repeats + 1):
        t0 = time.perf_counter()
        checksum = run()
        times.append(time.perf_counter() - t0)
    peak = _maxrss_bytes() - base
    print(json.dumps({"variant": args.worker, "time_s": statistics.median(times[1:]),
                      "time_min_s": min(times[1:]),
                      "peak_extra_bytes": peak, "checksum": checksum,
                      "logits_bytes": logits.numel() * logits.element_size()}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--t", type=int, default=512)
    ap.add_argument("--v", type=int, default=49152)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), help="run only these variants")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from mathrl.progress import Progress

    threads = os.environ.get("OMP_NUM_THREADS")
    env = dict(os.environ, OMP_NUM_THREADS=threads or "1")
    gib = 2**30
    print(f"logits [{args.n}, {args.t}, {args.v}] {args.dtype} on CPU = "
          f"{args.n * args.t * args.v * (4 if args.dtype == 'float32' else 2) / gib:.2f} GiB; "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}; {args.repeats} timed runs; "
          "peak = RSS high-water increase over logits+ids (fresh process per variant)")
    results = []
    names = list(args.only or VARIANTS)
    with Progress(len(names), "bench_algo", unit="variant") as bar:
        for i, name in enumerate(names):
            if i == 0:
                bar.set_postfix(name)
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--n", str(args.n),
                   "--t", str(args.t), "--v", str(args.v), "--dtype", args.dtype,
                   "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                bar.close()
                print(f"{name}: failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = results[-1]
            if not bar.enabled:  # on a terminal the bar shows the progress instead
                print(f"  done: {name:32s} {r['time_s']:.3f} s  {r['peak_extra_bytes'] / gib:.2f} GiB",
                      file=sys.stderr)
            bar.set_postfix(names[i + 1] if i + 1 < len(names) else "")
            bar.update()

    print()
    print("| variant | time median (s) | time min (s) | peak extra memory (GiB) | checksum |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['variant']} | {r['time_s']:.2f} | {r['time_min_s']:.2f} | "
              f"{r['peak_extra_bytes'] / gib:.2f} | {r['checksum']:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
