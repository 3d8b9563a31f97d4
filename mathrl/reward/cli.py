"""``mathrl verify``: grade one response, or a JSONL file of labelled cases.

    mathrl verify --gold G --response R [--truncated] [--timeout S]
    mathrl verify --file cases.jsonl [--workers N] [--timeout S] [--show N]

File lines are JSON objects with ``gold`` and ``response`` (strings) and optional
``equivalent`` (bool: the human label) and ``truncated`` (bool). With labels it prints the
accuracy, the confusion table and the disagreements; without, the verdict counts.
Exit status: 0 on success, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from mathrl.jsonl import json_objects
from mathrl.reward.api import grade, grade_batch
from mathrl.reward.options import GradeOptions, GradeOptionsError

__all__ = ["main", "load_cases"]


class CaseFileError(ValueError):
    pass


def load_cases(path: str | Path) -> list[dict]:
    """Read a cases JSONL file; raises CaseFileError naming file and line for any bad line."""
    p = Path(path)
    cases = []
    for ln, obj in json_objects(p, CaseFileError):
        for key in ("gold", "response"):
            if key not in obj:
                raise CaseFileError(f"{p}:{ln}: missing key {key!r} (required: 'gold', 'response')")
            value = obj[key]
            if key == "gold" and isinstance(value, (int, float)) and not isinstance(value, bool):
                obj[key] = value = json.dumps(value)  # a numeric gold (72, 0.5) as written in the file
            if not isinstance(value, str):
                raise CaseFileError(f"{p}:{ln}: key {key!r} must be a string"
                                    f"{' or a number' if key == 'gold' else ''}, got {type(value).__name__}")
        if not obj["gold"].strip():
            raise CaseFileError(f"{p}:{ln}: key 'gold' is empty; give the reference answer")
        for key in ("equivalent", "truncated"):
            if key in obj and not isinstance(obj[key], bool):
                raise CaseFileError(f"{p}:{ln}: key {key!r} must be true or false, got {obj[key]!r}")
        obj["_line"] = ln
        cases.append(obj)
    if not cases:
        raise CaseFileError(f"{p}: no cases")
    return cases


def _short(s: str | None, n: int = 70) -> str:
    if s is None:
        return "None"
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 3] + "..."


def _run_file(args, options: GradeOptions) -> int:
    try:
        cases = load_cases(args.file)
    except CaseFileError as e:
        print(f"mathrl verify: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    grades = grade_batch([c["response"] for c in cases], [c["gold"] for c in cases], options,
                         truncated=[c.get("truncated", False) for c in cases])
    dt = time.perf_counter() - t0
    reasons = Counter(g.reason for g in grades)
    print(f"{len(cases)} cases in {dt:.2f}s ({len(cases) / dt:.0f} cases/s); reasons: "
          + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))
    labelled = [(c, g) for c, g in zip(cases, grades) if "equivalent" in c]
    if not labelled:
        print(f"correct: {sum(g.correct for g in grades)} / {len(grades)} (no 'equivalent' labels)")
        return 0
    tp = sum(1 for c, g in labelled if c["equivalent"] and g.correct)
    fn = sum(1 for c, g in labelled if c["equivalent"] and not g.correct)
    fp = sum(1 for c, g in labelled if not c["equivalent"] and g.correct)
    tn = sum(1 for c, g in labelled if not c["equivalent"] and not g.correct)
    acc = (tp + tn) / len(labelled)
    print(f"accuracy: {acc:.2%} ({tp + tn}/{len(labelled)})")
    print("confusion (rows = label, columns = verdict):")
    print(f"{'':>16}{'correct':>10}{'wrong':>10}")
    print(f"{'equivalent':>16}{tp:>10}{fn:>10}")
    print(f"{'not equivalent':>16}{fp:>10}{tn:>10}")
    dis = [(c, g) for c, g in labelled if c["equivalent"] != g.correct]
    if dis:
        print(f"disagreements ({len(dis)}):")
        for c, g in dis[: args.show]:
            print(f"  line {c['_line']}: label={c['equivalent']} verdict={g.correct} ({g.reason}) "
                  f"gold={_short(c['gold'], 40)!s} extracted={_short(g.extracted, 40)!s} "
                  f"response={_short(c['response'])}")
        if len(dis) > args.show:
            print(f"  ... {len(dis) - args.show} more (use --show)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mathrl verify", description=__doc__.split("\n\n")[0])
    p.add_argument("--gold", help="gold answer (number, LaTeX, $...$ or \\boxed{...})")
    p.add_argument("--response", help="model response text")
    p.add_argument("--truncated", action="store_true", help="the response was cut at the length limit")
    p.add_argument("--file", help="JSONL with gold, response, optional equivalent/truncated")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per case (default 5)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPUs, max 16)")
    p.add_argument("--rel-tol", type=float, default=0.0,
                   help="relative tolerance for numbers (default 0: exact, so 0.333 is not 1/3)")
    p.add_argument("--show", type=int, default=50, help="disagreements to print (default 50)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = GradeOptions(timeout=args.timeout, workers=args.workers, rel_tol=args.rel_tol)
    except GradeOptionsError as e:  # named by its flag: --timeout, --workers, --rel-tol
        print(f"mathrl verify: error: --{e.option.replace('_', '-')} must be {e.allowed}, got {e.value}",
              file=sys.stderr)
        return 2
    if args.file:
        if args.gold is not None or args.response is not None:
            print("mathrl verify: error: use either --file or --gold/--response, not both", file=sys.stderr)
            return 2
        return _run_file(args, options)
    if args.gold is None or args.response is None:
        print("mathrl verify: error: give --gold and --response, or --file cases.jsonl", file=sys.stderr)
        return 2
    if not args.gold.strip():
        print("mathrl verify: error: --gold is empty; give the reference answer", file=sys.stderr)
        return 2
    g = grade(args.response, args.gold, options, truncated=args.truncated)
    print(f"{'CORRECT' if g.correct else 'WRONG'}  reason={g.reason}  extracted={g.extracted!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
