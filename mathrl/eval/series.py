"""Checkpoint series (evaluate every checkpoint of a training run) and re-grading of saved runs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

from mathrl.config import ConfigError
from mathrl.eval.evaluate import evaluate_model, settings_from_config
from mathrl.eval.report import format_table, load_summary, pct, pyplot, write_report
from mathrl.eval.runner import EvalSettings, read_records, regrade_records, samples_path, summarize, write_records

__all__ = ["find_checkpoints", "evaluate_series", "series_table", "write_series_plot", "regrade_run"]

_STEP_RE = re.compile(r"^(?:step|checkpoint|global_step|ckpt)[_-]?(\d+)$")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _model_folder(p: Path) -> Path | None:
    for cand in (p / "policy", p):
        if (cand / "config.json").is_file():
            return cand
    return None


def find_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, model folder)`` of every checkpoint under a training run, oldest first.

    Looks at ``<run>/checkpoints/*`` and ``<run>/*`` for folders named
    ``step_000010`` (mathrl's layout), ``checkpoint-10``, ``global_step10`` or
    ``ckpt_10`` holding a Hugging Face model (``config.json``) directly or in
    ``policy/``. Temporary (incomplete) folders such as ``.tmp-step_000010``
    do not match.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"--series {run_dir}: not a folder")
    found: dict[int, Path] = {}
    for root in (run_dir / "checkpoints", run_dir):
        if not root.is_dir():
            continue
        for p in sorted(root.iterdir()):
            m = _STEP_RE.match(p.name)
            if not (m and p.is_dir()):
                continue
            model = _model_folder(p)
            if model is not None:
                found.setdefault(int(m.group(1)), model)
    return sorted(found.items())


def evaluate_series(run_dir: Path, cfg, load_sets: Callable[[], list], *, out_dir: Path | None = None,
                    command: str = "", top_k: int | None = None, include_base: bool = True,
                    log=_log) -> dict:
    """Evaluate every checkpoint of ``run_dir`` (and the base model as step 0) on the same sets.

    Each model's results go to ``<out>/step_<N>/`` (a normal evaluation
    folder); a step whose folder already holds a ``summary.json`` with the same
    settings is not evaluated again, so an interrupted series resumes. Writes
    ``<out>/series.json``, ``series.md`` and ``series.png`` (metrics vs step).
    The base model is ``model.name`` of ``<run>/config.yaml`` when present,
    else of the given config.
    """
    import yaml


    ckpts = find_checkpoints(run_dir)
    models: list[tuple[int, str]] = [(s, str(p)) for s, p in ckpts]
    if include_base and not any(s == 0 for s, _ in models):
        base = cfg.model.name
        run_cfg = run_dir / "config.yaml"
        if run_cfg.is_file():
            try:
                base = (yaml.safe_load(run_cfg.read_text()) or {}).get("model", {}).get("name", base)
            except yaml.YAMLError:
                pass
        models.insert(0, (0, base))
    if not ckpts:
        raise ConfigError(f"--series {run_dir}: no checkpoints found (expected {run_dir}/checkpoints/step_NNNNNN/"
                          "policy/ folders with config.json)")
    out_dir = out_dir or (run_dir / "eval_series")
    sets = load_sets()
    settings = settings_from_config(cfg, top_k).to_dict()
    points = []
    for step, model in models:
        sub = out_dir / f"step_{step:06d}"
        summary = None
        if (sub / "summary.json").is_file():
            old = load_summary(sub)
            if old.get("settings") == settings and set(old.get("benchmarks", {})) == {n for n, _ in sets} \
                    and old.get("model") == model:
                log(f"[series] step {step}: reusing {sub}")
                summary = old
        if summary is None:
            log(f"[series] step {step}: evaluating {model}")
            summary = evaluate_model(cfg, sets, sub, model_spec=model, command=command, top_k=top_k,
                                     extra={"step": step}, log=log)
        points.append({"step": step, "model": model, "folder": str(sub), "benchmarks": {
            b: {name: m["value"] for name, m in v["metrics"].items()} | {"mean_length": v["mean_length"]}
            for b, v in summary["benchmarks"].items()}})
    series = {"run": str(run_dir), "settings": settings, "points": points}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "series.json").write_text(json.dumps(series, indent=2) + "\n")
    (out_dir / "series.md").write_text(series_table(series, markdown=True) + "\n")
    write_series_plot(out_dir / "series.png", series)
    print(series_table(series))
    print(f"\nwrote {out_dir}/series.json, series.md, series.png")
    return series


def series_table(series: dict, markdown: bool = False) -> str:
    """One row per (step, benchmark) with every metric in %."""

    names: list[str] = []
    for pt in series["points"]:
        for vals in pt["benchmarks"].values():
            for n in vals:
                if n != "mean_length" and n not in names:
                    names.append(n)
    header = ["step", "benchmark"] + names + ["mean len"]
    rows = []
    for pt in series["points"]:
        for b, vals in pt["benchmarks"].items():
            rows.append([str(pt["step"]), b] + [pct(vals.get(n)) for n in names] + [f"{vals['mean_length']:.1f}"])
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
                         + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def write_series_plot(path: Path, series: dict) -> Path:
    """Each metric of each benchmark against the training step."""

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    benches = sorted({b for pt in series["points"] for b in pt["benchmarks"]})
    for b in benches:
        metrics = []
        for pt in series["points"]:
            for n in pt["benchmarks"].get(b, {}):
                if n != "mean_length" and n not in metrics:
                    metrics.append(n)
        for n in metrics:
            xs = [pt["step"] for pt in series["points"] if n in pt["benchmarks"].get(b, {})]
            ys = [100 * pt["benchmarks"][b][n] for pt in series["points"] if n in pt["benchmarks"].get(b, {})]
            ax.plot(xs, ys, marker="o", label=f"{b} {n}")
    ax.set_xlabel("training step")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"evaluation over training: {series['run']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def regrade_run(run_dir: Path, *, grader=None, log=_log) -> dict:
    """Grade the saved ``samples.jsonl.gz`` of an evaluation folder again and rewrite its reports."""

    try:
        summary = load_summary(run_dir)
    except ValueError as exc:
        raise ConfigError(f"--regrade: {exc}") from None
    settings = EvalSettings(**{**summary["settings"], "ks": tuple(summary["settings"]["ks"]),
                               "stop": tuple(summary["settings"]["stop"])})
    for name in summary["benchmarks"]:
        path = samples_path(run_dir / name)
        if not path.is_file():
            raise ConfigError(f"--regrade: {path} is missing")
        records = regrade_records(read_records(path), settings, grader)
        new = summarize(records, settings, name=name)
        new["seconds"] = summary["benchmarks"][name].get("seconds")
        old = summary["benchmarks"][name]["metrics"]
        changed = [f"{m} {100 * old[m]['value']:.1f} -> {100 * v['value']:.1f}"
                   for m, v in new["metrics"].items() if m in old and abs(old[m]["value"] - v["value"]) > 1e-12]
        log(f"[{name}] regraded {len(records)} problems" + (f"; changed: {', '.join(changed)}" if changed
                                                            else "; no metric changed"))
        write_records(path, records)
        summary["benchmarks"][name] = new
    summary["regraded"] = True
    write_report(run_dir, summary)
    print(format_table(summary))
    return summary
