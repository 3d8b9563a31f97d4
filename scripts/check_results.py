"""Recompute every recorded evaluation figure from its kept per-problem samples (issue 40).

Each claim names a document, where in it the figure is printed (a table row after an anchor, a line of a
printed block, a whole report file) and how it is computed again from the kept files with the product's
own code: ``mathrl.eval.runner.summarize`` over the kept ``samples.jsonl.gz`` (pass@k, maj@k, greedy and
their bootstrap intervals), ``mathrl.eval.compare.compare_summaries`` for paired differences (the paired
bootstrap of ``mathrl.eval.metrics``), ``mathrl.eval.report`` / ``mathrl.eval.compare`` for the printed
forms and ``mathrl.train.report`` for the trainer's held-out table. Nothing is re-implemented here.

One line per claim: ``ok``, ``MISMATCH`` (printed and recomputed), ``NO DATA`` (a kept file is missing) or
``withdrawn`` (listed in WITHDRAWN below: the document says the figure was withdrawn because its
per-problem samples were not kept). Every file under docs/results/, docs/ablations/ and eval/results/ must be a claim's
document or data, or be listed in NOT_CLAIMS with a reason: a result added without a claim fails.
Exit 1 on any mismatch, missing data, missing withdrawal note or unlisted result file.

    python scripts/check_results.py [--root COPY_OF_THE_REPOSITORY]

Runs in about a second; ``make test`` runs it (tests/unit/test_check_results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mathrl.eval.compare import compare_markdown, compare_summaries, format_ci, format_compare  # noqa: E402
from mathrl.eval.report import markdown_report, pct  # noqa: E402
from mathrl.eval.runner import EvalSettings, read_records, samples_path, summarize  # noqa: E402
from mathrl.train.report import before_after_table, heldout_metrics  # noqa: E402


class NoData(Exception):
    """A kept file a claim needs is missing."""


class Kept:
    """The kept files under ``root``, evaluation folders recomputed once each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._evals: dict[str, tuple[dict, dict]] = {}
        self._pairs: dict[tuple[str, str], dict] = {}
        self.used: set[Path] = set()
        self._ablations: dict[str, tuple[dict, Path]] = {}
        self._logs: dict[str, tuple[list[dict], list[dict]]] = {}
        self._prm: dict[str, dict] = {}
        self._once: dict[str, object] = {}
        self._tmps: list = []  # the regenerated studies' folders, removed with this object

    def file(self, rel: str) -> Path:
        path = self.root / rel
        if not path.is_file():
            raise NoData(f"{rel} is missing")
        self.used.add(path)
        return path

    def text(self, rel: str) -> str:
        return self.file(rel).read_text(encoding="utf-8")

    def evaluation(self, rel: str) -> tuple[dict, dict]:
        """(the kept summary.json, the summary recomputed from the samples) of an evaluation folder; the
        recomputed one also carries ``records`` per benchmark."""
        if rel not in self._evals:
            kept = json.loads(self.text(f"{rel}/summary.json"))
            s = kept["settings"]
            settings = EvalSettings(**{**s, "ks": tuple(s["ks"]), "stop": tuple(s["stop"])})
            benches, records = {}, {}
            for name, old in kept["benchmarks"].items():
                path = samples_path(self.root / rel / name)
                if not path.is_file():
                    raise NoData(f"{rel}/{name}/samples.jsonl.gz is missing")
                self.used.add(path)
                records[name] = read_records(path)
                benches[name] = {**summarize(records[name], settings, name=name), "seconds": old.get("seconds")}
            self._evals[rel] = (kept, {**kept, "benchmarks": benches, "records": records})
        return self._evals[rel]

    def json(self, rel: str) -> dict:
        return json.loads(self.text(rel))

    def recomputed(self, rel: str) -> dict:
        return self.evaluation(rel)[1]

    def pair(self, a: str, b: str) -> dict:
        """``mathrl eval --compare A B`` of two kept folders, from their samples."""
        if (a, b) not in self._pairs:
            ra, rb = self.recomputed(a), self.recomputed(b)
            self._pairs[(a, b)] = compare_summaries(ra, rb, self.root / a, self.root / b)
        return self._pairs[(a, b)]

    def ablation(self, study_dir: str = "") -> dict:
        """A study's report data, regenerated from the run folders archived in ``<study_dir>/run_archives``
        (stage records, named ``*-record.tar.gz`` (RECORD_SUFFIX), left out, but for the initial PRM's held-out
        measurement, ``prm_initial/heldout_eval.json``, restored from its record) with its study file
        (``STUDY_FILES``), once; default: the word-problem study."""
        study_dir = study_dir or ABL
        if study_dir not in self._ablations:
            import tarfile
            import tempfile

            from mathrl.ablate.report import write_study_report
            from mathrl.ablate.study import HELDOUT_EVAL, PRM_FOLDER, load_study

            archives = [a for a in sorted((self.root / study_dir / "run_archives").glob("*.tar.gz"))
                        if not a.name.endswith(RECORD_SUFFIX)]
            if not archives:
                raise NoData(f"{study_dir}/run_archives/*.tar.gz are missing")
            tmp = tempfile.TemporaryDirectory(prefix="check_results_")
            self._tmps.append(tmp)
            out = Path(tmp.name) / Path(study_dir).name
            out.mkdir()
            for archive in archives:
                self.used.add(archive)
                with tarfile.open(archive) as tar:
                    tar.extractall(out, filter="data")
            record = self.root / study_dir / "run_archives" / f"{PRM_FOLDER}{RECORD_SUFFIX}"
            if record.is_file():  # the report's PRM section: the kept file (its own claim checks it)
                self.used.add(record)
                member = f"{record.name.removesuffix('.tar.gz')}/{HELDOUT_EVAL}"
                with tarfile.open(record) as tar:
                    if member not in tar.getnames():
                        raise NoData(f"{record.relative_to(self.root)} lacks {member}")
                    (out / PRM_FOLDER).mkdir()
                    (out / PRM_FOLDER / HELDOUT_EVAL).write_bytes(tar.extractfile(member).read())
            study = load_study(self.file(STUDY_FILES[study_dir]), out=out)
            with contextlib.redirect_stdout(io.StringIO()):  # the report prints its run table
                self._ablations[study_dir] = (write_study_report(study, log=lambda m: None), out)
        return self._ablations[study_dir][0]

    def ablation_text(self, name: str, study_dir: str = "") -> str:
        self.ablation(study_dir)
        return (self._ablations[study_dir or ABL][1] / name).read_text(encoding="utf-8")

    def prm_record(self, rel: str) -> dict:
        """A PRM record of the DeepSeekMath CPU study (an archive ``<name>.tar.gz`` holding the folder ``<name>/``),
        read once: ``kept`` (its heldout_eval.json), ``again`` (the same recomputed from its labelled held-out
        responses and kept step scores by mathrl's own evaluate_scored), ``train`` (the labelled training
        responses) and, where the record keeps them, ``train_scores`` (the PRM's score of every training step)
        and ``log`` (the stage's console log)."""
        if rel not in self._prm:
            import tarfile

            from mathrl.prm.evaluation import evaluate_scored

            name = Path(rel).name.removesuffix(".tar.gz")
            with tarfile.open(self.file(rel)) as tar:
                members = set(tar.getnames())

                def read(member: str, required: bool = True) -> bytes | None:
                    if f"{name}/{member}" in members:
                        return tar.extractfile(f"{name}/{member}").read()
                    if required:
                        raise NoData(f"{rel} lacks {name}/{member}")
                    return None

                rec = {"kept": json.loads(read("heldout_eval.json")), "train": _jsonl(read("labels.jsonl")),
                       "held": _jsonl(read("heldout_labels.jsonl"))}
                scores, log = read("train_step_scores.json", False), read("study.log", False)
            rec["again"] = evaluate_scored(rec["held"], rec["kept"]["step_scores"])
            rec["train_scores"] = None if scores is None else json.loads(scores)
            rec["log"] = None if log is None else log.decode("utf-8")
            self._prm[rel] = rec
        return self._prm[rel]

    def once(self, key: str, compute: Callable[["Kept"], object]):
        """``compute(self)``, computed at the first call for ``key`` (figures several claims share)."""
        if key not in self._once:
            self._once[key] = compute(self)
        return self._once[key]

    def run_log(self, rel: str) -> tuple[list[dict], list[dict]]:
        """(training rows, the trainer's evaluation rows) of a kept metrics log, as scripts/summarize_run.py
        reads them (once)."""
        if rel not in self._logs:
            self._logs[rel] = _script("summarize_run").read_metrics(self.file(rel))
        return self._logs[rel]

    def heldout(self, rel: str) -> dict[str, float]:
        """The trainer's held-out figures (metrics log, summary.md, console) of a kept training evaluation."""
        r = self.recomputed(rel)
        return heldout_metrics(r["benchmarks"]["heldout"], r["records"]["heldout"])


