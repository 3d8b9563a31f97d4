"""Which differences in a study are larger than their noise: seeds pooled, paired bootstrap over problems.

A study's runs are grouped by their *group* (the run without its ``-seed<k>`` suffix, see
:mod:`mathrl.ablate.study`). For a group, every held-out problem's score is the mean over its seeds of
the per-problem value (greedy correctness, the unbiased pass@k estimate, the expected maj@k) read from
the final checkpoint's evaluation samples. Comparisons are paired: both sides scored on the same
problems, problems resampled jointly (:func:`mathrl.eval.metrics.paired_bootstrap_diff`), so the
interval holds the problem-sampling noise and, through the per-problem mean, some of the seed noise;
it does not hold the variation a new seed would add beyond the seeds run, which is why each group's
per-seed values are shown beside it.

Rows:

* every group against the initial model (``before``) on the headline metric, pass@K and maj@K;
* ``maj@K - pass@K gain``: per problem (maj@K after - before) - (pass@K after - before); DeepSeekMath's
  Figure 7 finding is that RL raises Maj@K more than Pass@K (it re-ranks answers the model can already
  produce), i.e. this difference is positive;
* each pair ``[A, B]`` of ``study.compare``, ``B vs A``, e.g. ``[rft, online_rft]`` for "online RFT > RFT".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["group_scores", "study_comparisons", "comparison_table", "group_table"]


def _final_eval_dir(study, record: dict) -> Path:
    return Path(study.out) / record["name"] / "eval" / f"step_{int(record['final_step']):06d}"


def _mean_by_problem(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    ids = set(per_seed[0])
    for s in per_seed[1:]:
        if set(s) != ids:
            raise ValueError("the seeds of a group were evaluated on different problems")
    out = {}
    for i in ids:
        metrics = set.intersection(*(set(s[i]) for s in per_seed))
        out[i] = {m: sum(s[i][m] for s in per_seed) / len(per_seed) for m in metrics}
    return out


def group_scores(study, data: dict) -> tuple[dict[str, dict], dict[str, dict[str, dict[str, float]]]]:
    """``(groups, before)``: per group its method, runs and per-problem scores averaged over seeds
    (only groups whose every seed is complete); ``before``: per baseline key, the initial model's
    per-problem scores."""
    from mathrl.eval.compare import per_problem

    members: dict[str, list[str]] = {}
    for r in study.runs:
        members.setdefault(r.group, []).append(r.name)
    done = {rec["name"]: rec for rec in data["runs"]}
    groups: dict[str, dict] = {}
    before: dict[str, dict[str, dict[str, float]]] = {}
    for g, names in members.items():
        if not all(n in done for n in names):
            continue
        recs = [done[n] for n in names]
        per_seed = []
        for rec in recs:
            key = rec["baseline"]
            if key not in before:
                before[key] = per_problem(Path(study.out) / f"baseline-{key}")
            folder = _final_eval_dir(study, rec)
            per_seed.append(before[key] if int(rec["final_step"]) == 0 else per_problem(folder))
        groups[g] = {"method": recs[0]["method"], "runs": names, "baseline": recs[0]["baseline"],
                     "after_per_seed": [rec["after"] for rec in recs], "scores": _mean_by_problem(per_seed)}
    return groups, before


def _headline(scores: dict[str, dict[str, float]]) -> str:
    any_row = next(iter(scores.values()), {})
    return "greedy" if "greedy" in any_row else "pass@1"


def _kmax(scores: dict[str, dict[str, float]]) -> int:
    any_row = next(iter(scores.values()), {})
    return max((int(m.split("@")[1]) for m in any_row if m.startswith("pass@")), default=1)


def _paired(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]], metric: str, *, resamples: int,
            seed: int) -> dict[str, Any] | None:
    from mathrl.eval.metrics import paired_bootstrap_diff

    ids = sorted(set(a) & set(b))
    if not ids or set(a) != set(b) or not all(metric in a[i] and metric in b[i] for i in ids):
        return None
    xa, xb = [a[i][metric] for i in ids], [b[i][metric] for i in ids]
    d = paired_bootstrap_diff(xa, xb, resamples=resamples, seed=seed)
    return {"value_a": sum(xa) / len(ids), "value_b": sum(xb) / len(ids), "diff": d["diff"], "lo": d["lo"], "hi": d["hi"],
            "p_b_le_a": d["p_le_0"], "problems": len(ids)}


def study_comparisons(study, data: dict, *, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The groups' per-seed values and every comparison row (see the module docstring)."""
    groups, before = group_scores(study, data)
    rows: list[dict[str, Any]] = []
    for g, info in groups.items():
        base = before[info["baseline"]]
        head, k = _headline(base), _kmax(base)
        metrics = [head] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else [])
        for m in metrics:
            r = _paired(base, info["scores"], m, resamples=resamples, seed=seed)
            if r is not None:
                rows.append({"kind": "vs before", "a": "before", "b": g, "metric": m, **r})
        if k > 1:
            ids = sorted(base)
            if set(ids) == set(info["scores"]):
                gain_pass = {i: {"g": info["scores"][i][f"pass@{k}"] - base[i][f"pass@{k}"]} for i in ids}
                gain_maj = {i: {"g": info["scores"][i][f"maj@{k}"] - base[i][f"maj@{k}"]} for i in ids}
                r = _paired(gain_pass, gain_maj, "g", resamples=resamples, seed=seed)
                if r is not None:
                    rows.append({"kind": "maj gain - pass gain", "a": f"pass@{k} gain", "b": f"maj@{k} gain",
                                 "group": g, "metric": f"maj@{k} - pass@{k}", **r})
    for a, b in study.compare:
        if a not in groups or b not in groups:
            continue
        sa, sb = groups[a]["scores"], groups[b]["scores"]
        head, k = _headline(sa), _kmax(sa)
        for m in [head, "pass@1"] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else []):
            if m == "pass@1" and head == "pass@1":
                continue
            r = _paired(sa, sb, m, resamples=resamples, seed=seed)
            if r is not None:
                rows.append({"kind": "pair", "a": a, "b": b, "metric": m, **r})
    return {"groups": {g: {k: v for k, v in info.items() if k != "scores"} for g, info in groups.items()},
            "rows": rows, "resamples": resamples}


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}" if x == x else "-"


