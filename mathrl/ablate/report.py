"""The study report: one table (markdown + JSON) and two figures.

* ``report.md`` / ``report.json`` -- per run: method, steps, held-out greedy accuracy and
  pass@1 / pass@K / maj@K before and after, training-sample accuracy at the end, wall time
  (training, evaluation) and sampled response tokens.
* ``accuracy_curve.png`` -- left: accuracy of the policy's own samples on each step's training
  problems (``reward/accuracy`` of ``metrics.jsonl``; offline RFT trains on the initial model's
  samples, so its line is the initial model's accuracy); right: held-out accuracy at the evaluated
  checkpoints (step 0 = the initial model; every ``study.curve_every`` steps; the last step).
* ``maj_pass_at_k.png`` -- Maj@K and Pass@K against K before (the initial model) and after each
  run, the form of DeepSeekMath's Figure 7 (Shao et al. 2024): RL that only re-ranks the model's
  existing answers raises Maj@K and leaves Pass@K at large K unchanged.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

from mathrl.ablate.study import HELDOUT_EVAL, PRM_FOLDER

__all__ = ["collect", "markdown_table", "prm_section", "write_study_report", "plot_accuracy_curves", "plot_maj_pass", "plot_series"]


def _pct(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.1f}"


def _num(x, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ks(values: dict, kind: str) -> list[int]:
    return sorted(int(k.split("@")[1]) for k in values if k.startswith(kind + "@"))


def collect(study) -> dict:
    """Everything the report shows: DONE records of the complete runs, names of the pending ones."""
    from mathrl.ablate.study import DONE
    from mathrl.train.metrics import read_metrics

    runs, pending = [], []
    for r in study.runs:
        done = study.out / r.name / DONE
        if not done.is_file():
            pending.append(r.name)
            continue
        rec = json.loads(done.read_text())
        rec["group"] = r.group  # the seeds of one configuration share a group (plots average them)
        mpath = study.out / r.name / "metrics.jsonl"
        steps = [m for m in read_metrics(mpath) if "event" not in m] if mpath.is_file() else []
        rec["train_curve"] = [[m["step"], m["reward/accuracy"]] for m in steps if "reward/accuracy" in m]
        last = rec["train_curve"][-max(1, len(rec["train_curve"]) // 5):]
        rec["train_acc_end"] = sum(a for _, a in last) / len(last) if last else None
        times = sorted(m["time/step"] for m in steps if "time/step" in m)
        rec["step_s_median"] = times[len(times) // 2] if times else None
        rss = [m["sys/rss_mb"] for m in steps if "sys/rss_mb" in m]
        rec["rss_gb_max"] = max(rss) / 1024 if rss else None
        runs.append(rec)
    data = {"study": study.name, "file": str(study.path), "out": str(study.out), "description": study.description,
            "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": runs, "pending": pending}
    prm_eval = study.out / PRM_FOLDER / HELDOUT_EVAL
    if prm_eval.is_file():  # study.prm.heldout: the initial PRM measured on held-out problems
        data["prm_heldout"] = {k: v for k, v in json.loads(prm_eval.read_text()).items() if k != "per_problem"}
    return data


def prm_section(data: dict) -> list[str]:
    """The initial PRM's held-out figures (``study.prm.heldout``), or nothing."""
    e = data.get("prm_heldout")
    if not e:
        return []
    d = e["best_minus_majority"]
    ci = "[{}, {}]".format(*(_pct(x) for x in e["best_of_n_ci"]))
    cm = "[{}, {}]".format(*(_pct(x) for x in e["majority_ci"]))
    return ["", f"## The initial PRM on {e['problems']:.0f} held-out problems ({PRM_FOLDER}/{HELDOUT_EVAL})", "",
            "| step accuracy | step AUC | steps | best-of-N by the weakest step | majority vote | random response | "
            "best-of-N - majority (95% paired bootstrap) | smallest detectable (80% power) |",
            "|---|---|---|---|---|---|---|---|",
            f"| {_pct(e['step_accuracy'])} | {e['step_auc']:.3f} | {e['steps']:.0f} | {_pct(e['best_of_n'])} {ci} | "
            f"{_pct(e['majority'])} {cm} | {_pct(e['random'])} | {100 * d['diff']:+.1f} [{100 * d['lo']:+.1f}, "
            f"{100 * d['hi']:+.1f}] | {100 * d['mde']:.1f} |"]


