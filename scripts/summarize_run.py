#!/usr/bin/env python
"""Summarise a training run's metrics log: means over windows of steps, as a Markdown table.

    python scripts/summarize_run.py runs/grpo_wordproblems_cpu [--window 10] [--out summary_metrics.md]

Reads ``<run>/metrics.jsonl`` (one JSON object per step; after a resume a step logged twice keeps its
last line) and prints, per window of ``--window`` steps, the mean of: trained-group accuracy
(``reward/accuracy``), the policy's accuracy over every sampled response (``sampling/accuracy_sampled``,
logged with dynamic sampling), the fraction of groups dropped for having no signal
(``sampling/filtered_frac``), mean response length, KL to the reference, boxed rate, sampling rounds and
seconds per step. A metric a window never logged is shown as ``-``. Below the table: steps, the sum of
``time/step`` (the training wall time without checkpoint writing and start-up) and its hours, then the
trainer's own before/after evaluation rows, if the run logged them.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

COLUMNS = (
    ("reward/accuracy", "accuracy (trained groups)", 3),
    ("sampling/accuracy_sampled", "accuracy (all sampled)", 3),
    ("sampling/filtered_frac", "filtered", 2),
    ("response/length_mean", "length", 1),
    ("kl/mean", "KL", 3),
    ("reward/boxed", "boxed", 2),
    ("sampling/rounds", "rounds", 1),
    ("time/step", "s/step", 0),
)


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(training rows, evaluation rows), each in step order; a step logged again (after a resume) keeps
    its last row. Evaluation rows are the trainer's before/after checks (``"event": "eval"``)."""
    from mathrl.data.errors import DataError, RowError
    from mathrl.data.readers import iter_jsonl

    rows: dict[tuple[str, int], dict] = {}
    try:
        for loc, row in iter_jsonl(path):
            if isinstance(row, RowError):
                raise SystemExit(f"{loc}: {row.reason}")
            if not isinstance(row.get("step"), int):
                raise SystemExit(f"{loc}: a metrics row needs an integer 'step'")
            rows[(str(row.get("event", "")), row["step"])] = row
    except DataError as exc:
        raise SystemExit(str(exc)) from None
    ordered = [rows[k] for k in sorted(rows, key=lambda k: k[1])]
    return [r for r in ordered if "event" not in r], [r for r in ordered if r.get("event") == "eval"]


def window_means(rows: list[dict], window: int) -> list[tuple[int, int, dict[str, float]]]:
    """[(first step, last step, {metric: mean over the rows of the window that logged it})]."""
    out = []
    for i in range(0, len(rows), window):
        chunk = rows[i:i + window]
        means = {}
        for key, _, _ in COLUMNS:
            vals = [float(r[key]) for r in chunk if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if vals:
                means[key] = sum(vals) / len(vals)
        out.append((chunk[0]["step"], chunk[-1]["step"], means))
    return out


EVAL_KEYS = ("greedy", "pass@1", "maj@4", "pass@4", "boxed_rate", "length_mean")


def render(rows: list[dict], window: int, evals: list[dict] = ()) -> str:
    head = "| steps | " + " | ".join(label for _, label, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for first, last, means in window_means(rows, window):
        cells = [f"{means[k]:.{d}f}" if k in means else "-" for k, _, d in COLUMNS]
        lines.append(f"| {first}-{last} | " + " | ".join(cells) + " |")
    step_s = sum(float(r.get("time/step", 0.0)) for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} steps; sum of time/step {step_s:.0f} s ({step_s / 3600:.2f} h)")
    if evals:
        keys = [k for k in EVAL_KEYS if any(k in e for e in evals)]
        lines += ["", "The trainer's own held-out check (data.eval_source, first data.eval_limit problems):", "",
                  "| step | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
        for e in evals:
            lines.append(f"| {e['step']} | " + " | ".join(
                f"{e[k]:.3f}" if isinstance(e.get(k), (int, float)) else "-" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a training run folder (holds metrics.jsonl)")
    ap.add_argument("--window", type=int, default=10, help="steps per row (default 10)")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    if args.window < 1:
        raise SystemExit(f"--window {args.window}: allowed: >= 1")
    path = Path(args.run) / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (give a training run folder)")
    rows, evals = read_metrics(path)
    if not rows:
        raise SystemExit(f"{path}: no training steps logged")
    text = render(rows, args.window, evals)
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