# --------------------------------------------------------------------------- how printed figures are found

def _norm(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def table_row(anchor: str, label: str) -> Callable[[str], str]:
    """The first markdown table row ``| label | ...`` after ``anchor``."""
    def find(text: str) -> str:
        if anchor not in text:
            raise LookupError(f"anchor {anchor!r} not found")
        for line in text.split(anchor, 1)[1].splitlines():
            if line.startswith(f"| {label} |"):
                return _norm(line)
        raise LookupError(f"no row {label!r} after {anchor!r}")
    return find


def block_line(anchor: str, starts: str) -> Callable[[str], str]:
    """The first line starting (after spaces) with ``starts`` after ``anchor`` (a printed block)."""
    def find(text: str) -> str:
        if anchor not in text:
            raise LookupError(f"anchor {anchor!r} not found")
        for line in text.split(anchor, 1)[1].splitlines():
            if _norm(line).startswith(starts):
                return _norm(line)
        raise LookupError(f"no line {starts!r} after {anchor!r}")
    return find


def phrase(pattern: str) -> Callable[[str], str]:
    """The text matching ``pattern`` (a regular expression) in prose: each space of the pattern matches any run of
    white space, so a phrase matches wherever the document's lines happen to wrap."""
    wrapped = pattern.replace(" ", r"\s+")

    def find(text: str) -> str:
        m = re.search(wrapped, text)
        if not m:
            raise LookupError(f"no text matching {pattern!r}")
        return _norm(m.group(0))
    return find


def whole(text: str) -> str:
    return text


def row(*cells: str) -> str:
    return _norm("| " + " | ".join(cells) + " |")


@dataclass
class Claim:
    doc: str                            # the document, relative to the repository root
    where: str                          # what is printed there, for the report line
    printed: Callable[[str], str]       # finds the printed form in the document's text
    computed: Callable[[Kept], str]     # the same form recomputed from the kept files


# --------------------------------------------------------------------------- the claims

DEMO = "docs/results/demo"
DEMO_A, DEMO_B = f"{DEMO}/eval/step_000000", f"{DEMO}/eval/step_000012"
WP = "docs/results/wordproblems_cpu"
GSM_A, GSM_B = f"{WP}/eval_base_gsm8k", f"{WP}/eval_step40_gsm8k"
DEMO_ROWS = ("greedy", "pass@1", "pass@4", "maj@4", "boxed_rate", "greedy_boxed", "length_mean", "truncation_rate")


def demo_table_row(metric: str, a: str = DEMO_A, b: str = DEMO_B) -> Callable[[Kept], str]:
    """A row of the trainer's before/after table (console, summary.md) of the held-out checks kept in a, b."""
    def compute(k: Kept) -> str:
        table = before_after_table(k.heldout(a), k.heldout(b))
        return next(_norm(line) for line in table.splitlines() if line.startswith(f"| {metric} |"))
    return compute


def compare_line(a: str, b: str, bench: str, metric: str) -> Callable[[Kept], str]:
    """A line of ``mathrl eval --compare``'s printed table."""
    def compute(k: Kept) -> str:
        start = f"{bench} {metric} "
        return next(_norm(line) for line in format_compare(k.pair(a, b)).splitlines() if _norm(line).startswith(start))
    return compute


def _metric(k: Kept, rel: str, bench: str, metric: str) -> dict:
    return k.recomputed(rel)["benchmarks"][bench]["metrics"][metric]


def _diff(k: Kept, a: str, b: str, bench: str, metric: str) -> str:
    """The paired difference b - a with its interval, in bold when the interval excludes 0."""
    r = k.pair(a, b)["benchmarks"][bench]["metrics"][metric]
    lo, hi = r["diff_ci"]
    text = f"{100 * r['diff']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"**{text}**" if lo > 0 or hi < 0 else text


Pair = tuple[str, str, str]  # (before folder, after folder, benchmark) of a paired before/after table
GSM8K_PAIR: Pair = (GSM_A, GSM_B, "gsm8k")


def _ci(m: dict) -> str:
    return format_ci(m["value"], m["ci"])


def paired_row(pair: Pair, label: str, metric: str) -> Callable[[Kept], str]:
    """A row of a before/after table: both values with intervals and the paired difference."""
    a, b, bench = pair

    def compute(k: Kept) -> str:
        ma, mb = _metric(k, a, bench, metric), _metric(k, b, bench, metric)
        return row(label, _ci(ma), _ci(mb), _diff(k, a, b, bench, metric))
    return compute


def paired_short_row(pair: Pair, label: str, metric: str) -> Callable[[Kept], str]:
    a, b, bench = pair

    def compute(k: Kept) -> str:
        return row(label, pct(_metric(k, a, bench, metric)["value"]), pct(_metric(k, b, bench, metric)["value"]),
                   _diff(k, a, b, bench, metric))
    return compute


def paired_lengths(pair: Pair, label: str) -> Callable[[Kept], str]:
    a, b, bench = pair

    def compute(k: Kept) -> str:
        ra, rb = (k.recomputed(r)["benchmarks"][bench] for r in (a, b))
        return row(label, f"{ra['mean_length']:.1f}", f"{rb['mean_length']:.1f}", "")
    return compute


def paired_trunc(pair: Pair, label: str) -> Callable[[Kept], str]:
    a, b, bench = pair

    def compute(k: Kept) -> str:
        ra, rb = (k.recomputed(r)["benchmarks"][bench] for r in (a, b))
        return row(label, f"{pct(ra['truncation_rate'])}% / {pct(ra['no_answer_rate'])}%",
                   f"{pct(rb['truncation_rate'])}% / {pct(rb['no_answer_rate'])}%", "")
    return compute


def _greedy_boxed_share(k: Kept, rel: str) -> float:
    """The share of greedy answers written in ``\\boxed{}`` (boxed, right or wrong)."""
    recs = k.recomputed(rel)["records"]["gsm8k"]
    return sum("\\boxed" in r["greedy"]["text"] for r in recs) / len(recs)


def summary_json(rel: str) -> Callable[[Kept], str]:
    """The kept summary.json's figures: equal to the recomputed ones (to 1e-12) or the first difference."""
    def compute(k: Kept) -> str:
        kept, new = k.evaluation(rel)
        for name, old in kept["benchmarks"].items():
            got = new["benchmarks"][name]
            for key in ("problems", "samples", "mean_length", "truncation_rate", "no_answer_rate", "metrics"):
                if not _close(old.get(key), got.get(key)):
                    return f"{name}.{key} = {got.get(key)!r} (kept: {old.get(key)!r})"
        return "as kept"
    return compute


def compare_json(a: str, b: str, rel: str) -> Callable[[Kept], str]:
    def compute(k: Kept) -> str:
        kept = json.loads(k.text(rel))
        new = k.pair(a, b)
        for bench, old in kept["benchmarks"].items():
            for key in ("problems", "paired", "shared", "metrics", "mean_length", "truncation_rate"):
                if key in old and not _close(old.get(key), new["benchmarks"][bench].get(key)):
                    return f"{bench}.{key} = {new['benchmarks'][bench].get(key)!r} (kept: {old.get(key)!r})"
        return "as kept"
    return compute


def compare_md(a: str, b: str, rel_json: str) -> Callable[[Kept], str]:
    def compute(k: Kept) -> str:
        kept = json.loads(k.text(rel_json))  # the folders as the comparison named them
        return compare_markdown(k.pair(a, b), kept["a"].get("folder", a), kept["b"].get("folder", b))
    return compute


WP_METRICS = f"{WP}/metrics.jsonl"
WP_CHECKS = (f"{WP}/eval/step_000000", f"{WP}/eval/step_000080")  # the trainer's checks (data.eval_limit problems)
WP_CURVE_ANCHOR = "| steps | accuracy (trained groups) | groups without signal | length | KL | boxed | s/step |"
WP_README_WINDOWS = ("1-10", "41-50", "71-80")


def metrics_summary(k: Kept) -> str:
    rows, evals = k.run_log(WP_METRICS)
    return _script("summarize_run").render(rows, 10, evals)


def curve_row(k: Kept, steps: str) -> str:
    """A row of README's training-curve excerpt: the 10-step means of the kept metrics log."""
    rows, _ = k.run_log(WP_METRICS)
    for first, last, m in _script("summarize_run").window_means(rows, 10):
        if f"{first}-{last}" == steps:
            return row(steps, f"{m['reward/accuracy']:.3f}", f"{m['sampling/filtered_frac']:.2f}",
                       f"{m['response/length_mean']:.1f}", f"{m['kl/mean']:.3f}", f"{m['reward/boxed']:.2f}",
                       f"{m['time/step']:.0f}")
    return f"no window {steps} in {WP_METRICS}"


def _check_line(step: int, figures: dict) -> str:
    return f"step {step}: " + ", ".join(f"{key} {float(figures[key]):.6f}" for key in sorted(figures))


def logged_checks(text: str) -> str:
    """The eval rows of the metrics log (the trainer's own held-out checks), one line per step."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return "; ".join(_check_line(r["step"], {key: v for key, v in r.items() if key not in ("step", "event")})
                     for r in rows if r.get("event") == "eval")


def recomputed_checks(k: Kept) -> str:
    """The same figures from the kept samples of each check (``mathrl.train.report.heldout_metrics``)."""
    return "; ".join(_check_line(int(rel.rsplit("_", 1)[1]), k.heldout(rel)) for rel in WP_CHECKS)


SVAMP_A = f"{WP}/eval_svamp_base_n8"  # the initial model on SVAMP's 1000 problems, n = 8 + greedy, timed
SVAMP_B = f"{WP}/eval_svamp_step80_n8"  # the trained model (step 80), the same settings, timed
SVAMP_PAIR: Pair = (SVAMP_A, SVAMP_B, "svamp")
SVAMP_ANCHOR = "| SVAMP test, 1000 problems (%) |"
SVAMP_ROWS = (("greedy", "greedy"), ("pass@1 (n = 8, T = 0.6)", "pass@1"), ("pass@4", "pass@4"),
              ("pass@8", "pass@8"), ("maj@8", "maj@8"))
GSM8K_SUMMARY = (("GSM8K greedy (40 steps)", "greedy"), ("GSM8K maj@4 (40 steps)", "maj@4"))
SVAMP_SUMMARY = (("SVAMP greedy (80 steps)", "greedy"), ("SVAMP pass@1 (80 steps)", "pass@1"),
                 ("SVAMP maj@8 (80 steps)", "maj@8"))


def svamp_largest_p(k: Kept) -> str:
    """The largest one-sided bootstrap p(B<=A) of the SVAMP comparison's metrics, and whether twice it times
    the number of metrics (Bonferroni over the comparison's readings) stays below 0.05."""
    rows = k.pair(SVAMP_A, SVAMP_B)["benchmarks"]["svamp"]["metrics"]
    name = max(rows, key=lambda m: rows[m]["p_b_le_a"])
    p, m = rows[name]["p_b_le_a"], len(rows)
    verdict = "is still below 0.05" if 2 * p * m < 0.05 else "is NOT below 0.05"
    return (f"the comparison's largest p(B<=A) is {p:.3f} ({name}), and doubled for two sides and multiplied by "
            f"{m} (Bonferroni) that {verdict}")


def eval_speed(k: Kept, rel: str, bench: str) -> str:
    """How fast a kept evaluation generated: every sample's and greedy answer's tokens over the benchmark's
    generation seconds (summary.json), the command's minutes, and the cores it kept busy (user + system CPU
    seconds over the wall time, from the ``/usr/bin/time -v`` output kept as time.txt)."""
    r = k.recomputed(rel)
    recs, b = r["records"][bench], r["benchmarks"][bench]
    tokens = sum(x["tokens"] for rec in recs for x in [*rec["samples"], *([rec["greedy"]] if "greedy" in rec else [])])
    gen = b["seconds"]["generate"]
    t = k.text(f"{rel}/time.txt")
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", t).group(1)) for kind in ("User", "System"))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", t).group(1)
    wall_s = sum(float(part) * 60 ** i for i, part in enumerate(reversed(wall.split(":"))))
    return (f"took {r['seconds'] / 60:.1f} min: {b['problems']} problems, {tokens} tokens in {gen:.0f} s of "
            f"generation ({tokens / gen:.1f} tok/s), {cpu / wall_s:.2f} of 2 cores busy")


def _close(x, y) -> bool:
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_close(x[i], y[i]) for i in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_close(i, j) for i, j in zip(x, y))
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)
    return x == y