def _headline(values: dict) -> tuple[str, float | None]:
    if "greedy" in values:
        return "greedy", values["greedy"]
    return "pass@1", values.get("pass@1")


def markdown_table(data: dict) -> str:
    runs = data["runs"]
    if not runs:
        return "(no run is complete yet)"
    kmax = max((max(_ks(r["after"], "pass"), default=1) for r in runs), default=1)
    header = ["run", "method", "steps", "acc before", "acc after", "pass@1 before", "pass@1 after",
              f"pass@{kmax} before", f"pass@{kmax} after", f"maj@{kmax} before", f"maj@{kmax} after",
              "train acc (end)", "train s", "s/step", "RSS GB", "eval s", "tokens"]
    rows = []
    for r in runs:
        b, a = r["before"], r["after"]
        rows.append([r["name"], r["method"], str(r["steps"]), _pct(_headline(b)[1]), _pct(_headline(a)[1]),
                     _pct(b.get("pass@1")), _pct(a.get("pass@1")), _pct(b.get(f"pass@{kmax}")),
                     _pct(a.get(f"pass@{kmax}")), _pct(b.get(f"maj@{kmax}")), _pct(a.get(f"maj@{kmax}")),
                     _pct(r.get("train_acc_end")), f"{r['wall_train_s']:.0f}", _num(r.get("step_s_median"), 1),
                     _num(r.get("rss_gb_max"), 1), f"{r['wall_eval_s']:.0f}", f"{int(r['tokens'])}"])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _notes(data: dict) -> list[str]:
    runs = data["runs"]
    notes = []
    if runs:
        s = runs[0]["eval_settings"]
        acc = _headline(runs[0]["after"])[0]
        notes.append(f"Held-out set: {runs[0]['eval_problems']} problems; n = {s['n']} samples per problem at "
                     f"T = {s['temperature']}, top_p = {s['top_p']}, max_tokens = {s['max_tokens']}. "
                     f"'acc' = {acc} accuracy; pass@k unbiased (Chen et al. 2021); maj@k = expected "
                     "majority-vote accuracy of k samples. 'train acc (end)' = accuracy of the policy's "
                     "own samples over the last fifth of the steps (offline RFT: the initial model's samples). "
                     "'tokens' = response tokens sampled for training (rank 0); 's/step' = median step time; 'RSS GB' = "
                     "the trainer process's largest resident memory at a step end (rank 0). Accuracies in %.")
    if data["pending"]:
        notes.append(f"Not complete yet (not in the table): {', '.join(data['pending'])}.")
    return notes


def _mean_points(curves: list[list]) -> list[tuple[int, float]]:
    """Per step, the mean over the curves (``[step, value]`` pairs) that all have a value at that step (seeds
    of one group)."""
    maps = [dict(c) for c in curves if c]
    if not maps:
        return []
    steps = sorted(set.intersection(*(set(m) for m in maps)))
    return [(s, sum(m[s] for m in maps) / len(maps)) for s in steps]


def plot_series(data: dict) -> list[dict]:
    """One series per group of runs (the seeds of one configuration, ``RunSpec.group``; a run without a
    group is its own), in the order the groups first appear: ``label`` (the group and how many seeds are
    averaged), ``color`` (RGBA, distinct for up to 20 series), ``method``, ``train_curve`` and ``curve`` (per step,
    the mean over the seeds that have that step) and ``after`` (per metric, the mean over the seeds: with
    every seed evaluated on the same problems this is the pooled accuracy the comparisons use)."""
    import matplotlib

    groups: dict[str, list[dict]] = {}
    for r in data["runs"]:
        groups.setdefault(r.get("group") or r["name"], []).append(r)
    palette = matplotlib.colormaps["tab10" if len(groups) <= 10 else "tab20"]
    out = []
    for i, (g, recs) in enumerate(groups.items()):
        metrics = set.intersection(*(set(r["after"]) for r in recs))
        held = [[(s, v) for s, v in ((p["step"], _headline(p)[1]) for p in r["curve"]) if v is not None]
                for r in recs]
        out.append({"label": g if len(recs) == 1 else f"{g} (mean of {len(recs)} seeds)",
                    "color": palette(i % palette.N), "method": recs[0]["method"],
                    "train_curve": _mean_points([r["train_curve"] for r in recs]),
                    "curve": _mean_points(held),
                    "after": {m: sum(r["after"][m] for r in recs) / len(recs) for m in sorted(metrics)}})
    return out


