"""Reports of an evaluation run: ``summary.json``, ``report.md``, PNG plots and the console table.

Run folder layout (written by ``mathrl eval``)::

    <out>/summary.json          settings, model, per-benchmark metrics with CIs and breakdowns
    <out>/report.md             the tables in markdown
    <out>/pass_at_k.png         pass@k vs k (one line per benchmark)
    <out>/maj_at_k.png          maj@k vs k
    <out>/accuracy_by_level.png pass@1 / greedy per level (benchmarks with levels)
    <out>/<benchmark>/samples.jsonl.gz  one record per problem, gzip (every sample, extracted answer, verdict)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["format_table", "markdown_report", "write_summary", "write_plots", "write_report", "load_summary",
           "metric_names", "pct"]


def pct(x: float | None, digits: int = 1) -> str:
    """``0.4375 -> '43.8'``; missing/NaN -> ``'-'``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.{digits}f}"


def metric_names(summary: dict) -> list[str]:
    """Metric columns in display order (greedy, pass@k..., maj@k...) over all benchmarks."""
    seen: list[str] = []
    for b in summary["benchmarks"].values():
        for name in b["metrics"]:
            if name not in seen:
                seen.append(name)

    def key(n: str):
        if n == "greedy":
            return (0, 0)
        kind, _, k = n.partition("@")
        return (1 if kind == "pass" else 2, int(k))
    return sorted(seen, key=key)


def _rows(summary: dict, with_ci: bool) -> tuple[list[str], list[list[str]]]:
    names = metric_names(summary)
    header = ["benchmark", "problems"] + names + ["mean len", "trunc %", "no answer %"]
    rows = []
    for bname, b in summary["benchmarks"].items():
        row = [bname, str(b["problems"])]
        for n in names:
            m = b["metrics"].get(n)
            if m is None:
                row.append("-")
            elif with_ci and "ci" in m:
                row.append(f"{pct(m['value'])} [{pct(m['ci'][0])}, {pct(m['ci'][1])}]")
            else:
                row.append(pct(m["value"]))
        row += [f"{b['mean_length']:.1f}", pct(b["truncation_rate"]), pct(b["no_answer_rate"])]
        rows.append(row)
    return header, rows


def format_table(summary: dict) -> str:
    """A plain-text table for the console (metrics in %, 95% bootstrap interval of pass@1 and greedy)."""
    header, rows = _rows(summary, with_ci=False)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    level = int(round(100 * summary["settings"]["ci_level"]))
    notes = []
    for bname, b in summary["benchmarks"].items():
        parts = []
        for n in ("greedy", "pass@1"):
            m = b["metrics"].get(n)
            if m and "ci" in m:
                parts.append(f"{n} {pct(m['value'])} [{pct(m['ci'][0])}, {pct(m['ci'][1])}]")
        if parts:
            notes.append(f"  {bname}: " + "; ".join(parts))
    s = summary["settings"]
    out.append("")
    out.append(f"metrics in %; n={s['n']} samples/problem at T={s['temperature']}, top_p={s['top_p']}, "
               f"max_tokens={s['max_tokens']}; pass@k unbiased (Chen et al. 2021); maj@k expected over "
               f"k-subsets, answers grouped by verified equivalence")
    if notes:
        out.append(f"{level}% bootstrap intervals over problems:")
        out.extend(notes)
    return "\n".join(out)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown_report(summary: dict) -> str:
    """The markdown report: settings, main table (with intervals) and the per-level/subject breakdowns."""
    s = summary["settings"]
    lines = [f"# Evaluation of `{summary['model']}`", ""]
    lines.append(f"- command: `{summary.get('command', '')}`")
    lines.append(f"- sampling: n={s['n']}, temperature={s['temperature']}, top_p={s['top_p']}, "
                 f"top_k={s['top_k']}, max_tokens={s['max_tokens']}, seed={s['seed']}; template `{s['template']}`; "
                 f"backend {summary.get('backend', '?')}")
    lines.append("- estimators: pass@k = mean over problems of 1 - C(n-c,k)/C(n,k) (Chen et al. 2021); maj@k = "
                 "expected majority-vote accuracy over k-subsets, answers grouped by verified equivalence, "
                 "ties shared, unanswered samples abstain; greedy = temperature 0")
    level = int(round(100 * s["ci_level"]))
    lines.append(f"- intervals: {level}% percentile bootstrap over problems ({s['ci_resamples']} resamples, "
                 f"seed {s['seed']})")
    lines += ["", "## Results (%)", ""]
    header, rows = _rows(summary, with_ci=True)
    lines.append(md_table(header, rows))
    for bname, b in summary["benchmarks"].items():
        for key, groups in b.get("breakdown", {}).items():
            if not groups:
                continue
            names = [n for n in metric_names({"benchmarks": {bname: b}})]
            hdr = [key, "problems"] + names + ["mean len", "trunc %"]
            rws = []
            for g, agg in groups.items():
                rws.append([g, str(agg["problems"])] + [pct(agg["metrics"].get(n, {}).get("value")) for n in names]
                           + [f"{agg['mean_length']:.1f}", pct(agg["truncation_rate"])])
            lines += ["", f"## {bname} by {key} (%)", "", md_table(hdr, rws)]
    lines.append("")
    return "\n".join(lines)


