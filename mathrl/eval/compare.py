"""``mathrl eval --compare RUN_A RUN_B``: two evaluations side by side, with uncertainty.

For every benchmark present in both runs and every metric, the table shows A
and B with their 95% bootstrap intervals over problems, and the difference
B - A. When both runs evaluated the same problems (same ids) the difference
gets a *paired* bootstrap interval (problems resampled jointly, so per-problem
difficulty cancels) and ``p(B<=A)``, the share of resamples in which B is not
better; a gain whose interval excludes 0 is unlikely to be noise.

Every row is a test, so a table of several benchmarks and metrics is a family:
``Holm p`` is Holm's step-down adjustment of the row's ``p(B<=A)`` over all the
p-values of the comparison (``holm_family`` in compare.json; valid under any
dependence between the metrics, which read the same samples). Read a row's own
p only for the one metric chosen before the evaluation; claim any other row,
or several, by its Holm p.
"""

from __future__ import annotations

import json
from pathlib import Path

from mathrl.config import ConfigError
from mathrl.eval.metrics import holm, paired_bootstrap_diff
from mathrl.eval.report import load_summary, md_table, pct, pyplot
from mathrl.eval.runner import EvalSettings, per_problem_scores, read_records, samples_path

__all__ = ["compare_markdown", "compare_runs", "compare_summaries", "format_ci", "per_problem"]


def _settings(summary: dict):

    s = summary["settings"]
    return EvalSettings(**{**s, "ks": tuple(s["ks"]), "stop": tuple(s["stop"])})


def _per_problem(run_dir: Path, summary: dict, bench: str) -> dict[str, dict[str, float]] | None:

    path = samples_path(run_dir / bench)
    if not path.is_file():
        return None
    settings = _settings(summary)
    return {rec["id"]: per_problem_scores(rec, settings) for rec in read_records(path)}