def _claims(root: Path) -> list[Claim]:
    c: list[Claim] = []
    # README, "What `make demo` does and prints": the printed table, the same in the run's console and summary.md
    for doc, anchor in (("README.md", "Held-out evaluation before and after training:"),
                        (f"{DEMO}/console.txt", "Held-out evaluation before and after training:"),
                        (f"{DEMO}/summary.md", "| metric | before | after |")):
        for m in DEMO_ROWS:
            c.append(Claim(doc, f"demo before/after row {m}", table_row(anchor, m), demo_table_row(m)))
    # README: the demo's `mathrl eval --compare` output (95% paired bootstrap over the 32 problems)
    for m in ("greedy", "pass@1", "pass@4", "maj@4"):
        c.append(Claim("README.md", f"demo --compare line {m}", block_line("this run's\noutput", f"heldout {m} "),
                       compare_line(DEMO_A, DEMO_B, "heldout", m)))
    # README and docs/results/wordproblems_cpu/README.md: GSM8K before / after 40 steps
    for doc, anchor, p1 in (("README.md", "| GSM8K test, 1319 problems (%) |", "pass@1 (n=4, T=0.6)"),
                            (f"{WP}/README.md", "| GSM8K test, 1319 problems (%) |", "pass@1 (n = 4, T = 0.6)")):
        for label, m in (("greedy", "greedy"), (p1, "pass@1"), ("pass@4", "pass@4"), ("maj@4", "maj@4")):
            c.append(Claim(doc, f"GSM8K row {m}", table_row(anchor, label), paired_row(GSM8K_PAIR, label, m)))
        c.append(Claim(doc, "GSM8K mean length", table_row(anchor, "mean length (tokens)"),
                       paired_lengths(GSM8K_PAIR, "mean length (tokens)")))
    c.append(Claim(f"{WP}/README.md", "GSM8K truncation / no answer",
                   table_row("| GSM8K test, 1319 problems (%) |", "truncated at 256 tokens / no answer"),
                   paired_trunc(GSM8K_PAIR, "truncated at 256 tokens / no answer")))
    # docs/results/wordproblems_cpu/README.md's summary table: each paired evaluation's short rows
    for pair, rows in ((GSM8K_PAIR, GSM8K_SUMMARY), (SVAMP_PAIR, SVAMP_SUMMARY)):
        for label, m in rows:
            c.append(Claim(f"{WP}/README.md", f"summary row {label}", table_row("| full test set (%) |", label),
                           paired_short_row(pair, label, m)))
    c.append(Claim("README.md", "GSM8K truncation in prose", phrase(r"stopped running past 256 tokens: [\d.]+% -> [\d.]+%"),
                   lambda k: "stopped running past 256 tokens: " + " -> ".join(
                       f"{pct(k.recomputed(r)['benchmarks']['gsm8k']['truncation_rate'])}%" for r in (GSM_A, GSM_B))))
    c.append(Claim(f"{WP}/README.md", "GSM8K greedy answers with a box", phrase(
        r"On the GSM8K evaluation \d+% of the trained model's greedy answers carry a box \(initial model: \d+%\)"),
        lambda k: "On the GSM8K evaluation {1:.0f}% of the trained model's greedy answers carry a box "
                  "(initial model: {0:.0f}%)".format(*(100 * _greedy_boxed_share(k, r) for r in (GSM_A, GSM_B)))))
    # the word-problem run's metrics log: its 10-step summary (scripts/summarize_run.py), README's excerpt
    # of it, and the trainer's own held-out checks it logged, recomputed from their kept samples
    c.append(Claim(f"{WP}/metrics_summary.md", "the whole summary of the kept metrics log", whole,
                   metrics_summary))
    c.append(Claim(WP_METRICS, "the trainer's held-out checks (eval rows)", logged_checks, recomputed_checks))
    for m in DEMO_ROWS:
        c.append(Claim(f"{WP}/summary.md", f"the trainer's before/after row {m}", table_row("| metric |", m),
                       demo_table_row(m, *WP_CHECKS)))
    for steps in WP_README_WINDOWS:
        c.append(Claim("README.md", f"word-problem training window {steps}", table_row(WP_CURVE_ANCHOR, steps),
                       lambda k, steps=steps: curve_row(k, steps)))
    c.append(Claim("README.md", "word-problem training hours", phrase(r"Wall time: [\d.]+ h of training steps"),
                   lambda k: f"Wall time: {sum(r['time/step'] for r in k.run_log(WP_METRICS)[0]) / 3600:.2f} h of training steps"))
    c.append(Claim("README.md", "the trainer's 100-problem check in prose",
                   phrase(r"moved from greedy [\d.]+ to [\d.]+ and pass@1 [\d.]+ to [\d.]+"),
                   lambda k: "moved from greedy {:.3f} to {:.3f} and pass@1 {:.3f} to {:.3f}".format(
                       *(k.heldout(r)[m] for m in ("greedy", "pass@1") for r in WP_CHECKS))))
    # README and docs/results/wordproblems_cpu/README.md: SVAMP before / after 80 steps (full test, n = 8)
    for doc in ("README.md", f"{WP}/README.md"):
        for label, m in SVAMP_ROWS:
            c.append(Claim(doc, f"SVAMP row {m}", table_row(SVAMP_ANCHOR, label), paired_row(SVAMP_PAIR, label, m)))
        c.append(Claim(doc, "SVAMP mean length", table_row(SVAMP_ANCHOR, "mean length (tokens)"),
                       paired_lengths(SVAMP_PAIR, "mean length (tokens)")))
        trunc = "truncated at 256 tokens / no answer"
        c.append(Claim(doc, "SVAMP truncation / no answer", table_row(SVAMP_ANCHOR, trunc), paired_trunc(SVAMP_PAIR, trunc)))
        for who, rel in (("initial", SVAMP_A), ("trained", SVAMP_B)):
            c.append(Claim(doc, f"the {who} model's SVAMP evaluation speed", phrase((
                rf"The {who} model's evaluation took [\d.]+ min: \d+ problems, \d+ tokens in \d+ s of generation "
                r"\([\d.]+ tok/s\), [\d.]+ of 2 cores busy")),
                lambda k, who=who, rel=rel: f"The {who} model's evaluation " + eval_speed(k, rel, "svamp")))
    c.append(Claim("README.md", "the SVAMP comparison's largest p(B<=A), with Bonferroni over its metrics", phrase((
        r"the comparison's largest p\(B<=A\) is [\d.]+ \(\S+\), and doubled for two sides and multiplied by \d+"
        r" \(Bonferroni\) that is still below 0\.05")), svamp_largest_p))
    # the kept report files of every kept evaluation folder and comparison
    for rel in (DEMO_A, DEMO_B, GSM_A, GSM_B, *WP_CHECKS, SVAMP_A, SVAMP_B):
        c.append(Claim(f"{rel}/summary.json", "metrics, lengths and intervals", lambda _t: "as kept", summary_json(rel)))
        c.append(Claim(f"{rel}/report.md", "the whole report", whole,
                       lambda k, rel=rel: markdown_report(k.recomputed(rel))))
    for a, b, rel in ((DEMO_A, DEMO_B, f"{DEMO_B}/compare"), (GSM_A, GSM_B, f"{WP}/compare_gsm8k"),
                      (SVAMP_A, SVAMP_B, f"{WP}/compare_svamp_n8")):
        c.append(Claim(f"{rel}/compare.json", "paired differences and intervals", lambda _t: "as kept",
                       compare_json(a, b, f"{rel}/compare.json")))
        c.append(Claim(f"{rel}/compare.md", "the whole comparison", whole, compare_md(a, b, f"{rel}/compare.json")))
    # the published ablation studies: each report regenerated from the run folders archived beside it
    # (`mathrl ablate ... --report-only`); README's summary of the word-problem study
    for study in PUBLISHED_STUDIES:
        c.append(Claim(f"{study}/report.md", "the whole report (declared contrasts, Holm, MDE, exploratory rows)",
                       whole, lambda k, study=study: k.ablation_text("report.md", study)))
        c.append(Claim(f"{study}/report.json", "every group value, contrast and comparison row",
                       lambda _t: "as kept", lambda k, study=study: ablation_json(k, study)))
    for where, pattern, compute in ABLATION_README:
        c.append(Claim("README.md", f"ablation result: {where}", phrase(pattern), compute))
    # the DeepSeekMath CPU study's results, in README and in the study's README
    if DSM in PUBLISHED_STUDIES:
        for doc in DSM_DOCS:
            for where, printed, compute in dsm_results(root):
                c.append(Claim(doc, f"DeepSeekMath CPU study: {where}", printed, compute))
    # the DeepSeekMath CPU study: its initial PRM, recomputed from the archived labels and step scores
    c.append(Claim(f"{DSM}/README.md", "the initial PRM's labels and held-out measurement", phrase(
        r"\d+ training responses \(\d+ right, \d+ steps\); on the \d+ held-out problems \(\d+ steps\) step AUC [\d.]+, "
        r"best-of-8 by the weakest step [\d.]+% against majority voting [\d.]+% and a random response [\d.]+%; "
        r"best-of-8 minus majority [-+][\d.]+ \[[-+][\d.]+, [-+][\d.]+\] \(one-sided bootstrap p [\d.]+, "
        r"smallest detectable difference [\d.]+ points\)"), initial_prm_phrase))
    # ... and its first, level-3 design, stopped in the PRM stage: README's and the study README's account of it
    for rel in (DSM_PRM, DSM_L3):
        c.append(Claim(f"{DSM}/README.md", f"{rel}: the kept heldout_eval.json, every field", lambda _t: "as kept",
                       lambda k, rel=rel: prm_fields_as_kept(k, rel)))
    c.append(Claim("README.md", "the level-3 PRM that learned nothing", phrase(
        r"level-3 design; \d+ responses, lr 1e-5, \d+ epochs of 32 optimizer steps, \d+ right steps of \d+\) ended at "
        r"loss [\d.]+ against [\d.]+, its mean score [\d.]+ on right training steps and [\d.]+ on wrong ones, step AUC "
        r"[\d.]+ on its own training steps and [\d.]+ on held-out ones"), level3_readme_phrase))
    c.append(Claim(f"{DSM}/README.md", "the level-3 design's samples and PRM", phrase(
        r"right on \d+ of \d+ training samples and \d+ of \d+ held-out samples \([\d.]+% and [\d.]+%\), RFT kept \d+ "
        r"correct responses in its first \d+ steps of 64 samples, and its PRM learned nothing \(lr 1e-5, 64 optimizer "
        r"steps: mean score [\d.]+ on right training steps and [\d.]+ on wrong ones, step AUC [\d.]+ on its own "
        r"training steps and [\d.]+ on held-out ones"), level3_study_phrase))
    # evaluation at the engine's speed: the counted passes and the summary line of scripts/bench_eval.py,
    # recomputed from its kept JSON by the script's own functions
    for doc, anchor in (("README.md", "The timed passes and the summary line"), (f"{BENCH}/console.txt", "bench_eval:")):
        for name in ("raw", "eval"):
            for i in (1, 2):
                c.append(Claim(doc, f"bench_eval run {i} {name}", block_line(anchor, f"run {i} {name} "),
                               lambda k, name=name, i=i: _norm(_script("bench_eval").run_line(
                                   f"run {i}", name, k.json(BENCH_JSON)["runs"][name][i - 1]))))
        c.append(Claim(doc, "bench_eval summary line", block_line(anchor, "bench_eval: raw engine"),
                       lambda k: _norm(_script("bench_eval").summary_line(k.json(BENCH_JSON)))))
    return c