def _json_safe(obj: Any) -> Any:
    """NaN/inf (e.g. the mean length of correct samples when none is correct) -> null: strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_summary(out_dir: str | Path, summary: dict) -> Path:
    """Write ``summary.json`` (strict JSON: non-finite numbers become null), atomically."""
    p = Path(out_dir) / "summary.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name("summary.json.tmp")
    tmp.write_text(json.dumps(_json_safe(summary), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(p)
    return p


def load_summary(run_dir: str | Path) -> dict:
    """Read ``<run_dir>/summary.json`` (a ValueError names the folder when it is missing)."""
    p = Path(run_dir) / "summary.json"
    if not p.is_file():
        raise ValueError(f"{run_dir} is not an evaluation run folder (no summary.json)")
    return json.loads(p.read_text())


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _curve(summary: dict, kind: str) -> dict[str, tuple[list[int], list[float], list[tuple[float, float]]]]:
    out = {}
    for bname, b in summary["benchmarks"].items():
        pts = []
        for name, m in b["metrics"].items():
            if name.startswith(kind + "@"):
                pts.append((int(name.split("@")[1]), m["value"], tuple(m.get("ci", (m["value"], m["value"])))))
        if kind == "maj" and "pass@1" in b["metrics"]:  # maj@1 = pass@1 by definition
            m = b["metrics"]["pass@1"]
            pts.append((1, m["value"], tuple(m.get("ci", (m["value"], m["value"])))))
        pts.sort()
        if pts:
            out[bname] = ([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts])
    return out


def write_plots(out_dir: str | Path, summary: dict) -> list[Path]:
    """pass@k vs k, maj@k vs k (log-2 k axis, shaded CI) and per-level accuracy; returns the PNG paths
    (none, with a note, where matplotlib is not installed: summary.json and report.md hold the numbers)."""
    try:
        plt = pyplot()
    except ImportError:
        import sys

        print(f"mathrl: matplotlib is not installed; no plots in {out_dir} (summary.json and report.md have the "
              "numbers)", file=sys.stderr, flush=True)
        return []
    out_dir = Path(out_dir)
    written = []
    for kind, fname, title in (("pass", "pass_at_k.png", "pass@k (unbiased)"),
                               ("maj", "maj_at_k.png", "maj@k (majority vote)")):
        curves = _curve(summary, kind)
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for bname, (ks, vals, cis) in curves.items():
            ax.plot(ks, [100 * v for v in vals], marker="o", label=bname)
            ax.fill_between(ks, [100 * c[0] for c in cis], [100 * c[1] for c in cis], alpha=0.15)
        ax.set_xscale("log", base=2)
        allk = sorted({k for ks, _, _ in curves.values() for k in ks})
        ax.set_xticks(allk)
        ax.set_xticklabels([str(k) for k in allk])
        ax.set_xlabel("k")
        ax.set_ylabel("%")
        ax.set_ylim(0, 100)
        ax.set_title(f"{title}: {summary['model']}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=100)
        plt.close(fig)
        written.append(out_dir / fname)
    with_levels = {b: v["breakdown"]["level"] for b, v in summary["benchmarks"].items()
                   if v.get("breakdown", {}).get("level")}
    if with_levels:
        fig, ax = plt.subplots(figsize=(6, 4))
        for bname, groups in with_levels.items():
            levels = list(groups)
            for metric, style in (("pass@1", "-o"), ("greedy", "--s")):
                vals = [groups[g]["metrics"].get(metric, {}).get("value") for g in levels]
                if all(v is not None for v in vals):
                    ax.plot(levels, [100 * v for v in vals], style, label=f"{bname} {metric}")
        ax.set_xlabel("level")
        ax.set_ylabel("%")
        ax.set_ylim(0, 100)
        ax.set_title(f"accuracy per level: {summary['model']}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "accuracy_by_level.png", dpi=100)
        plt.close(fig)
        written.append(out_dir / "accuracy_by_level.png")
    return written


def write_report(out_dir: str | Path, summary: dict) -> dict[str, Any]:
    """Write summary.json, report.md and the plots; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = {"summary": str(write_summary(out_dir, summary))}
    md = out_dir / "report.md"
    md.write_text(markdown_report(summary))
    paths["markdown"] = str(md)
    paths["plots"] = [str(p) for p in write_plots(out_dir, summary)]
    return paths