def per_problem(run_dir: str | Path, bench: str | None = None) -> dict[str, dict[str, float]]:
    """The per-problem metric values (problem id -> {metric: value}) of a finished evaluation folder:
    its ``summary.json`` settings and ``<bench>/samples.jsonl.gz`` (``bench`` None: its only benchmark)."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{run_dir}: not a finished evaluation folder (summary.json: {exc})") from None
    if bench is None:
        if len(summary["benchmarks"]) != 1:
            raise ConfigError(f"{run_dir}: evaluated {', '.join(summary['benchmarks'])}; name one benchmark")
        (bench,) = summary["benchmarks"]
    scores = _per_problem(run_dir, summary, bench)
    if scores is None:
        raise ConfigError(f"{samples_path(run_dir / bench)}: not found (per-problem samples are needed for a paired "
                          "comparison)")
    return scores


def compare_summaries(a: dict, b: dict, dir_a: Path | None = None, dir_b: Path | None = None, *,
                      resamples: int = 2000, seed: int = 0) -> dict:
    """The comparison record (pure apart from reading the per-problem samples when folders are given)."""

    common = [name for name in a["benchmarks"] if name in b["benchmarks"]]
    if not common:
        raise ConfigError(f"the two runs share no benchmark (A: {', '.join(a['benchmarks'])}; "
                          f"B: {', '.join(b['benchmarks'])})")
    out = {"a": {"model": a["model"], "settings": a["settings"]},
           "b": {"model": b["model"], "settings": b["settings"]}, "benchmarks": {}}
    diff_settings = {k: (a["settings"].get(k), b["settings"].get(k)) for k in
                     ("n", "temperature", "top_p", "max_tokens", "template") if a["settings"].get(k) != b["settings"].get(k)}
    out["settings_differ"] = diff_settings
    for bench in common:
        ba, bb = a["benchmarks"][bench], b["benchmarks"][bench]
        pa = _per_problem(dir_a, a, bench) if dir_a else None
        pb = _per_problem(dir_b, b, bench) if dir_b else None
        # paired over the problems both runs scored (all of them when the sets are equal)
        shared = sorted(set(pa) & set(pb)) if pa is not None and pb is not None else []
        paired = bool(shared)
        rows = {}
        for metric in ba["metrics"]:
            if metric not in bb["metrics"]:
                continue
            ma, mb = ba["metrics"][metric], bb["metrics"][metric]
            row = {"a": ma["value"], "a_ci": ma.get("ci"), "b": mb["value"], "b_ci": mb.get("ci"),
                   "diff": mb["value"] - ma["value"], "paired": False}
            if paired:
                ids = shared
                if all(metric in pa[i] and metric in pb[i] for i in ids):
                    d = paired_bootstrap_diff([pa[i][metric] for i in ids], [pb[i][metric] for i in ids],
                                              resamples=resamples, seed=seed)
                    row.update({"diff": d["diff"], "diff_ci": [d["lo"], d["hi"]], "p_b_le_a": d["p_le_0"],
                                "paired": True})
            rows[metric] = row
        out["benchmarks"][bench] = {"problems": [ba["problems"], bb["problems"]], "paired": paired,
                                    "shared": len(shared),
                                    "metrics": rows,
                                    "mean_length": [ba["mean_length"], bb["mean_length"]],
                                    "truncation_rate": [ba["truncation_rate"], bb["truncation_rate"]]}
    tested = [r for bench in out["benchmarks"].values() for r in bench["metrics"].values() if "p_b_le_a" in r]
    for r, adjusted in zip(tested, holm([r["p_b_le_a"] for r in tested])):
        r["p_holm"] = adjusted
    out["holm_family"] = len(tested)
    return out


def format_ci(v, ci) -> str:
    """A value and its interval in %, as the comparison prints them: ``2.4 [1.6, 3.2]``."""

    return f"{pct(v)} [{pct(ci[0])}, {pct(ci[1])}]" if ci else pct(v)


def _rows(cmp: dict) -> tuple[list[str], list[list[str]]]:
    header = ["benchmark", "metric", "A", "B", "B - A", "95% CI of B - A", "p(B<=A)", "Holm p"]
    rows = []
    for bench, b in cmp["benchmarks"].items():
        for metric, r in b["metrics"].items():
            ci = r.get("diff_ci")
            rows.append([bench, metric, format_ci(r["a"], r["a_ci"]), format_ci(r["b"], r["b_ci"]),
                         f"{100 * r['diff']:+.1f}",
                         f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "unpaired",
                         f"{r['p_b_le_a']:.3f}" if "p_b_le_a" in r else "-",
                         f"{r['p_holm']:.3f}" if "p_holm" in r else "-"])
        rows.append([bench, "mean len", f"{b['mean_length'][0]:.1f}", f"{b['mean_length'][1]:.1f}",
                     f"{b['mean_length'][1] - b['mean_length'][0]:+.1f}", "", "", ""])
    return header, rows


def _holm_note(cmp: dict) -> str:
    m = cmp.get("holm_family", 0)
    return (f"Holm p: p(B<=A) adjusted over the {m} p-values of this comparison (Holm 1979); read a row's own "
            "p only for the one metric chosen before the evaluation" if m > 1 else "")


def compare_markdown(cmp: dict, run_a, run_b) -> str:
    """``compare.md``: the two models, their folders, the table and, for several tests, what Holm p is."""
    header, rows = _rows(cmp)
    note = _holm_note(cmp)
    return (f"# Comparison\n\n- A: `{cmp['a']['model']}` ({run_a})\n- B: `{cmp['b']['model']}` ({run_b})\n\n"
            f"{md_table(header, rows)}\n" + (f"\n{note}.\n" if note else ""))


def format_compare(cmp: dict) -> str:
    header, rows = _rows(cmp)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [f"A = {cmp['a']['model']}", f"B = {cmp['b']['model']}"]
    if cmp["settings_differ"]:
        lines.append("warning: the runs used different settings: " + ", ".join(
            f"{k} {va} vs {vb}" for k, (va, vb) in cmp["settings_differ"].items()))
    for bench, b in cmp["benchmarks"].items():
        if b["paired"] and b["shared"] < max(b["problems"]):
            lines.append(f"note: {bench}: A scored {b['problems'][0]} problems, B {b['problems'][1]}; B - A and its "
                         f"interval are paired over the {b['shared']} problems both scored")
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("-" * len(lines[-1]))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("metrics in %; A and B with 95% bootstrap intervals over problems; B - A with a paired bootstrap "
                 "interval when both runs scored the same problems")
    if _holm_note(cmp):
        lines.append(_holm_note(cmp))
    return "\n".join(lines)


def _plot(path: Path, cmp: dict) -> None:

    plt = pyplot()
    labels, va, vb, ea, eb = [], [], [], [], []
    for bench, b in cmp["benchmarks"].items():
        for metric, r in b["metrics"].items():
            labels.append(f"{bench}\n{metric}")
            va.append(100 * r["a"])
            vb.append(100 * r["b"])
            for vals, ci, v in ((ea, r["a_ci"], r["a"]), (eb, r["b_ci"], r["b"])):
                ci = ci or [v, v]
                vals.append((100 * (v - ci[0]), 100 * (ci[1] - v)))
    x = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels)), 4))
    w = 0.38
    ax.bar([i - w / 2 for i in x], va, w, yerr=list(zip(*ea)), capsize=2, label=f"A {Path(cmp['a']['model']).name}")
    ax.bar([i + w / 2 for i in x], vb, w, yerr=list(zip(*eb)), capsize=2, label=f"B {Path(cmp['b']['model']).name}")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compare_runs(run_a: str | Path, run_b: str | Path, *, out_dir: str | Path | None = None) -> dict:
    """Compare two evaluation folders; print the table; write compare.json/.md/.png to ``out_dir``
    (default ``<run_b>/compare``)."""

    run_a, run_b = Path(run_a), Path(run_b)
    try:
        a, b = load_summary(run_a), load_summary(run_b)
    except ValueError as exc:
        raise ConfigError(f"--compare: {exc}") from None
    cmp = compare_summaries(a, b, run_a, run_b)
    cmp["a"]["folder"], cmp["b"]["folder"] = str(run_a), str(run_b)
    out = Path(out_dir) if out_dir else run_b / "compare"
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(cmp, indent=2) + "\n")
    (out / "compare.md").write_text(compare_markdown(cmp, run_a, run_b))
    _plot(out / "compare.png", cmp)
    print(format_compare(cmp))
    print(f"\nwrote {out}/compare.json, compare.md, compare.png")
    return cmp
