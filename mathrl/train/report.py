"""Evaluation inside a training run and the run's report: held-out metrics before/after (split across
ranks), the reward curve and ``summary.md``."""

from __future__ import annotations

import sys
from pathlib import Path

from mathrl.config import Config
from mathrl.dist.collectives import DistInfo, all_gather_objects
from mathrl.eval import report as eval_report
from mathrl.eval.runner import EvalSettings, evaluate_benchmark
from mathrl.train.metrics import read_metrics


def evaluate(rollout, problems, cfg: Config, *, out_dir: Path | None = None,
             dist: DistInfo | None = None) -> dict[str, float]:
    """Held-out evaluation with the evaluation stage's runner (:mod:`mathrl.eval.runner`): greedy
    accuracy, pass@k and maj@k over ``eval.n`` samples, plus the format metrics of the demo.

    ``greedy_boxed`` is the strict score: greedy answer correct *and* written in ``\\boxed{}``.
    Per-sample records go to ``out_dir/heldout/samples.jsonl.gz`` and ``out_dir`` becomes an evaluation
    folder (``summary.json``, ``report.md``, plots) as ``mathrl eval`` writes it, when ``out_dir`` is given
    (pass it on the main rank only). With ``dist`` of several ranks every rank generates and grades its share of
    the chunks, the graded records are all-gathered and every rank returns the same metrics (no rank
    waits in a collective while one rank evaluates everything).
    """
    import time

    settings = EvalSettings.from_config(cfg)
    part = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    t0 = time.time()
    res = evaluate_benchmark(rollout, problems, settings, name="heldout", out_dir=out_dir, log=lambda _m: None,
                             part=part, gather=all_gather_objects)
    if out_dir is not None:  # an evaluation folder like `mathrl eval`'s: --compare, --regrade and --series read it
        step = out_dir.name.removeprefix("step_")
        eval_report.write_report(out_dir, {
            "model": f"{cfg.model.name}, trained in {cfg.train.output_dir} to step {int(step) if step.isdigit() else step}",
            "command": "mathrl train (held-out evaluation during training)", "backend": type(rollout).__name__,
            "settings": settings.to_dict(), "benchmarks": {"heldout": res.summary},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t0)), "seconds": round(time.time() - t0, 1)})
    return heldout_metrics(res.summary, res.records)


def heldout_metrics(summary: dict, records: list[dict]) -> dict[str, float]:
    """The run's held-out figures from one benchmark's summary and its graded records: the metrics, the
    share of samples with a ``\\boxed{}`` answer, ``greedy_boxed`` (greedy correct *and* boxed), the mean
    length and the truncation rate (what the metrics log, ``summary.md`` and the console show)."""
    out = {k: float(v["value"]) for k, v in summary["metrics"].items()}
    samples = [s for r in records for s in r["samples"]]
    out["boxed_rate"] = sum("\\boxed" in s["text"] for s in samples) / len(samples)
    if records and all("greedy" in r for r in records):
        out["greedy_boxed"] = sum(bool(r["greedy"].get("correct")) and "\\boxed" in r["greedy"]["text"]
                                  for r in records) / len(records)
    out["length_mean"] = float(summary["mean_length"])
    out["truncation_rate"] = float(summary["truncation_rate"])
    return out


def main_only(dist: DistInfo, path: Path) -> Path | None:
    return path if dist.is_main else None


def plot_rewards(history: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:  # a minimal GPU image: the metrics log has the same numbers
        print(f"mathrl: matplotlib is not installed; {path.name} not drawn", file=sys.stderr, flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward/mean"] for h in history], marker="o", label="mean reward")
    # dynamic sampling filtered the groups (a run resumed from before the metric existed has it on later steps)
    sampled = [h for h in history if "sampling/accuracy_sampled" in h]
    ax.plot(steps, [h["reward/accuracy"] for h in history], marker=".",
            label="accuracy (trained groups)" if sampled else "accuracy (train samples)")
    if sampled:
        ax.plot([h["step"] for h in sampled], [h["sampling/accuracy_sampled"] for h in sampled], marker=".",
                label="accuracy (all sampled responses)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("mathrl GRPO: training reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def before_after_table(before: dict, after: dict) -> str:
    """The held-out table of ``summary.md`` and the console: one row per metric, three decimals."""
    lines = ["| metric | before | after |", "|---|---|---|"]
    for k in (after or before):
        b, a_ = before.get(k), after.get(k)
        lines.append(f"| {k} | {'' if b is None else f'{b:.3f}'} | {'' if a_ is None else f'{a_:.3f}'} |")
    return "\n".join(lines)


def write_report(out: Path, before: dict, after: dict) -> None:
    """``reward_curve.png`` and ``summary.md`` (held-out metrics before / after). A resumed run evaluated
    "before" in an earlier process: then the step-0 evaluation row of the metrics log is the column."""

    rows = read_metrics(out / "metrics.jsonl")
    history = [h for h in rows if "event" not in h]
    if not before:
        logged = [h for h in rows if h.get("event") == "eval" and h.get("step") == 0]
        before = {k: v for k, v in logged[-1].items() if k not in ("step", "event")} if logged else {}
    if history:
        plot_rewards(history, out / "reward_curve.png")
    if before or after:
        table = before_after_table(before, after)
        (out / "summary.md").write_text(table + "\n")
        print("\nHeld-out evaluation before and after training:\n" + table, flush=True)
    if history:
        print(f"\nreward curve: {out / 'reward_curve.png'}; metrics: {out / 'metrics.jsonl'}", flush=True)