BENCH = "docs/results/bench_eval"
BENCH_JSON = f"{BENCH}/bench_eval.json"


def _script(name: str):
    """scripts/<name>.py beside this script (bench_eval's run_line and summary_line, summarize_run's
    read_metrics and render print the figures), loaded once, as the product's own code is imported above."""
    import importlib.util

    key = f"{name}_checked"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


ABL, ABL_STUDY = "docs/ablations/wordproblems_cpu", "configs/ablations/wordproblems_cpu.yaml"


def ablation_json(k: Kept, study_dir: str = ABL) -> str:
    kept = json.loads(k.text(f"{study_dir}/report.json"))["comparisons"]
    new = k.ablation(study_dir)["comparisons"]
    for key in ("groups", "contrasts", "rows", "primary_metric", "family_alpha"):
        if not _close(kept.get(key), new.get(key)):
            return f"comparisons.{key} differs from the regenerated report"
    return "as kept"


def _contrast(k: Kept, a: str, b: str, study_dir: str = ABL) -> dict:
    """The declared contrast B vs A of a study's regenerated report (computed)."""
    for r in k.ablation(study_dir)["comparisons"]["contrasts"]:
        if (r["a"], r["b"]) == (a, b):
            if not r.get("computed", True):
                raise NoData(f"{study_dir}: the contrast {b} vs {a} is not computed (a group is not complete)")
            return r
    raise NoData(f"{study_dir}: the report declares no contrast {b} vs {a}")