def comparison_table(comp: dict[str, Any]) -> str:
    """Markdown: one line per comparison, the difference with its 95% interval and whether it excludes 0."""
    if not comp["rows"]:
        return "(no complete group to compare yet)"
    lines = ["| comparison | metric | A | B | B - A | 95% CI | p(B <= A) | excludes 0 |", "|---|---|---|---|---|---|---|---|"]
    for r in comp["rows"]:
        what = (f"{r['group']}: {r['b']} vs {r['a']}" if r["kind"] == "maj gain - pass gain"
                else f"{r['b']} vs {r['a']}")
        sig = "yes" if r["lo"] > 0 or r["hi"] < 0 else "no"
        lines.append(f"| {what} | {r['metric']} | {100 * r['value_a']:.1f} | {100 * r['value_b']:.1f} | {_pct(r['diff'])} | "
                     f"[{_pct(r['lo'])}, {_pct(r['hi'])}] | {r['p_b_le_a']:.3f} | {sig} |")
    return "\n".join(lines)


def group_table(comp: dict[str, Any]) -> str:
    """Markdown: each group's after-training values, the mean over seeds and each seed's."""
    groups = comp["groups"]
    if not groups:
        return ""
    any_after = next(iter(groups.values()))["after_per_seed"][0]
    head = "greedy" if "greedy" in any_after else "pass@1"
    k = max((int(m.split("@")[1]) for m in any_after if m.startswith("pass@")), default=1)
    metrics = [head] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else [])
    lines = ["| group | method | seeds | " + " | ".join(f"{m} (mean; per seed)" for m in metrics) + " |",
             "|" + "---|" * (3 + len(metrics))]
    for g, info in groups.items():
        cells = []
        for m in metrics:
            vals = [a[m] for a in info["after_per_seed"] if m in a]
            cells.append(f"{100 * sum(vals) / len(vals):.1f} ({', '.join(f'{100 * v:.1f}' for v in vals)})"
                         if vals else "-")
        lines.append(f"| {g} | {info['method']} | {len(info['runs'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
