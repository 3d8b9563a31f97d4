#!/usr/bin/env python
"""Estimate how long an ablation study takes on this machine from a short probe of it.

    python scripts/ablate_estimate.py configs/ablations/cpu_demo.yaml --steps 2 --eval-limit 4

runs every run of the study for ``--steps`` steps with ``--eval-limit`` held-out problems into a
scratch folder (``--out``, default ``runs/ablations/<name>-probe``; resumable like any study), then
extrapolates each run to the study's own ``train.steps`` and ``data.eval_limit``:

* training = start-up (model/engine construction: the run's wall time minus its steps) +
  steps x mean seconds per step (offline RFT: its up-front sampling scales with the steps too);
* evaluation = seconds per held-out problem x problems, for the baseline and each run's "after"
  (and the intermediate checkpoints when ``study.curve_every`` is set).

Sampling time depends on response lengths, which change during training, so the estimate is a
first-order one; it prints a table and the total.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _probe_study(path: str, steps: int, eval_limit: int, out: str | None):
    from mathrl.ablate.study import load_study, run_config

    full = load_study(path)
    probe = load_study(path, out=out or f"{full.out}-probe")
    probe.curve_every = 0
    for r in probe.runs:
        r.overrides = r.overrides + [("train.steps", steps, "ablate_estimate --steps"),
                                     ("data.eval_limit", eval_limit, "ablate_estimate --eval-limit")]
    full_cfgs = {r.name: run_config(full, r) for r in full.runs}
    return full, probe, full_cfgs


def estimate(full, probe, full_cfgs, eval_limit: int) -> tuple[list[dict], float]:
    from mathrl.ablate.study import DONE
    from mathrl.train.metrics import read_metrics

    rows, total = [], 0.0
    baselines_done: set[str] = set()
    for r in probe.runs:
        d = probe.out / r.name
        done = json.loads((d / DONE).read_text())
        recs = read_metrics(d / "metrics.jsonl")
        steps = [m for m in recs if "event" not in m]
        per_step = sum(m["time/step"] for m in steps) / len(steps)
        sampling = sum(m.get("time/sampling", 0.0) for m in recs if m.get("event") == "rft_sampling")
        startup = max(0.0, done["wall_train_s"] - per_step * len(steps) - sampling)
        cfg = full_cfgs[r.name]
        n_full = cfg.train.steps
        train = startup + n_full * (per_step + sampling / len(steps))
        base_dir = probe.out / f"baseline-{done['baseline']}"
        base_s = json.loads((base_dir / "summary.json").read_text())["seconds"]
        per_problem = base_s / eval_limit
        n_evals = 1 + (n_full // full.curve_every - (1 if n_full % full.curve_every == 0 else 0)
                       if full.curve_every else 0)
        ev = n_evals * per_problem * cfg.data.eval_limit
        if done["baseline"] not in baselines_done:
            baselines_done.add(done["baseline"])
            ev += per_problem * cfg.data.eval_limit
        rows.append({"run": r.name, "probe_s_per_step": round(per_step, 1), "startup_s": round(startup, 1),
                     "steps": n_full, "train_s": round(train), "eval_s": round(ev), "total_s": round(train + ev)})
        total += train + ev
    return rows, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study")
    p.add_argument("--steps", type=int, default=2, help="probe steps per run (default 2)")
    p.add_argument("--eval-limit", type=int, default=4, help="held-out problems in the probe (default 4)")
    p.add_argument("--out", help="probe folder (default: <study out>-probe)")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from mathrl.ablate.driver import run_study

    from mathrl.ablate.study import dump_study, load_study

    full, probe, full_cfgs = _probe_study(args.study, args.steps, args.eval_limit, args.out)
    probe_file = dump_study(probe, Path(probe.out) / "probe_study.yaml")  # worker processes read it
    probe = load_study(probe_file)
    run_study(probe_file)
    rows, total = estimate(full, probe, full_cfgs, args.eval_limit)
    cols = list(rows[0])
    print("\n" + "  ".join(c.rjust(14) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).rjust(14) for c in cols))
    print(f"\nestimated wall time of {args.study}: {total / 60:.0f} min "
          f"(probe: {args.steps} steps, {args.eval_limit} held-out problems, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