def _greedy(k: Kept, group: str) -> str:
    vals = k.ablation()["comparisons"]["groups"][group]["seed_values"]["greedy"]
    return f"{100 * sum(vals) / len(vals):.1f}"


def _span(values: list[float], sign: str = "") -> str:
    return f"{sign}{100 * min(values):.1f} to {sign}{100 * max(values):.1f}"


MAIN = ("rft", "online_rft", "grpo", "ppo")
PAIRS = (("rft", "online_rft"), ("online_rft", "grpo"), ("rft", "grpo"), ("grpo", "ppo"), ("grpo", "grpo-iterative"))
FAMILY = (("grpo", "grpo-dynamic_sampling"), ("grpo", "grpo-dr_grpo"), ("grpo", "grpo-mb2"),
          ("grpo-mb2", "grpo-mb2-clip_higher"))


def _ci_text(r: dict) -> str:
    return f"{100 * r['diff']:+.1f} [{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]"


DSM = "docs/ablations/deepseekmath_cpu"
DSM_PRM = f"{DSM}/run_archives/prm_initial-record.tar.gz"


DSM_L3 = f"{DSM}/run_archives/prm_level3-record.tar.gz"
# A study's run_archives holds its runs' folders and, named with this suffix, records of a stage (a PRM's labels
# and scores) that are not runs of the report.
RECORD_SUFFIX = "-record.tar.gz"
STUDY_FILES = {ABL: ABL_STUDY, DSM: "configs/ablations/deepseekmath_cpu.yaml"}
# The studies whose report.md / report.json are published (each is regenerated from its run archives and
# compared whole); a study in progress joins when its last run is archived.
PUBLISHED_STUDIES = (ABL, DSM)


