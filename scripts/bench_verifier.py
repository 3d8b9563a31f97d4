#!/usr/bin/env python
"""Benchmark the mathrl verifier against plain math-verify, side by side, in one run.

Sets:
  labelled   tests/reward/cases.jsonl (hand-labelled, GSM8K and MATH style)
  gsm8k+     1319 GSM8K test golds (text after '#### ', commas removed) paired with their own
             reference solution (should verify correct)
  gsm8k-     the same solutions with the final '#### N' replaced by a perturbed number (wrong)
  math500+   500 MATH-500 golds (`answer`) paired with their own solution text (correct)
  math500-   the same solutions with the last \\boxed{} content perturbed (wrong)
  math500 formats+/-  each MATH-500 gold (or its perturbation) as the final answer of a short
             response without \\boxed{}: "the final answer is $G$.", a display \\[ G \\],
             and a trailing inline $G$ (3 x 500 each)

Verifiers:
  mathrl              mathrl.reward.grade_batch (worker pool; timed after the pool is warm)
  mathrl (1 worker)   the same with one worker process, for a per-core comparison
  math-verify         verify(parse(gold), parse(response))
  math-verify boxed   verify(parse('\\boxed{' + gold + '}'), parse(response))

math-verify runs in this process's main thread (its signal.alarm timeouts need that), one
case at a time. Prints a table of accuracy and cases/second.

    OMP_NUM_THREADS=1 python scripts/bench_verifier.py [--quick] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{ln}: not valid JSON: {e.msg}") from None
    return rows


def _bump_int(s: str) -> str | None:
    """Add 1 to the first integer literal (so units such as cm^2 stay); None if there is none."""
    m = re.search(r"\d+", s)
    if m is None:
        return None
    return s[: m.start()] + str(int(m.group(0)) + 1) + s[m.end() :]


def perturb_latex(ans: str) -> str:
    """A wrong answer derived from a gold: bump the first integer, else change the text/expression."""
    b = _bump_int(ans)
    if b is not None:
        return b
    if "\\text{" in ans:
        return "\\text{nobody}"
    return f"{ans} + 1" if "," not in ans else ans.replace(",", "+1,", 1)


def gsm8k_sets(path: Path, limit: int | None):
    rows = load_jsonl(path)[:limit] if limit else load_jsonl(path)
    pos, neg = [], []
    for r in rows:
        sol = r["answer"]
        gold = sol.split("####")[-1].strip().replace(",", "")
        pos.append((sol, gold, True))
        wrong_val = _bump_int(gold) or gold + "1"
        head = sol.rsplit("####", 1)[0]
        neg.append((head + "#### " + wrong_val, gold, False))
    return pos, neg


def _last_box_span(text: str) -> tuple[int, int] | None:
    from mathrl.latex import find_boxes

    boxes = find_boxes(text)
    if not boxes:
        return None
    start, end, _ = boxes[-1]
    inner_start = text.index("{", start) + 1
    return inner_start, end - 1


def math500_sets(path: Path, limit: int | None):
    rows = load_jsonl(path)[:limit] if limit else load_jsonl(path)
    pos, neg = [], []
    for r in rows:
        sol, gold = r["solution"], r["answer"]
        pos.append((sol, gold, True))
        span = _last_box_span(sol)
        wrong = perturb_latex(gold)
        if span is None:
            neg.append((sol + f"\n\nThe answer is $\\boxed{{{wrong}}}$.", gold, False))
        else:
            neg.append((sol[: span[0]] + wrong + sol[span[1] :], gold, False))
    return pos, neg


# answer formats a model may use instead of \boxed{} (MATH-500 golds substituted in)
FORMATS = {
    "phrase": "Thus, the final answer is ${}$.",
    "display": "We find\n\\[ {} \\]",
    "inline": "Therefore the result is ${}$",
}


def math500_format_sets(path: Path, limit: int | None):
    rows = load_jsonl(path)[:limit] if limit else load_jsonl(path)
    pos, neg = [], []
    for fmt in FORMATS.values():
        for r in rows:
            gold = r["answer"]
            pos.append((fmt.format(gold), gold, True))
            neg.append((fmt.format(perturb_latex(gold)), gold, False))
    return pos, neg


def run_mathrl(cases, workers: int | None, timeout: float):
    from mathrl.reward import grade_batch

    responses = [c[0] for c in cases]
    golds = [c[1] for c in cases]
    truncs = [c[3] if len(c) > 3 else False for c in cases]
    t0 = time.perf_counter()
    grades = grade_batch(responses, golds, timeout=timeout, workers=workers, truncated=truncs)
    dt = time.perf_counter() - t0
    right = sum(g.correct == c[2] for g, c in zip(grades, cases))
    timeouts = sum(g.reason == "timeout" for g in grades)
    return right, dt, timeouts


def run_math_verify(cases, boxed_gold: bool):
    from math_verify import parse, verify

    t0 = time.perf_counter()
    right = 0
    errors = 0
    for resp, gold, label, *_ in cases:
        try:
            g = parse("\\boxed{" + gold + "}" if boxed_gold else gold)
            p = parse(resp)
            ok = bool(verify(g, p))
        except Exception:
            ok = False
            errors += 1
        right += ok == label
    return right, time.perf_counter() - t0, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("MATHRL_DATA") or str(ROOT.parent / "shared" / "data"),
                    help="folder with gsm8k/ and math500/ (default: $MATHRL_DATA, else ../shared/data)")
    ap.add_argument("--cases", default=str(ROOT / "tests" / "reward" / "cases.jsonl"))
    ap.add_argument("--quick", action="store_true", help="100 GSM8K and 100 MATH-500 rows only")
    ap.add_argument("--workers", type=int, default=None, help="mathrl pool size (default: CPUs, max 16)")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)

    import logging

    logging.disable(logging.WARNING)
    from mathrl.progress import Progress
    from mathrl.reward.pool import default_workers, get_pool

    limit = 100 if args.quick else None
    sets: list[tuple[str, list]] = []
    labelled = [(c["response"], c["gold"], c["equivalent"], c.get("truncated", False))
                for c in load_jsonl(Path(args.cases))]
    sets.append(("labelled", labelled))
    data = Path(args.data)
    if (data / "gsm8k" / "test.jsonl").is_file():
        p, n = gsm8k_sets(data / "gsm8k" / "test.jsonl", limit)
        sets += [("gsm8k+ (own solution)", p), ("gsm8k- (perturbed)", n)]
    else:
        print(f"skipping GSM8K: {data / 'gsm8k' / 'test.jsonl'} not found", file=sys.stderr)
    if (data / "math500" / "test.jsonl").is_file():
        p, n = math500_sets(data / "math500" / "test.jsonl", limit)
        sets += [("math500+ (own solution)", p), ("math500- (perturbed)", n)]
        p, n = math500_format_sets(data / "math500" / "test.jsonl", limit)
        sets += [("math500 formats+ (gold)", p), ("math500 formats- (perturbed)", n)]
    else:
        print(f"skipping MATH-500: {data / 'math500' / 'test.jsonl'} not found", file=sys.stderr)

    nw = args.workers or default_workers()
    verifiers = [
        (f"mathrl ({nw} workers)", lambda cs: run_mathrl(cs, nw, args.timeout), nw),
        ("mathrl (1 worker)", lambda cs: run_mathrl(cs, 1, args.timeout), 1),
        ("math-verify", lambda cs: run_math_verify(cs, False), None),
        ("math-verify boxed gold", lambda cs: run_math_verify(cs, True), None),
    ]
    results: dict[tuple[str, str], tuple[int, int, float, int]] = {}
    with Progress(len(verifiers) * sum(len(cases) for _, cases in sets), "bench_verifier", unit="case") as bar:
        for vname, fn, pool_size in verifiers:
            bar.set_postfix(vname)
            if pool_size is not None:
                get_pool(pool_size).grade_many([("\\boxed{1}", "1", False)] * pool_size, 30.0)  # warm up
            for sname, cases in sets:
                right, dt, extra = fn(cases)
                results[(vname, sname)] = (right, len(cases), dt, extra)
                if not bar.enabled:  # on a terminal the bar shows the progress instead
                    print(f"  {vname:<24} {sname:<24} {right}/{len(cases)} in {dt:.2f}s", file=sys.stderr)
                bar.update(len(cases))

    # table
    snames = [s for s, _ in sets] + ["all"]
    for vname, _, _ in verifiers:
        tot = [results[(vname, s)] for s, _ in sets]
        results[(vname, "all")] = (sum(t[0] for t in tot), sum(t[1] for t in tot), sum(t[2] for t in tot),
                                   sum(t[3] for t in tot))
    header = ["set", "n"] + [f"{v} acc" for v, _, _ in verifiers] + [f"{v} cases/s" for v, _, _ in verifiers]
    rows = []
    for s in snames:
        n = results[(verifiers[0][0], s)][1]
        accs = [f"{100 * results[(v, s)][0] / results[(v, s)][1]:.2f}%" for v, _, _ in verifiers]
        speeds = [f"{results[(v, s)][1] / results[(v, s)][2]:.0f}" for v, _, _ in verifiers]
        rows.append([s, str(n)] + accs + speeds)
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    mt = sum(results[(v, "all")][3] for v, _, p in verifiers if p is not None)
    print(f"mathrl timeouts: {mt}; machine: {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