def _fit_ylim(ax, values: list[float]) -> None:
    """Y range fitted to the data (accuracies of a few percent are not drawn on a 0-100 axis)."""
    if values:
        lo, hi = min(values), max(values)
        pad = max(0.5, 0.08 * (hi - lo))
        ax.set_ylim(max(-1.0, lo - pad), min(101.0, hi + pad))


def _legend_outside(fig, ax) -> None:
    """One legend for the figure, right of the axes, so it covers no line."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)


def plot_accuracy_curves(data: dict, path: Path) -> Path:
    """Training-sample accuracy (left) and held-out accuracy at the evaluated checkpoints (right), one line
    per group of seeds (:func:`plot_series`)."""
    from mathrl.eval.report import pyplot

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    series = plot_series(data)
    left: list[float] = []
    right: list[float] = []
    for s in series:
        if s["train_curve"]:
            xs, ys = zip(*((x, 100 * y) for x, y in s["train_curve"]))
            left += ys
            ax1.plot(xs, ys, color=s["color"], ls="--" if s["method"] == "rft" else "-",
                     marker="." if len(xs) < 40 else None, label=s["label"])
        if s["curve"]:
            xs, ys = zip(*((x, 100 * y) for x, y in s["curve"]))
            right += ys
            ax2.plot(xs, ys, color=s["color"], marker="o", label=s["label"])
    ax1.set_title("accuracy of the policy's samples on the training batch", fontsize=9)
    metric = _headline(data["runs"][0]["after"])[0] if data["runs"] else "greedy"
    ax2.set_title(f"held-out accuracy ({metric}) at evaluated checkpoints", fontsize=9)
    for ax, values in ((ax1, left), (ax2, right)):
        ax.set_xlabel("training step")
        ax.set_ylabel("%")
        _fit_ylim(ax, values)
        ax.grid(alpha=0.3)
    _legend_outside(fig, ax1)
    fig.suptitle(f"study {data['study']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_maj_pass(data: dict, path: Path) -> Path:
    """Maj@K (left) and Pass@K (right) vs K: the initial model (black, dashed) and each group of runs after
    training (seeds averaged, :func:`plot_series`)."""
    from mathrl.eval.report import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    baselines: dict[str, dict] = {}
    for r in data["runs"]:
        baselines.setdefault(r["baseline"], r["before"])
    series = plot_series(data)
    allk: set[int] = set()
    for ax, kind, title in ((axes[0], "maj", "Maj@K"), (axes[1], "pass", "Pass@K")):
        def curve(values: dict) -> tuple[list[int], list[float]]:
            ks = _ks(values, kind)
            if kind == "maj" and "pass@1" in values:  # maj@1 = pass@1
                ks = sorted(set(ks) | {1})
            vals = [values.get(f"{kind}@{k}", values.get("pass@1") if k == 1 else None) for k in ks]
            return ks, vals

        for j, (key, before) in enumerate(baselines.items()):
            ks, vals = curve(before)
            allk.update(ks)
            label = "before (initial model)" if len(baselines) == 1 else f"before (baseline {key})"
            ax.plot(ks, [100 * v for v in vals], "k--", marker="s", alpha=0.8 - 0.2 * j, label=label)
        for s in series:
            ks, vals = curve(s["after"])
            allk.update(ks)
            ax.plot(ks, [100 * v for v in vals], color=s["color"], marker="o", label=f"{s['label']}, after")
        ax.set_xscale("log", base=2)
        if allk:
            ax.set_xticks(sorted(allk))
            ax.set_xticklabels([str(k) for k in sorted(allk)])
        ax.set_xlabel("K: samples per problem")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    _legend_outside(fig, axes[0])
    fig.suptitle(f"study {data['study']}: Maj@K and Pass@K before and after training", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def _comparisons(study, data: dict, log: Callable[[str], None]) -> list[str]:
    """The report's section on groups (seeds pooled), the declared contrasts and the exploratory paired
    comparisons; ``data["comparisons"]``."""
    from mathrl.ablate.compare import comparison_table, contrast_table, group_table, study_comparisons
    from mathrl.ablate.study import MIN_PASS1_SAMPLES

    try:
        comp = study_comparisons(study, data)
    except (OSError, ValueError) as exc:  # e.g. an evaluation folder without its samples
        log(f"[ablate] comparisons skipped: {exc}")
        return ["", f"Comparisons not computed: {exc}"]
    data["comparisons"] = comp
    if not comp["groups"]:
        return []
    out = ["", "## Groups (seeds pooled) and paired comparisons", "",
           "Each group's held-out values after training: the mean over its seeds, each seed's value and the "
           "seed range (max - min). The tests below resample problems only, so they hold no seed-to-seed "
           "variation beyond the seeds run; 'seeds A/B' flags comparisons of groups with unequal seed counts "
           "(a one-seed row against pooled seeds carries a whole seed's noise that its test does not see).", "",
           group_table(comp), ""]
    n = min((r["eval_settings"].get("n", 0) for r in data["runs"]), default=0)
    if comp["contrasts"]:
        m = len(comp["contrasts"])
        out += ["### Declared contrasts (confirmatory)", "",
                f"Primary metric `{comp['primary_metric']}`, the {m} contrast(s) of `study.contrasts`, declared in "
                f"the study file. p: two-sided paired sign-flip permutation test over the problems (B - A per "
                f"problem; a group's score is the mean over its seeds, 'before' the mean over the same seeds' "
                f"evaluations of the initial model). Holm p: Holm's step-down adjustment over the {m}; 'survives' "
                f"= Holm p <= {comp['family_alpha']}. MDE: the smallest difference (points) the contrast detects with "
                f"{comp['power']:.0%} power at the per-contrast alpha {comp['family_alpha']}/{m} of Holm's first "
                "step, from the standard deviation of its per-problem differences; a contrast that does not "
                "survive reads 'no difference larger than' its MDE.", "", contrast_table(comp), ""]
    else:
        out += ["No primary metric and contrasts were declared (`study.primary_metric`, `study.contrasts`): "
                "every comparison below is exploratory.", ""]
    out += ["### Exploratory comparisons (not corrected for multiple testing)", "",
            f"Paired bootstrap over the held-out problems ({comp['resamples']} resamples); 'excludes 0' = the 95% "
            "interval of B - A does not contain 0; p: the two-sided permutation test, uncorrected; MDE at alpha "
            "0.05 and 80% power. With this many rows some intervals exclude 0 by chance: read them as leads, "
            "not findings. Rows 'maj gain - pass gain': (maj@K after - before) - (pass@K after - before) per "
            "problem."]
    if 0 < n < MIN_PASS1_SAMPLES:
        out[-1] += (f" pass@1 is estimated from n = {n} samples per problem here (fewer than "
                    f"{MIN_PASS1_SAMPLES}): a noisy estimate, exploratory only.")
    return out + ["", comparison_table(comp)]


def write_study_report(study, *, log: Callable[[str], None] = print) -> dict:
    """Write ``report.md``, ``report.json``, ``accuracy_curve.png`` and ``maj_pass_at_k.png``."""
    out = Path(study.out)
    out.mkdir(parents=True, exist_ok=True)
    data = collect(study)
    table = markdown_table(data)
    md = [f"# Ablation study: {data['study']}", ""]
    if data["description"]:
        md += [data["description"].strip(), ""]
    md += [table, ""] + [f"- {n}" for n in _notes(data)]
    md += _comparisons(study, data, log)
    md += prm_section(data)
    md += ["", "![accuracy over training](accuracy_curve.png)", "", "![Maj@K and Pass@K](maj_pass_at_k.png)", ""]
    (out / "report.md").write_text("\n".join(md))
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    data["paths"] = {"markdown": str(out / "report.md"), "json": str(out / "report.json"),
                     "accuracy_curve": str(plot_accuracy_curves(data, out / "accuracy_curve.png")),
                     "maj_pass_at_k": str(plot_maj_pass(data, out / "maj_pass_at_k.png"))}
    print(table)
    log(f"[ablate] wrote {out / 'report.md'}, report.json, accuracy_curve.png, maj_pass_at_k.png")
    return data
