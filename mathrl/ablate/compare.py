"""Which differences in a study are larger than their noise: seeds pooled, paired tests over problems.

A study's runs are grouped by their *group* (the run without its ``-seed<k>`` suffix, see
:mod:`mathrl.ablate.study`). For a group, every held-out problem's score is the mean over its seeds of
the per-problem value (greedy correctness, the unbiased pass@k estimate, the expected maj@k) read from
the final checkpoint's evaluation samples. Its *before* is the same mean over the evaluations of the
initial model that its seeds were paired with (``baseline-<key>``: a seed samples its evaluation with its
own seed, so seed 1's runs have their own evaluation of the initial model); a gain is thus paired per
seed and per problem. Comparisons are paired: both sides scored on the same problems.

Two kinds of rows:

* **confirmatory** (``study.primary_metric`` and ``study.contrasts``, declared in the study file before
  it runs): one test per declared contrast ``[A, B]`` (``B vs A``; ``A = before``: B against the initial
  model) on the primary metric. p-value: the two-sided paired sign-flip permutation test over problems
  (:func:`mathrl.eval.metrics.paired_permutation_p`, exact up to 16 non-zero differences, else 10,000
  random sign assignments). Holm's step-down correction over the family (:func:`~mathrl.eval.metrics.holm`;
  a contrast that cannot be computed counts as p = 1), family-wise alpha 0.05: "survives" = Holm-adjusted
  p <= 0.05. Each contrast also gets its minimum detectable difference at 80% power
  (:func:`~mathrl.eval.metrics.min_detectable_diff`) from the standard deviation of its per-problem paired
  differences, at the per-contrast alpha 0.05 / m of Holm's first (strictest) step, so a contrast that
  does not survive reads "no difference larger than X".
* **exploratory** (not corrected, labelled so): every group against ``before`` on the headline metric,
  pass@K and maj@K; ``maj@K - pass@K gain`` (per problem (maj@K after - before) - (pass@K after -
  before); DeepSeekMath's Figure 7 finding is that RL raises Maj@K more than Pass@K, i.e. this is
  positive); each pair ``[A, B]`` of ``study.compare`` on every metric. Each has its 95% paired-bootstrap
  interval (:func:`~mathrl.eval.metrics.paired_bootstrap_diff`), the uncorrected two-sided permutation p
  and the MDE at alpha 0.05.

Both resample problems only: they hold no seed-to-seed variation beyond the seeds run. So each group's
per-seed values and their spread are shown beside it, and a comparison of groups with different seed
counts (a one-seed row against pooled seeds) is flagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mathrl.ablate.study import BEFORE
from mathrl.eval.metrics import (holm, min_detectable_diff, paired_bootstrap_diff, paired_permutation_p,
                                 sample_sd)

__all__ = ["FAMILY_ALPHA", "POWER", "group_scores", "study_comparisons", "comparison_table", "contrast_table",
           "group_table"]

FAMILY_ALPHA = 0.05
"""Family-wise error rate of the declared contrasts (Holm), and the level of the exploratory rows."""
POWER = 0.8
"""The power at which the minimum detectable difference is given."""


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


def _seed_means(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, list[float]]:
    """Per metric, each seed's mean over the problems (its benchmark value)."""
    metrics = set.intersection(*(set(row) for s in per_seed for row in s.values())) if per_seed[0] else set()
    return {m: [sum(row[m] for row in s.values()) / len(s) for s in per_seed] for m in sorted(metrics)}


def group_scores(study, data: dict) -> tuple[dict[str, dict], dict[str, dict[str, dict[str, float]]]]:
    """``(groups, before)``: per group (only groups whose every seed is complete) its method, runs, the
    baseline key of each seed, ``scores`` (per problem, the mean over the seeds), ``before_scores`` (per
    problem, the mean over the seeds' own evaluations of the initial model), and ``seed_values`` /
    ``before_seed_values`` (per metric, each seed's value); ``before``: per baseline key, the initial
    model's per-problem scores."""
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
        per_seed, base_per_seed = [], []
        for rec in recs:
            key = rec["baseline"]
            if key not in before:
                before[key] = per_problem(Path(study.out) / f"baseline-{key}")
            base_per_seed.append(before[key])
            folder = _final_eval_dir(study, rec)
            per_seed.append(before[key] if int(rec["final_step"]) == 0 else per_problem(folder))
        groups[g] = {"method": recs[0]["method"], "runs": names, "baselines": [rec["baseline"] for rec in recs],
                     "after_per_seed": [rec["after"] for rec in recs], "seed_values": _seed_means(per_seed),
                     "before_seed_values": _seed_means(base_per_seed), "scores": _mean_by_problem(per_seed),
                     "before_scores": _mean_by_problem(base_per_seed)}
    return groups, before


def _headline(scores: dict[str, dict[str, float]]) -> str:
    any_row = next(iter(scores.values()), {})
    return "greedy" if "greedy" in any_row else "pass@1"


