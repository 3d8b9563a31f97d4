"""The benchmark runner: render prompts, sample with a rollout engine, grade, record, summarise.

Flow for one benchmark (:func:`evaluate_benchmark`):

1. render every problem with the prompt template (the model's chat template);
2. per chunk of prompts, sample ``n`` responses (``SamplingConfig`` from the
   settings; one seed per chunk derived from ``settings.seed``) and, when
   ``settings.greedy``, one greedy response (temperature 0);
3. grade all responses with the verifier (:func:`mathrl.reward.grade_batch`,
   hard timeout per response; a response cut at the length limit only counts
   with an explicit final-answer marker);
4. group each problem's extracted answers into classes of verified
   equivalence for maj@k (:func:`cluster_answers_batch`);
5. write one JSON line per problem (every sample's text, extracted answer,
   verdict, finish reason, length) and compute the summary from those records
   (:func:`summarize`), so a saved run can be re-summarised or re-graded
   without generating again (:func:`regrade_records`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mathrl.eval.metrics import (
    bootstrap_ci, cluster_answers, maj_at_k, mean, pass_at_k, wilson_interval,
)
from mathrl.eval.records import (
    JOURNAL_NAME, SAMPLES_NAME, ChunkJournal, generation_key, read_records, samples_path, write_records,
)
from mathrl.data.sources import SOURCES
from mathrl.data.templates import get_template
from mathrl.eval.settings import EvalSettings
from mathrl.progress import Progress
from mathrl.reward import grade_batch
from mathrl.reward.api import GradeStream

__all__ = ["EvalSettings", "evaluate_benchmark", "render_prompts", "chunk_sampling", "chunk_bounds", "grade_records",
           "answer_equivalence", "cluster_answers_batch", "summarize", "regrade_records", "read_records",
           "samples_path", "write_records"]

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- generation


def render_prompts(problems, settings: EvalSettings, tokenizer) -> tuple[list[str], tuple[str, ...]]:
    """Every problem's prompt (``settings.template`` with the tokenizer's chat template) and the stop
    strings of the engine calls (the template's, then ``settings.stop``)."""
    tpl = get_template(settings.template, system=settings.system_prompt)
    return [tpl.render(p, tokenizer) for p in problems], tuple(dict.fromkeys(tuple(tpl.stop) + settings.stop))


def chunk_sampling(settings: EvalSettings, stop: tuple[str, ...], chunk: int):
    """``(sampled, greedy)``: the two :class:`mathrl.rollout.SamplingConfig` of engine chunk ``chunk``
    (the n samples at the settings' temperature; the greedy response), seeded ``settings.seed + chunk``."""
    from mathrl.rollout import SamplingConfig  # here: mathrl.rollout pulls torch into `mathrl eval --help` (eval.cli start-up)

    seed = settings.seed + chunk
    return (SamplingConfig(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                           max_tokens=settings.max_tokens, stop=stop, seed=seed),
            SamplingConfig(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=settings.max_tokens, stop=stop, seed=seed))


def _sample_records(batch, g: int) -> list[list[dict]]:
    lengths = batch.response_lengths.tolist()
    out: list[list[dict]] = []
    for i in range(batch.num_prompts):
        rows = []
        for j in range(g):
            r = i * g + j
            rows.append({"text": batch.response_text[r], "finish_reason": batch.finish_reason[r],
                         "tokens": int(lengths[r])})
        out.append(rows)
    return out


def chunk_bounds(n_problems: int, settings: EvalSettings, engine=None, *, world: int = 1) -> list[tuple[int, int]]:
    """The ``(start, end)`` problem ranges of the engine calls; chunk ``j`` samples with ``seed + j``.

    At most ``settings.chunk_rows`` rows (problems x n) per call (default 256 for the hf backend,
    4096 for vLLM). With ``world`` ranks sharing the work and ``chunk_rows`` unset, a chunk is also at
    most ceil(problems / world) so that every rank gets some. The records depend only on the chunks,
    not on which rank generated them: with the same chunks a report is identical for any world size.
    """
    rows = settings.chunk_rows or (4096 if "vllm" in type(engine).__name__.lower() else 256)
    per_chunk = max(1, rows // settings.n)
    if world > 1 and settings.chunk_rows is None:
        per_chunk = min(per_chunk, max(1, -(-n_problems // world)))
    return [(s, min(s + per_chunk, n_problems)) for s in range(0, n_problems, per_chunk)]


def generate_records(engine, problems: Sequence, settings: EvalSettings, *, name: str = "",
                     log: Log = _stderr, part: tuple[int, int] = (0, 1), journal=None,
                     stream: bool = False) -> list[dict]:
    """Sample (and greedy-decode) every problem; return per-problem records, ungraded, or with every
    sample's verdict when ``stream``.

    ``stream``: grade each response while the engine generates the rest (a
    :class:`mathrl.reward.GradeStream` fed by the engine's ``on_row``; verdicts equal
    :func:`mathrl.reward.grade_batch`'s with the settings' grading options, by construction), so the
    verifier's processes use the cores the engine leaves idle instead of running after it; a chunk's
    sampled rows finish grading while its greedy rows generate.

    ``part = (rank, world)``: generate only the chunks ``j`` with ``j % world == rank`` (in chunk
    order); :func:`assemble_parts` puts the ranks' records back in problem order.
    ``journal`` (a :class:`mathrl.eval.records.ChunkJournal`): chunks it holds are taken from it, and
    each chunk generated here is added to it as soon as it is done.
    """
    rank, world = part
    prompts, stop = render_prompts(problems, settings, engine.tokenizer)

    records: list[dict] = []
    t0 = time.time()
    bounds = chunk_bounds(len(problems), settings, engine, world=world)
    mine = sum(end - start for j, (start, end) in enumerate(bounds) if j % world == rank)
    bar = Progress(mine, f"[{name}] generating" if name else "generating", unit="problem",
                   enabled=None if rank == 0 else False)
    if journal is not None and journal.chunks_done:
        log(f"[{name}] resuming: {journal.chunks_done} of {len(bounds)} chunks already generated ({journal.path})")
    for j, (start, end) in enumerate(bounds):
        if j % world != rank:
            continue
        done = journal.get(j) if journal is not None else None
        if done is not None:
            records.extend(done)
            bar.update(end - start)
            continue
        chunk = list(problems[start:end])
        chunk_prompts = prompts[start:end]
        sp, gp = chunk_sampling(settings, stop, j)
        golds = [p.gold for p in chunk]
        sampled_stream = _grade_stream(stream, golds, settings.n, settings)
        sampled = _sample_records(engine.generate(chunk_prompts, settings.n, sp, on_row=_on_row(sampled_stream)),
                                  settings.n)
        greedy: list[list[dict]] | None = None
        if settings.greedy:
            greedy_stream = _grade_stream(stream, golds, 1, settings)
            greedy = _sample_records(engine.generate(chunk_prompts, 1, gp, on_row=_on_row(greedy_stream)), 1)
            _take_grades(greedy_stream, greedy)
        _take_grades(sampled_stream, sampled)
        chunk_records = []
        for i, p in enumerate(chunk):
            rec = {"id": p.id, "source": p.source, "question": p.question, "gold": p.gold,
                   "meta": {k: v for k, v in p.meta.items() if k in ("subject", "level", "expression")},
                   "prompt": chunk_prompts[i], "samples": sampled[i]}
            if greedy is not None:
                rec["greedy"] = greedy[i][0]
            chunk_records.append(rec)
        if journal is not None:
            journal.add(j, chunk_records)
        records.extend(chunk_records)
        bar.update(end - start)
        if not bar.enabled:  # the bar shows the same on a terminal
            log(f"[{name}] generated {end}/{len(problems)} problems x {settings.n} samples"
                f"{' + greedy' if settings.greedy else ''} ({time.time() - t0:.0f} s)"
                + (f" on rank {rank} of {world}" if world > 1 else ""))
    bar.close()
    return records


def _grade_stream(stream: bool, golds: list[str], n: int, settings: EvalSettings):
    return GradeStream([g for g in golds for _ in range(n)], settings.grading) if stream else None


def _on_row(stream):
    return None if stream is None else stream.on_row


def _take_grades(stream, rows: list[list[dict]]) -> None:
    """Write the verdicts of ``stream`` (fed while ``rows`` were generated) into the rows."""
    if stream is None:
        return
    flat = [r for group in rows for r in group]
    grades = stream.finish([r["text"] for r in flat], [r["finish_reason"] == "length" for r in flat])
    for row, g in zip(flat, grades):
        row["extracted"], row["correct"], row["reason"] = g.extracted, bool(g.correct), g.reason


def assemble_parts(parts: Sequence[Sequence[dict]], bounds: Sequence[tuple[int, int]]) -> list[dict]:
    """Records of every rank (``parts[r]`` from ``generate_records(..., part=(r, len(parts)))``) in
    problem order: chunk ``j`` is the next ``end - start`` records of rank ``j % world``."""
    world = len(parts)
    taken = [0] * world
    out: list[dict] = []
    for j, (start, end) in enumerate(bounds):
        r = j % world
        out.extend(parts[r][taken[r]:taken[r] + end - start])
        taken[r] += end - start
    if taken != [len(p) for p in parts] or len(out) != (bounds[-1][1] if bounds else 0):
        raise ValueError(f"rank records do not match the chunks: got {[len(p) for p in parts]}, used {taken}")
    return out


# --------------------------------------------------------------------------- grading


def _default_grader(settings: EvalSettings):

    options = settings.grading

    def grade(responses: list[str], golds: list[str], truncated: list[bool]):
        return grade_batch(responses, golds, options, truncated=truncated)

    return grade


def grade_records(records: list[dict], settings: EvalSettings, grader=None) -> list[dict]:
    """Fill in every sample's ``extracted``, ``correct``, ``reason``, then the answer classes.

    ``grader(responses, golds, truncated) -> list[Grade]`` defaults to
    :func:`mathrl.reward.grade_batch` with the settings' grading options (:attr:`EvalSettings.grading`).
    A response with finish reason ``length`` is graded as truncated. Rows that already carry a verdict
    (graded while they were generated, :func:`generate_records` with ``stream``) keep it.
    """
    grader = grader or _default_grader(settings)
    texts, golds, truncs, slots = [], [], [], []
    for rec in records:
        rows = rec["samples"] + ([rec["greedy"]] if "greedy" in rec else [])
        for row in rows:
            if "correct" in row:
                continue
            texts.append(row["text"])
            golds.append(rec["gold"])
            truncs.append(row["finish_reason"] == "length")
            slots.append(row)
    grades = grader(texts, golds, truncs) if texts else []
    for row, g in zip(slots, grades):
        row["extracted"] = g.extracted
        row["correct"] = bool(g.correct)
        row["reason"] = g.reason
    answers = [[s.get("extracted") for s in rec["samples"]] for rec in records]
    verdicts = [[bool(s.get("correct")) for s in rec["samples"]] for rec in records]

    clustered = cluster_answers_batch(answers, verdicts, answer_equivalence(grader))
    for rec, (labels, correct) in zip(records, clustered):
        rec["answer_class"] = labels
        rec["correct_classes"] = sorted(correct)
        rec["num_correct"] = sum(1 for s in rec["samples"] if s.get("correct"))
    return records


def answer_equivalence(grader) -> Callable[[list[tuple[str, str]]], list[bool]]:
    """The verifier's equivalence of extracted answers for majority voting: ``eq_batch(pairs)`` grades each
    ``a`` (boxed) against ``b`` as the gold with ``grader(responses, golds, truncated) -> list[Grade]``."""
    def eq_batch(pairs: list[tuple[str, str]]) -> list[bool]:
        if not pairs:
            return []
        gs = grader(["\\boxed{" + a + "}" for a, _ in pairs], [b for _, b in pairs], [False] * len(pairs))
        return [bool(g.correct) for g in gs]

    return eq_batch


def cluster_answers_batch(answers: Sequence[Sequence[str | None]], verdicts: Sequence[Sequence[bool]],
                          eq_batch: Callable[[list[tuple[str, str]]], list[bool]]):
    """:func:`mathrl.eval.metrics.cluster_answers` for many problems, with batched equivalence calls.

    Gives exactly the labels of ``cluster_answers`` run per problem with
    ``equivalent(a, leader) = eq_batch([(a, leader)])[0]``, but asks the
    verifier in rounds: in round ``r`` every problem's ``r``-th distinct wrong
    answer is compared with all leaders of that problem at once (one
    ``eq_batch`` call per round, so the verifier's process pool works in parallel).
    """
    # distinct wrong answers per problem, in order of first appearance
    distinct: list[list[str]] = []
    for ans, ver in zip(answers, verdicts):
        seen: dict[str, None] = {}
        for a, ok in zip(ans, ver):
            if a is not None and a.strip() and not ok:
                seen.setdefault(a.strip(), None)
        distinct.append(list(seen))
    leaders: list[list[str]] = [[] for _ in answers]
    table: list[dict[tuple[str, str], bool]] = [{} for _ in answers]
    rounds = max((len(d) for d in distinct), default=0)
    for r in range(rounds):
        asks: list[tuple[int, str, str]] = []
        for p, d in enumerate(distinct):
            if r < len(d):
                asks.extend((p, d[r], lead) for lead in leaders[p])
        results = eq_batch([(a, lead) for _, a, lead in asks]) if asks else []
        for (p, a, lead), ok in zip(asks, results):
            table[p][(a, lead)] = ok
        for p, d in enumerate(distinct):
            if r < len(d) and not any(table[p].get((d[r], lead), False) for lead in leaders[p]):
                leaders[p].append(d[r])
    out = []
    for p, (ans, ver) in enumerate(zip(answers, verdicts)):
        t = table[p]
        out.append(cluster_answers(list(ans), list(ver), lambda a, b, t=t: t.get((a, b), False)))
    return out


# --------------------------------------------------------------------------- summary


def _ci(values: list[float], settings: EvalSettings, seed_offset: int = 0) -> list[float]:
    lo, hi = bootstrap_ci(values, resamples=settings.ci_resamples, seed=settings.seed + seed_offset,
                          level=settings.ci_level)
    return [lo, hi]


def per_problem_scores(rec: dict, settings: EvalSettings) -> dict[str, float]:
    """The per-problem values whose means are the benchmark metrics."""
    n = len(rec["samples"])
    c = rec["num_correct"]
    out: dict[str, float] = {}
    if "greedy" in rec:
        out["greedy"] = float(bool(rec["greedy"].get("correct")))
    labels = rec["answer_class"]
    correct = set(rec["correct_classes"])
    for k in settings.ks:
        if k > n:
            continue
        out[f"pass@{k}"] = pass_at_k(n, c, k)
    for k in settings.ks:
        if k > n or k == 1:
            continue
        seed = settings.seed * 1_000_003 + k
        out[f"maj@{k}"] = maj_at_k(labels, correct, k, max_exact_subsets=settings.maj_exact_subsets,
                                   resamples=settings.maj_resamples, seed=seed)
    return out


def _metric_order(settings: EvalSettings) -> list[str]:
    names = (["greedy"] if settings.greedy else []) + [f"pass@{k}" for k in settings.ks]
    return names + [f"maj@{k}" for k in settings.ks if k > 1]


def _aggregate(records: list[dict], scores: list[dict[str, float]], settings: EvalSettings,
               with_ci: bool = True) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for i, name in enumerate(_metric_order(settings)):
        vals = [s[name] for s in scores if name in s]
        if not vals:
            continue
        entry: dict[str, Any] = {"value": mean(vals)}
        if with_ci:
            entry["ci"] = _ci(vals, settings, seed_offset=i)
            if name == "greedy":
                entry["wilson"] = list(wilson_interval(sum(vals), len(vals)))
        metrics[name] = entry
    samples = [s for rec in records for s in rec["samples"]]
    return {"problems": len(records), "metrics": metrics,
            "samples": len(samples),
            "mean_length": mean([s["tokens"] for s in samples]),
            "mean_length_correct": mean([s["tokens"] for s in samples if s.get("correct")]),
            "truncation_rate": mean([float(s["finish_reason"] == "length") for s in samples]),
            "no_answer_rate": mean([float(s.get("extracted") is None) for s in samples]),
            "timeouts": sum(1 for s in samples if s.get("reason") == "timeout")}


def summarize(records: list[dict], settings: EvalSettings, *, name: str = "") -> dict[str, Any]:
    """Benchmark summary from graded records: metrics with bootstrap CIs, lengths, breakdowns.

    Metrics (means over problems): ``greedy`` (accuracy of the greedy
    response), ``pass@k`` (unbiased estimator), ``maj@k`` (expected
    majority-vote accuracy of k samples); each with a percentile-bootstrap
    interval over problems (``ci``), and the Wilson interval for ``greedy``.
    Breakdowns by ``level`` and ``subject`` (when the problems carry them) give
    the same metrics per group, without intervals.
    """
    scores = [per_problem_scores(r, settings) for r in records]
    out = {"benchmark": name, **_aggregate(records, scores, settings)}
    breakdown: dict[str, dict[str, Any]] = {}
    for key in ("level", "subject"):
        groups: dict[str, list[int]] = {}
        for i, rec in enumerate(records):
            v = rec.get("meta", {}).get(key)
            if v is not None:
                groups.setdefault(str(v), []).append(i)
        if len(groups) >= 1 and sum(len(g) for g in groups.values()) == len(records) and \
                not (key == "level" and len(groups) == 1 and all(_generated(r.get("source")) for r in records)):
            breakdown[key] = {
                g: _aggregate([records[i] for i in idx], [scores[i] for i in idx], settings, with_ci=False)
                for g, idx in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))}
    out["breakdown"] = breakdown
    return out


def _generated(source: str | None) -> bool:
    """Whether ``source`` is a generated source (its one ``level`` is a setting, not a breakdown)."""

    spec = SOURCES.get(source, None) if source else None
    return spec is not None and spec.is_generated


def _sort_key(v: str):
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)


# --------------------------------------------------------------------------- records on disk


def regrade_records(records: list[dict], settings: EvalSettings, grader=None) -> list[dict]:
    """Grade saved records again (e.g. after a verifier fix) without generating."""
    for rec in records:
        for row in rec["samples"] + ([rec["greedy"]] if "greedy" in rec else []):
            for key in ("extracted", "correct", "reason"):
                row.pop(key, None)
    return grade_records(records, settings, grader)


# --------------------------------------------------------------------------- one benchmark


@dataclass
class BenchmarkResult:
    """What :func:`evaluate_benchmark` returns."""

    name: str
    summary: dict[str, Any]
    records: list[dict] = field(repr=False)
    seconds: float = 0.0


def evaluate_benchmark(engine, problems: Sequence, settings: EvalSettings, *, name: str,
                       out_dir: str | Path | None = None, grader=None, log: Log = _stderr,
                       part: tuple[int, int] = (0, 1), gather=None, resume: bool = False,
                       model: str | None = None) -> BenchmarkResult:
    """Generate, grade and summarise one benchmark; write ``<out_dir>/<name>/samples.jsonl.gz``.

    Split over ranks: ``part = (rank, world)`` and ``gather(obj) -> [obj of rank 0, 1, ...]`` (an
    all-gather, called once on every rank). Each rank generates and grades its chunks, the graded
    records are gathered and every rank returns the same result; pass ``out_dir`` on one rank only.

    With ``out_dir`` on one rank, finished chunks are journalled (:mod:`mathrl.eval.records`);
    ``resume=True`` continues from the journal of an earlier, interrupted call with the same
    ``model``, engine, problems and settings.
    """
    if not problems:
        raise ValueError(f"benchmark {name!r} has no problems to evaluate")
    if part[1] > 1 and gather is None:
        raise ValueError("evaluate_benchmark: part=(rank, world) with world > 1 needs a gather function")
    t0 = time.time()
    journal = None
    if out_dir is not None and part[1] == 1:

        key = generation_key(problems, settings.to_dict(), chunk_bounds(len(problems), settings, engine), model,
                             type(engine).__name__)
        journal = ChunkJournal(Path(out_dir) / name / JOURNAL_NAME, key, resume=resume)
    records = generate_records(engine, problems, settings, name=name, log=log, part=part, journal=journal,
                               stream=grader is None)
    t_gen = time.time() - t0
    grade_records(records, settings, grader)
    if part[1] > 1:
        records = assemble_parts(gather(records), chunk_bounds(len(problems), settings, engine, world=part[1]))
    summary = summarize(records, settings, name=name)
    summary["seconds"] = {"generate": round(t_gen, 2), "total": round(time.time() - t0, 2)}
    if out_dir is not None:
        write_records(Path(out_dir) / name / SAMPLES_NAME, records)
        (Path(out_dir) / name / "samples.jsonl").unlink(missing_ok=True)  # an older run's, into the same folder
    if journal is not None:
        journal.finish()
    return BenchmarkResult(name=name, summary=summary, records=records, seconds=time.time() - t0)