def _jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def prm_fields_as_kept(k: Kept, rel: str) -> str:
    """Whether a PRM record's kept heldout_eval.json equals its recomputation in every field."""
    kept, again = k.prm_record(rel)["kept"], k.prm_record(rel)["again"]
    differ = [key for key in kept if kept[key] != again[key]]
    return f"differs in {differ}" if differ else "as kept"


def initial_prm_phrase(k: Kept) -> str:
    rec = k.prm_record(DSM_PRM)
    r, train = rec["again"], rec["train"]
    d = r["best_minus_majority"]
    return (f"{len(train)} training responses ({sum(bool(x['correct']) for x in train)} right, "
            f"{sum(len(x['ends']) for x in train)} steps); "
            f"on the {r['problems']:.0f} held-out problems ({r['steps']:.0f} steps) step AUC {r['step_auc']:.3f}, "
            f"best-of-8 by the weakest step {100 * r['best_of_n']:.1f}% against majority voting "
            f"{100 * r['majority']:.1f}% and a random response {100 * r['random']:.1f}%; best-of-8 minus majority "
            f"{_ci_text(d)} (one-sided bootstrap p {d['p_le_0']:.3f}, smallest detectable difference "
            f"{100 * d['mde']:.1f} points)")


def level3_prm(k: Kept) -> dict:
    """The level-3 design's figures (``_level3_prm``), computed once per check and kept in ``k``."""
    return k.once("level3_prm", _level3_prm)


def _level3_prm(k: Kept) -> dict:
    """The figures of the CPU study's first (level-3) design, from its PRM record: sample counts, the PRM's
    training log (epochs, last loss), the loss of predicting the soft labels' mean (mathrl's constant_loss), the
    PRM's mean score on right and wrong training steps and its step AUC on training and held-out steps, and RFT's
    correct responses over the logged sampling steps. The last loss is the log's text, as printed."""
    from mathrl.algo.process import constant_loss, roc_auc

    rec = k.prm_record(DSM_L3)
    train, scores, log = rec["train"], rec["train_scores"], rec["log"] or ""
    if scores is None or not log:
        raise NoData(f"{DSM_L3} lacks train_step_scores.json or study.log")
    steps = [(p, h > 0.5) for r, ps in zip(train, scores) for p, h in zip(ps, r["hard"])]
    right, wrong = [p for p, h in steps if h], [p for p, h in steps if not h]
    epochs = re.findall(r"prm train: epoch \d+/(\d+): loss", log)
    last = re.findall(r"last loss ([\d.]+)", log)
    kept_rft = [int(n) for n in re.findall(r"kept (\d+) correct responses", log)]
    if not epochs or not last or not kept_rft:
        raise NoData(f"{DSM_L3}: study.log lacks the PRM's epoch lines, its last loss or RFT's sampling lines")
    return {"responses": len(train), "right": sum(bool(r["correct"]) for r in train),
            "held": len(rec["held"]), "held_right": sum(bool(r["correct"]) for r in rec["held"]),
            "steps": len(steps), "right_steps": len(right), "epochs": int(epochs[-1]), "last_loss": last[-1],
            "constant": constant_loss([s for r in train for s in r["soft"]]),
            "mean_right": sum(right) / len(right), "mean_wrong": sum(wrong) / len(wrong),
            "auc_train": roc_auc([p for p, _ in steps], [h for _, h in steps]), "auc_held": rec["again"]["step_auc"],
            "rft_steps": len(kept_rft), "rft_kept": sum(kept_rft)}


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%"


def _scores_text(f: dict) -> str:
    return (f"mean score {f['mean_right']:.3f} on right training steps and {f['mean_wrong']:.3f} on wrong ones, "
            f"step AUC {f['auc_train']:.2f} on its own training steps and {f['auc_held']:.2f} on held-out ones")


def level3_readme_phrase(k: Kept) -> str:
    f = level3_prm(k)
    return (f"level-3 design; {f['responses']} responses, lr 1e-5, {f['epochs']} epochs of 32 optimizer steps, "
            f"{f['right_steps']} right steps of {f['steps']}) ended at loss {f['last_loss']} against "
            f"{f['constant']:.3f}, its {_scores_text(f)}")


def level3_study_phrase(k: Kept) -> str:
    f = level3_prm(k)
    return (f"right on {f['right']} of {f['responses']} training samples and {f['held_right']} of {f['held']} "
            f"held-out samples ({_pct(f['right'], f['responses'])} and {_pct(f['held_right'], f['held'])}), RFT kept "
            f"{f['rft_kept']} correct responses in its first {f['rft_steps']} steps of 64 samples, and its PRM "
            f"learned nothing (lr 1e-5, 64 optimizer steps: {_scores_text(f)}")