def _kmax(scores: dict[str, dict[str, float]]) -> int:
    any_row = next(iter(scores.values()), {})
    return max((int(m.split("@")[1]) for m in any_row if m.startswith("pass@")), default=1)


def _paired(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]], metric: str, *, resamples: int,
            seed: int, alpha: float = FAMILY_ALPHA) -> dict[str, Any] | None:
    """B - A over the shared problems: the bootstrap interval, the two-sided permutation p, the MDE at
    ``alpha``; None when the problems or the metric differ."""
    ids = sorted(set(a) & set(b))
    if not ids or set(a) != set(b) or not all(metric in a[i] and metric in b[i] for i in ids):
        return None
    xa, xb = [a[i][metric] for i in ids], [b[i][metric] for i in ids]
    d = paired_bootstrap_diff(xa, xb, resamples=resamples, seed=seed)
    diffs = [y - x for x, y in zip(xa, xb)]
    sd = sample_sd(diffs)
    return {"value_a": sum(xa) / len(ids), "value_b": sum(xb) / len(ids), "diff": d["diff"], "lo": d["lo"], "hi": d["hi"],
            "p_b_le_a": d["p_le_0"], "p": paired_permutation_p(diffs, seed=seed), "sd_diff": sd,
            "mde": min_detectable_diff(sd, len(ids), alpha=alpha, power=POWER), "alpha": alpha, "problems": len(ids)}


def _seed_counts(groups: dict[str, dict], a: str, b: str) -> dict[str, Any]:
    na = len(groups[b]["runs"]) if a == BEFORE else len(groups[a]["runs"])
    nb = len(groups[b]["runs"])
    return {"seeds_a": na, "seeds_b": nb, "seeds_differ": na != nb}


def _contrasts(study, groups: dict[str, dict], *, resamples: int, seed: int) -> list[dict[str, Any]]:
    """The declared family on the primary metric, Holm-corrected (see the module docstring)."""
    m, metric = len(study.contrasts), study.primary_metric
    rows: list[dict[str, Any]] = []
    for a, b in study.contrasts:
        row: dict[str, Any] = {"a": a, "b": b, "metric": metric}
        ready = b in groups and (a == BEFORE or a in groups)
        r = None
        if ready:
            sa = groups[b]["before_scores"] if a == BEFORE else groups[a]["scores"]
            r = _paired(sa, groups[b]["scores"], metric, resamples=resamples, seed=seed, alpha=FAMILY_ALPHA / m)
        if r is None:
            row["computed"] = False
            row["why"] = ("a group is not complete" if not ready
                          else f"{metric} missing or the problems differ")
        else:
            va = groups[b]["before_seed_values"] if a == BEFORE else groups[a]["seed_values"]
            row.update(computed=True, **r, **_seed_counts(groups, a, b), a_per_seed=va.get(metric, []),
                       b_per_seed=groups[b]["seed_values"].get(metric, []))
        rows.append(row)
    for row, adj in zip(rows, holm([row["p"] if row["computed"] else 1.0 for row in rows])):
        row["p_holm"] = adj
        row["survives"] = bool(row["computed"] and adj <= FAMILY_ALPHA)
        row["verdict"] = _verdict(row)
    return rows


def _verdict(row: dict[str, Any]) -> str:
    if not row["computed"]:
        return f"not computed ({row['why']})"
    if row["survives"]:
        return f"{row['b']} {'above' if row['diff'] > 0 else 'below'} {row['a']}"
    if abs(row["diff"]) <= row["mde"]:
        return f"no difference larger than {100 * row['mde']:.1f} points"
    return f"not significant after correction (observed {_pct(row['diff'])} points, MDE {100 * row['mde']:.1f})"


def study_comparisons(study, data: dict, *, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The groups' per-seed values, the declared contrasts and every exploratory row (module docstring)."""
    groups, _ = group_scores(study, data)
    rows: list[dict[str, Any]] = []
    for g, info in groups.items():
        base = info["before_scores"]
        head, k = _headline(base), _kmax(base)
        metrics = [head] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else [])
        for m in metrics:
            r = _paired(base, info["scores"], m, resamples=resamples, seed=seed)
            if r is not None:
                rows.append({"kind": "vs before", "a": "before", "b": g, "metric": m, **r,
                             **_seed_counts(groups, BEFORE, g)})
        if k > 1:
            ids = sorted(base)
            if set(ids) == set(info["scores"]):
                gain_pass = {i: {"g": info["scores"][i][f"pass@{k}"] - base[i][f"pass@{k}"]} for i in ids}
                gain_maj = {i: {"g": info["scores"][i][f"maj@{k}"] - base[i][f"maj@{k}"]} for i in ids}
                r = _paired(gain_pass, gain_maj, "g", resamples=resamples, seed=seed)
                if r is not None:
                    rows.append({"kind": "maj gain - pass gain", "a": f"pass@{k} gain", "b": f"maj@{k} gain",
                                 "group": g, "metric": f"maj@{k} - pass@{k}", **r, **_seed_counts(groups, BEFORE, g)})
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
                rows.append({"kind": "pair", "a": a, "b": b, "metric": m, **r, **_seed_counts(groups, a, b)})
    hidden = ("scores", "before_scores")
    return {"groups": {g: {k: v for k, v in info.items() if k not in hidden} for g, info in groups.items()},
            "primary_metric": study.primary_metric, "family_alpha": FAMILY_ALPHA, "power": POWER,
            "contrasts": _contrasts(study, groups, resamples=resamples, seed=seed) if study.contrasts else [],
            "rows": rows, "resamples": resamples}


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}" if x == x else "-"


