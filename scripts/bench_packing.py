#!/usr/bin/env python
"""Update-phase throughput with the padded and the packed micro-batch layouts, side by side.

The trainer's policy update (forward with logprobs and entropies, PPO-clip loss, backward) on the
embedded SmolLM2-135M-Instruct, over one batch of B prompts x G responses cut into micro-batches by
``train.micro_batch_tokens`` exactly as the trainer plans them, once with ``train.packing=false``
(each response padded to the micro-batch's longest) and once packed (``train.packing=true``: each
group's responses first-fit into rows no wider than the longest; mathrl/train/packing.py).
Response lengths: all equal (no padding to remove), or spread uniformly between 8 and the maximum with
a quarter truncated at the maximum, as GRPO batches look. The layouts alternate, median of the
repeats after a warm-up. Reported: real tokens per second (prompt once per group + response
tokens), the padded-token fraction (computed but not real), and each layout's time / padded.

    OMP_NUM_THREADS=2 python scripts/bench_packing.py [--prompts 8] [--group 8] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mathrl.algo.losses import policy_loss  # noqa: E402
from mathrl.train.rows import ForwardBatch  # noqa: E402
from mathrl.train.layouts import Layout, Packed, Padded  # noqa: E402
from mathrl.train.packing import PackedMicroBatch  # noqa: E402


def lengths(kind: str, n: int, max_tokens: int, seed: int) -> list[int]:
    if kind == "equal":
        return [max_tokens] * n
    g = torch.Generator().manual_seed(seed)
    out = torch.randint(8, max_tokens + 1, (n,), generator=g)
    out[torch.rand(n, generator=g) < 0.25] = max_tokens
    return out.tolist()


def batch(tok, prompts: int, group: int, rlens: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    n = prompts * group
    plens = torch.randint(60, 161, (prompts,), generator=g).tolist()  # GSM8K-like prompts with a template
    pw, tw = max(plens), max(rlens)
    vocab = len(tok)
    pids = torch.randint(100, vocab, (n, pw), generator=g)
    pmask = torch.zeros(n, pw, dtype=torch.long)
    for i in range(prompts):
        row = torch.randint(100, vocab, (pw,), generator=g)
        pids[i * group:(i + 1) * group] = row
        pmask[i * group:(i + 1) * group, pw - plens[i]:] = 1
    rids = torch.randint(100, vocab, (n, tw), generator=g)
    rmask = torch.arange(tw)[None, :] < torch.tensor(rlens)[:, None]
    return pids, pmask, rids, rmask, sum(plens) + sum(rlens)


def update(model, tensors, group: int, budget: int, layout: Layout) -> tuple[float, int]:
    pids, pmask, rids, rmask = tensors
    tokens = ForwardBatch(pids, pmask, rids, rmask)
    model.zero_grad(set_to_none=True)
    adv = torch.randn(rids.shape[0], 1).expand_as(rids)
    slots = 0
    t0 = time.perf_counter()
    for rows in layout.plan(tokens, budget):
        mb = layout.micro_batch(tokens, rows, "cpu")
        logp, ent = layout.policy_forward(model, mb, temperature=1.0, with_entropy=True)
        m = mb.response_mask
        loss, _ = policy_loss(logp, logp.detach(), adv[rows, : mb.T], m, norm_tokens=float(rmask.sum()))
        loss.backward()
        slots += mb.slot_tokens if isinstance(mb, PackedMicroBatch) else (rows.numel() // group) * mb.P + rows.numel() * mb.T
    return time.perf_counter() - t0, slots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mathrl.models import ensure_embedded_model

    path = args.model or str(ensure_embedded_model())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    print(f"model {Path(path).name}, {args.prompts} prompts x {args.group} responses, max {args.max_tokens} tokens, "
          f"micro_batch_tokens {args.micro_batch_tokens}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"torch {torch.__version__}, attention {model.config._attn_implementation}")
    rows = []
    for kind in ("equal", "spread"):
        rl = lengths(kind, args.prompts * args.group, args.max_tokens, seed=1)
        pids, pmask, rids, rmask, real = batch(tok, args.prompts, args.group, rl, seed=2)
        tensors = (pids, pmask, rids, rmask)
        layouts = {"padded": Padded(args.group), "packed": Packed(args.group)}
        times = {k: [] for k in layouts}
        slots = {}
        for rep in range(args.repeats + 1):
            for name, layout in layouts.items():
                dt, slots[name] = update(model, tensors, args.group, args.micro_batch_tokens, layout)
                if rep:  # the first round is the warm-up
                    times[name].append(dt)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((kind, sum(rl) / len(rl), real, slots, med))
    print()
    print("| response lengths | mean length | real tokens | layout | padded-token fraction | update s | "
          "real tokens/s | time / padded |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, mean, real, slots, med in rows:
        for name in slots:
            print(f"| {kind} | {mean:.0f} | {real} | {name} | {1 - real / slots[name]:.2f} | {med[name]:.1f} | "
                  f"{real / med[name]:.0f} | {med[name] / med['padded']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