# The DeepSeekMath CPU study's results, as README and the study README print them: one row per group (seeds
# pooled; 'initial model' = the same seeds' evaluations of the initial model) and one per declared contrast.
DSM_NAMES = {"before": "initial model", "rft": "RFT", "online_rft": "online RFT", "dpo": "DPO", "grpo": "GRPO",
             "grpo_ps": "GRPO+PS", "ppo": "PPO", "grpo-iterative": "iterative GRPO",
             "grpo_ps-iterative": "iterative GRPO+PS"}
DSM_GROUPS_ANCHOR = "| group (seeds 0, 1) | pass@1: mean (per seed) | greedy | pass@8 | maj@8 |"
DSM_CONTRASTS_ANCHOR = "| declared contrast, pass@1 (B vs A) | B - A [95% CI] | Holm p | MDE | verdict |"


def _dsm_seed_values(k: Kept, group: str) -> dict[str, list[float]]:
    groups = k.ablation(DSM)["comparisons"]["groups"]
    if group != "before":
        return groups[group]["seed_values"]
    before = [g["before_seed_values"] for g in groups.values()]
    if any(b != before[0] for b in before):
        raise NoData(f"{DSM}: the groups' evaluations of the initial model differ (seeds or baselines)")
    return before[0]


def dsm_group_row(k: Kept, group: str) -> str:
    vals = _dsm_seed_values(k, group)

    def mean(metric: str) -> str:
        return f"{100 * sum(vals[metric]) / len(vals[metric]):.1f}"
    per_seed = ", ".join(f"{100 * v:.1f}" for v in vals["pass@1"])
    return row(DSM_NAMES[group], f"{mean('pass@1')} ({per_seed})", mean("greedy"), mean("pass@8"), mean("maj@8"))


def _dsm_verdict(r: dict) -> str:
    if not r["survives"]:  # the MDE column says what it could have detected; the interval what is compatible
        return "not significant"
    hi, lo = (r["b"], r["a"]) if r["diff"] > 0 else (r["a"], r["b"])
    return f"{DSM_NAMES[hi]} above {DSM_NAMES[lo]}"


def dsm_contrast_row(k: Kept, a: str, b: str) -> str:
    r = _contrast(k, a, b, DSM)
    return row(f"{DSM_NAMES[b]} vs {DSM_NAMES[a]}", _ci_text(r), f"{r['p_holm']:.3f}", f"{100 * r['mde']:.1f}",
               _dsm_verdict(r))


def dsm_contrasts(root: Path) -> list[tuple[str, str]]:
    """The study's declared family (``study.contrasts`` of its study file), in its order: one claimed row each."""
    from mathrl.ablate.study import load_study

    return load_study(root / STUDY_FILES[DSM]).contrasts


def dsm_survivors_phrase(k: Kept) -> str:
    contrasts = k.ablation(DSM)["comparisons"]["contrasts"]
    return f"{sum(r['survives'] for r in contrasts)} of the {len(contrasts)} declared contrasts survive"


def dsm_maj_pass_phrase(k: Kept) -> str:
    """DeepSeekMath's Fig. 7 reading, exploratory: per trained group, whether maj@8 gained more than pass@8 (the
    uncorrected interval of the per-problem difference of gains above 0), and whether pass@8 fell."""
    rows = k.ablation(DSM)["comparisons"]["rows"]
    gains = [r for r in rows if r["kind"] == "maj gain - pass gain"]
    falls = [r for r in rows if r["kind"] == "vs before" and r["metric"] == "pass@8"]
    return (f"maj@8 gained more than pass@8 in {sum(r['lo'] > 0 for r in gains)} of the {len(gains)} methods, and "
            f"pass@8 fell below the initial model's in {sum(r['hi'] < 0 for r in falls)}")


DSM_DOCS = ("README.md", f"{DSM}/README.md")


def dsm_results(root: Path) -> list[tuple[str, Callable[[str], str], Callable[[Kept], str]]]:
    """What README and the study README claim of the study's results: a row per group, a row per declared
    contrast of the study file, the count of survivors and the exploratory Maj@K-vs-Pass@K reading."""
    return [
        *((f"{DSM_NAMES[g]}: pass@1, greedy, pass@8, maj@8", table_row(DSM_GROUPS_ANCHOR, DSM_NAMES[g]),
           lambda k, g=g: dsm_group_row(k, g)) for g in DSM_NAMES),
        *((f"declared contrast {DSM_NAMES[b]} vs {DSM_NAMES[a]}",
           table_row(DSM_CONTRASTS_ANCHOR, f"{DSM_NAMES[b]} vs {DSM_NAMES[a]}"),
           lambda k, a=a, b=b: dsm_contrast_row(k, a, b)) for a, b in dsm_contrasts(root)),
        ("how many declared contrasts survive Holm", phrase(r"\d+ of the \d+ declared contrasts survive"),
         dsm_survivors_phrase),
        ("maj@8 gain vs pass@8 gain (exploratory)", phrase(
            r"maj@8 gained more than pass@8 in \d+ of the \d+ methods, and pass@8 fell below the initial model's in "
            r"\d+"), dsm_maj_pass_phrase),
    ]


