#!/usr/bin/env python
"""Benchmark the mathrl verifier against math-verify, side by side, in one run.

Sets (reported separately; external sets are labelled by others, not by this project):
  own          tests/reward/cases.jsonl: this project's hand-labelled cases (GSM8K and MATH style)
  peers dev / peers holdout
               eval/verifier_sets/peers.jsonl: labelled pairs from the public test suites of 12 other
               graders (Math-Verify, MARIO_EVAL, AReaL, NeMo-Skills, lighteval, slime, MindSpeed-RL,
               SkyRL, hendrycks/math, TRL, verl, open-r1); pairs whose label a reasonable grader could
               dispute are left out (listed with the reason in the file). The holdout part was not
               looked at while the verifier was changed.
  peers fresh  eval/verifier_sets/peers_fresh.jsonl: 262 pairs from the tests of 10 further projects
               (inspect_ai, sieval, NeMo-RL, rllm, tinker-cookbook, open-instruct, verifiers, ...), added
               on 2026-12-01 after the holdout had been looked at; debatable pairs left out.
  peers fresh2 eval/verifier_sets/peers_fresh2.jsonl: 94 pairs from the tests of 5 more projects (forge,
               eval-protocol, SkyThought, strands-env, AgentFly), built after the fresh set had been
               looked at; debatable pairs left out.
  model gsm8k / model math500 / model synthetic
               eval/verifier_sets/model_outputs_*.jsonl: SmolLM2-135M-Instruct samples on GSM8K test,
               MATH-500 and the demo's synthetic task (before and after training), labelled by reading
               (truncated responses carry their flag)
  gsm8k+/- math500+/- formats+/-
               the datasets' own solutions, and the golds in other answer formats, plus perturbed
               (wrong) versions (from ../shared/data or --data)

Verifiers:
  mathrl              mathrl.reward.grade_batch (worker pool; timed after the pool is warm)
  mathrl (1 worker)   the same with one worker process, for a per-core comparison
  mathrl, no 2nd op.  mathrl's own rules only (MATHRL_VERIFIER_SECOND_OPINION=0)
  math-verify         verify(parse(gold as $...$ or boxed), parse(response)): its documented use
                      (a gold that already has $ or \\boxed is passed as written)

For each: accuracy, false positives (wrong answers credited) and false negatives (right answers
missed) separately, and cases/second. math-verify runs in this process's main thread (its
signal.alarm timeouts need that), one case at a time.

    OMP_NUM_THREADS=1 python scripts/bench_verifier.py [--quick] [--data DIR] [--markdown]
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


_POOL_SETTINGS: list[tuple[int, bool]] = []


def run_mathrl(cases, workers: int, timeout: float, second_opinion: bool = True):
    """mathrl's verdicts on ``cases`` and the seconds they took. The worker pool is started (and warmed
    on one trivial case) when a verifier's settings change, then kept across sets, as in a training run:
    its workers see the sets in the same order, with the same caches, as math-verify's process does."""
    from mathrl.reward import GradeOptions, grade_batch, shutdown_pool
    from mathrl.reward.pool import get_pool

    if _POOL_SETTINGS[-1:] != [(workers, second_opinion)]:
        os.environ["MATHRL_VERIFIER_SECOND_OPINION"] = "1" if second_opinion else "0"
        shutdown_pool()  # the workers read the switch when they start
        get_pool(workers).grade_many([("\\boxed{1}", "1", False)] * workers, GradeOptions(30.0))  # warm up
        _POOL_SETTINGS.append((workers, second_opinion))
    t0 = time.perf_counter()
    grades = grade_batch([c[0] for c in cases], [c[1] for c in cases], timeout=timeout, workers=workers,
                         truncated=[c[3] for c in cases])
    dt = time.perf_counter() - t0
    return [g.correct for g in grades], dt, sum(g.reason == "timeout" for g in grades)


def _mv_gold(gold: str) -> str:
    """The gold as math-verify's documentation passes it: in $...$ or boxed."""
    return gold if ("$" in gold or "\\boxed" in gold) else "\\boxed{" + gold + "}"


def run_math_verify(cases):
    """math-verify's verdicts and seconds, in this process (warmed on one trivial case, like the pool)."""
    from math_verify import parse, verify

    verify(parse("$1$"), parse("1"))
    t0 = time.perf_counter()
    verdicts, errors = [], 0
    for resp, gold, *_ in cases:
        try:
            ok = bool(verify(parse(_mv_gold(gold)), parse(resp)))
        except Exception:
            ok = False
            errors += 1
        verdicts.append(ok)
    return verdicts, time.perf_counter() - t0, errors