def _seeds(r: dict[str, Any]) -> str:
    return f"{r['seeds_a']}/{r['seeds_b']}" + (" (unequal)" if r["seeds_differ"] else "")


def _mde(r: dict[str, Any]) -> str:
    return f"{100 * r['mde']:.1f}" if r["mde"] == r["mde"] else "-"


def contrast_table(comp: dict[str, Any]) -> str:
    """Markdown: the declared contrasts, each with its seeds' values, p, Holm-adjusted p, survival and MDE."""
    rows = comp["contrasts"]
    if not rows:
        return ""
    lines = ["| contrast | metric | seeds A/B | A (per seed) | B (per seed) | B - A | 95% CI | p | Holm p | survives | "
             "MDE | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        what = f"{r['b']} vs {r['a']}"
        if not r["computed"]:
            # its p counts as 1 in Holm's family (conservative for the others); it has no p of its own to print
            lines.append(f"| {what} | {r['metric']} | - | - | - | - | - | - | - | no | - | {r['verdict']} |")
            continue
        per_a = ", ".join(f"{100 * v:.1f}" for v in r["a_per_seed"])
        per_b = ", ".join(f"{100 * v:.1f}" for v in r["b_per_seed"])
        lines.append(f"| {what} | {r['metric']} | {_seeds(r)} | {100 * r['value_a']:.1f} ({per_a}) | "
                     f"{100 * r['value_b']:.1f} ({per_b}) | {_pct(r['diff'])} | [{_pct(r['lo'])}, {_pct(r['hi'])}] | "
                     f"{r['p']:.4f} | {r['p_holm']:.4f} | {'yes' if r['survives'] else 'no'} | {_mde(r)} | "
                     f"{r['verdict']} |")
    return "\n".join(lines)


def comparison_table(comp: dict[str, Any]) -> str:
    """Markdown: one exploratory line per comparison, the difference with its 95% interval, the uncorrected
    p, whether the interval excludes 0 and the MDE at alpha 0.05."""
    if not comp["rows"]:
        return "(no complete group to compare yet)"
    lines = ["| comparison | metric | seeds A/B | A | B | B - A | 95% CI | p (uncorrected) | excludes 0 | MDE |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in comp["rows"]:
        what = (f"{r['group']}: {r['b']} vs {r['a']}" if r["kind"] == "maj gain - pass gain"
                else f"{r['b']} vs {r['a']}")
        sig = "yes" if r["lo"] > 0 or r["hi"] < 0 else "no"
        lines.append(f"| {what} | {r['metric']} | {_seeds(r)} | {100 * r['value_a']:.1f} | {100 * r['value_b']:.1f} | "
                     f"{_pct(r['diff'])} | [{_pct(r['lo'])}, {_pct(r['hi'])}] | {r['p']:.3f} | {sig} | {_mde(r)} |")
    return "\n".join(lines)


def group_table(comp: dict[str, Any]) -> str:
    """Markdown: each group's held-out values after training: the mean over seeds, each seed's and the seed
    range (max - min)."""
    groups = comp["groups"]
    if not groups:
        return ""
    any_values = next(iter(groups.values()))["seed_values"]
    head = "greedy" if "greedy" in any_values else "pass@1"
    k = max((int(m.split("@")[1]) for m in any_values if m.startswith("pass@")), default=1)
    metrics = [head] + ([f"pass@{k}", f"maj@{k}"] if k > 1 else [])
    primary = comp.get("primary_metric")
    if primary and primary not in metrics:
        metrics.insert(0, primary)
    lines = ["| group | method | seeds | " + " | ".join(f"{m} (mean; per seed; range)" for m in metrics) + " |",
             "|" + "---|" * (3 + len(metrics))]
    for g, info in groups.items():
        cells = []
        for m in metrics:
            vals = info["seed_values"].get(m, [])
            spread = f"; {100 * (max(vals) - min(vals)):.1f}" if len(vals) > 1 else ""
            cells.append(f"{100 * sum(vals) / len(vals):.1f} ({', '.join(f'{100 * v:.1f}' for v in vals)}{spread})"
                         if vals else "-")
        lines.append(f"| {g} | {info['method']} | {len(info['runs'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