ABLATION_README: list[tuple[str, str, Callable[[Kept], str]]] = [
    ("greedy after training per method", r"\(RFT [\d.]+, online RFT [\d.]+, GRPO [\d.]+, PPO [\d.]+;",
     lambda k: "(RFT {}, online RFT {}, GRPO {}, PPO {};".format(*(_greedy(k, g) for g in MAIN))),
    ("uncorrected p of the main methods vs before", r"uncorrected p [\d.]+-[\d.]+; iterative GRPO [\d.]+\)",
     lambda k: "uncorrected p {:.3f}-{:.3f}; iterative GRPO {})".format(
         min(_contrast(k, "before", g)["p"] for g in MAIN), max(_contrast(k, "before", g)["p"] for g in MAIN),
         _greedy(k, "grpo-iterative"))),
    ("how many declared contrasts, how many survive",
     r"none of the \d+ declared greedy contrasts \(\d+ groups against the initial model, \d+ method pairs",
     lambda k: "none of the {} declared greedy contrasts ({} groups against the initial model, {} method pairs".format(
         *(lambda cs: (len(cs) if not any(r["survives"] for r in cs) else "SOME",
                       sum(r["a"] == "before" for r in cs), sum(r["a"] != "before" for r in cs)))(
             k.ablation()["comparisons"]["contrasts"]))),
    ("smallest Holm-adjusted p", r"smallest adjusted p [\d.]+",
     lambda k: f"smallest adjusted p {min(r['p_holm'] for r in k.ablation()['comparisons']['contrasts']):.2f}"),
    ("gains and their MDEs", r"gains of \+[\d.]+ to \+[\d.]+ points sit below the [\d.]+-[\d.]+ points",
     lambda k: "gains of {} points sit below the {} points".format(
         _span([_contrast(k, "before", g)["diff"] for g in MAIN], "+"),
         _span([_contrast(k, "before", g)["mde"] for g in MAIN]).replace(" to ", "-"))),
    ("between-method MDEs", r"no greedy difference larger than [\d.]+-[\d.]+ points",
     lambda k: "no greedy difference larger than {} points".format(
         _span([_contrast(k, a, b)["mde"] for a, b in PAIRS]).replace(" to ", "-"))),
    ("exploratory pair intervals excluding 0", r"\d+ of the \d+ uncorrected method-pair intervals exclude 0",
     lambda k: "{} of the {} uncorrected method-pair intervals exclude 0".format(
         *(lambda rows: (sum(r["lo"] > 0 or r["hi"] < 0 for r in rows), len(rows)))(
             [r for r in k.ablation()["comparisons"]["rows"] if r["kind"] == "pair"]))),
    ("Dr. GRPO vs GRPO", r"Dr\. GRPO \([-+][\d.]+ \[[-+][\d.]+, [-+][\d.]+\] vs GRPO\)",
     lambda k: f"Dr. GRPO ({_ci_text(_contrast(k, 'grpo', 'grpo-dr_grpo'))} vs GRPO)"),
    ("clip-higher vs its control", r"\+[\d.]+ \[[-+][\d.]+, [-+][\d.]+\] vs its control",
     lambda k: f"{_ci_text(_contrast(k, 'grpo-mb2', 'grpo-mb2-clip_higher'))} vs its control"),
    ("GRPO-family MDEs", r"their [\d.]+-[\d.]+-point MDEs",
     lambda k: "their {}-point MDEs".format(_span([_contrast(k, a, b)["mde"] for a, b in FAMILY]).replace(" to ", "-"))),
]


# Figures withdrawn because their per-problem samples were not kept: (document, what, the note the document
# must carry). Their numbers are in the git history (the first commit listed in the note).
WITHDRAWN: list[tuple[str, str, str]] = [
    ("README.md", "the demo's three-seed table (seeds 0, 1, 2, 2026-11-30) and its reading",
     "The three-seed table is withdrawn"),
    ("README.md", "the demo's figures before the fact partition (greedy 0.438 -> 0.896)",
     "The figures measured that way are withdrawn"),
    ("README.md", "another machine's demo run (greedy 0.906 / pass@1 0.734 / maj@4 0.844)",
     "its figures are withdrawn: its per-problem samples were not kept"),
    ("README.md", "demo vs TRL held-out accuracies and 'per step the two learn alike'",
     "The held-out accuracies of this comparison are withdrawn"),
    ("README.md", "SVAMP before/after 80 steps (full test) and the 40-step checkpoint on SVAMP",
     "The SVAMP figures of this run are withdrawn"),
    ("README.md", "word problems vs TRL accuracies (first 300 SVAMP) and paired comparisons",
     "The SVAMP accuracies of this comparison are withdrawn"),
    ("README.md", "evaluation of the embedded model (GSM8K 50, MATH-500 level 1; eval/results/ removed)",
     "This table is withdrawn"),
    ("README.md", "the cpu_demo ablation table and its reading (Fig. 7 finding, orderings)",
     "The cpu_demo study's figures are withdrawn"),
    (f"{WP}/README.md", "SVAMP before/after 80 steps, the 40-step SVAMP evaluation, the trainer's 100-problem check",
     "The SVAMP figures are withdrawn"),
    ("docs/results/demo_vs_trl/README.md", "the series table (initial model, mathrl steps 4/8/12, TRL steps 2-4)",
     "The held-out figures are withdrawn"),
    ("docs/results/wordproblems_vs_trl/README.md", "the series table and the three paired comparisons",
     "The SVAMP figures (the series table of both runs and the three paired comparisons) are withdrawn"),
    ("README.md", "the grpo_family and grpo_family_async held-out accuracies (the option tables keep run facts)",
     "The held-out accuracies of these two runs are withdrawn"),
] + [(f"docs/ablations/{name}/report.md", "the report's held-out accuracies (kept for the record)",
      "The held-out accuracies in this report are withdrawn") for name in ("grpo_family", "grpo_family_async", "cpu_demo")]

# Files under the scanned folders that hold no recomputable figure (or whose figures are listed above).
NOT_CLAIMS: dict[str, str] = {
    r".*/README\.md": "the document itself: its figures are claims above or withdrawn",
    r".*\.png": "a plot",
    r".*/config\.yaml": "the run's resolved config",
    r".*\.sh": "the script that ran a measurement",
    rf"{DEMO}/metrics\.jsonl": "the demo's metrics log (training curve, step lines of console.txt)",
    r"docs/ablations/(grpo_family|grpo_family_async|cpu_demo)/report\.(md|json)":
        "a study report whose held-out accuracies are withdrawn (its report.md says so; listed in WITHDRAWN)",
    rf"{WP}/(rerun_40steps|first_run)/metrics_summary\.md":
        "10-step means of a training metrics log that was not kept (training curves, not an evaluation)",
}
SCANNED = ("docs/results", "eval/results", "docs/ablations")


def check(root: Path, out=print) -> int:
    k = Kept(root)
    bad = 0
    documents = set()
    for claim in _claims(root):
        documents.add(root / claim.doc)
        try:
            printed = claim.printed(k.text(claim.doc))
            computed = claim.computed(k)
        except NoData as exc:
            out(f"NO DATA   {claim.doc}: {claim.where}: {exc}")
            bad += 1
            continue
        except LookupError as exc:
            out(f"MISMATCH  {claim.doc}: {claim.where}: not printed as expected ({exc})")
            bad += 1
            continue
        if printed == computed:
            out(f"ok        {claim.doc}: {claim.where}")
        else:
            bad += 1
            out(f"MISMATCH  {claim.doc}: {claim.where}\n    printed:    {printed[:400]}\n    recomputed: {computed[:400]}")
    for doc, what, note in WITHDRAWN:
        text = (root / doc).read_text(encoding="utf-8") if (root / doc).is_file() else ""
        if _norm(note) in _norm(text):
            out(f"withdrawn {doc}: {what}")
        else:
            bad += 1
            out(f"MISMATCH  {doc}: {what} is listed as withdrawn but the document has no note {note!r}")
    checked = k.used | documents
    for top in SCANNED:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or path in checked or any(re.fullmatch(p, rel) for p in NOT_CLAIMS):
                continue
            bad += 1
            out(f"NO DATA   {rel}: a result file no claim recomputes (add a claim, or withdraw it and remove it)")
    out(f"{'FAILED' if bad else 'all recorded figures recompute'}: {bad} problem(s)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=REPO, help="the repository (or a copy of it) to check")
    args = ap.parse_args(argv)
    return check(args.root.resolve())


if __name__ == "__main__":
    sys.exit(main())