def labelled_file(path: Path, split: str | None = None) -> list[tuple]:
    """(response, gold, label, truncated) of a labelled JSONL set, debatable pairs left out."""
    out = []
    for r in load_jsonl(path):
        if r.get("debatable") or (split is not None and r.get("split") != split):
            continue
        label = r["label"] if "label" in r else r["equivalent"]
        trunc = bool(r.get("truncated", False)) or r.get("finish_reason") == "length"
        out.append((r["response"], r["gold"], bool(label), trunc))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("MATHRL_DATA") or str(ROOT.parent / "shared" / "data"),
                    help="folder with gsm8k/ and math500/ (default: $MATHRL_DATA, else ../shared/data)")
    ap.add_argument("--cases", default=str(ROOT / "tests" / "reward" / "cases.jsonl"))
    ap.add_argument("--sets-dir", default=str(ROOT / "eval" / "verifier_sets"))
    ap.add_argument("--quick", action="store_true", help="100 GSM8K and 100 MATH-500 rows only")
    ap.add_argument("--external-only", action="store_true", help="only the own, peers and model-output sets")
    ap.add_argument("--workers", type=int, default=None, help="mathrl pool size (default: CPUs, max 16)")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)

    import logging

    logging.disable(logging.WARNING)
    from mathrl.progress import Progress
    from mathrl.reward.pool import default_workers

    limit = 100 if args.quick else None
    sets: list[tuple[str, list]] = [("own (cases.jsonl)", labelled_file(Path(args.cases)))]
    vs = Path(args.sets_dir)
    for name, file, split in (("peers dev", "peers.jsonl", "dev"), ("peers holdout", "peers.jsonl", "holdout"),
                              ("peers fresh", "peers_fresh.jsonl", None),
                              ("peers fresh2", "peers_fresh2.jsonl", None),
                              ("model gsm8k", "model_outputs_gsm8k.jsonl", None),
                              ("model math500", "model_outputs_math500.jsonl", None),
                              ("model synthetic", "model_outputs_synthetic.jsonl", None)):
        if (vs / file).is_file():
            sets.append((name, labelled_file(vs / file, split)))
        else:
            print(f"skipping {name}: {vs / file} not found", file=sys.stderr)
    data = Path(args.data)
    if not args.external_only and (data / "gsm8k" / "test.jsonl").is_file():
        p, n = gsm8k_sets(data / "gsm8k" / "test.jsonl", limit)
        sets += [("gsm8k+ (own solution)", p), ("gsm8k- (perturbed)", n)]
    if not args.external_only and (data / "math500" / "test.jsonl").is_file():
        p, n = math500_sets(data / "math500" / "test.jsonl", limit)
        sets += [("math500+ (own solution)", p), ("math500- (perturbed)", n)]
        p, n = math500_format_sets(data / "math500" / "test.jsonl", limit)
        sets += [("math500 formats+ (gold)", p), ("math500 formats- (perturbed)", n)]
    sets = [(name, [c if len(c) > 3 else (*c, False) for c in cases]) for name, cases in sets]

    nw = args.workers or default_workers()
    verifiers = [
        (f"mathrl ({nw} workers)", lambda cs: run_mathrl(cs, nw, args.timeout)),
        ("mathrl (1 worker)", lambda cs: run_mathrl(cs, 1, args.timeout)),
        ("mathrl, no 2nd op.", lambda cs: run_mathrl(cs, nw, args.timeout, second_opinion=False)),
        ("math-verify", run_math_verify),
    ]
    results: dict[tuple[str, str], tuple[list[bool], float, int]] = {}
    with Progress(len(verifiers) * sum(len(cases) for _, cases in sets), "bench_verifier", unit="case") as bar:
        for vname, fn in verifiers:
            bar.set_postfix(vname)
            for sname, cases in sets:
                results[(vname, sname)] = fn(cases)
                if not bar.enabled:  # on a terminal the bar shows the progress instead
                    right = sum(v == c[2] for v, c in zip(results[(vname, sname)][0], cases))
                    print(f"  {vname:<24} {sname:<28} {right}/{len(cases)} in {results[(vname, sname)][1]:.2f}s",
                          file=sys.stderr)
                bar.update(len(cases))

    def cell(vname: str, cases: list, verdicts: list[bool]) -> tuple[str, str]:
        right = sum(v == c[2] for v, c in zip(verdicts, cases))
        fp = sum(v and not c[2] for v, c in zip(verdicts, cases))
        fn = sum(c[2] and not v for v, c in zip(verdicts, cases))
        return f"{100 * right / max(1, len(cases)):.1f}%", f"{fp}/{fn}"

    header = ["set", "n (pos/neg)"]
    for v, _ in verifiers:
        header += [f"{v} acc", f"{v} FP/FN"]
    header += [f"{v} cases/s" for v, _ in verifiers]
    rows = []
    all_cases = [c for _, cases in sets for c in cases]
    for sname, cases in [*sets, ("all", all_cases)]:
        pos = sum(c[2] for c in cases)
        row = [sname, f"{len(cases)} ({pos}/{len(cases) - pos})"]
        for v, _ in verifiers:
            if sname == "all":
                verdicts = [x for s, _ in sets for x in results[(v, s)][0]]
            else:
                verdicts = results[(v, sname)][0]
            row += list(cell(v, cases, verdicts))
        for v, _ in verifiers:
            t = sum(results[(v, s)][1] for s, _ in sets) if sname == "all" else results[(v, sname)][1]
            row.append(f"{len(cases) / max(t, 1e-9):.0f}")
        rows.append(row)
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
    mt = sum(results[(v, s)][2] for v, _ in verifiers[:3] for s, _ in sets)
    print(f"mathrl timeouts: {mt}; machine: {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
