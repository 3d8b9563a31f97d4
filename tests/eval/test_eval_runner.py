"""Grading, answer clustering and summaries of the runner, with the real verifier."""

from __future__ import annotations

import json

import pytest

from mathrl.eval.runner import (
    EvalSettings, cluster_answers_batch, grade_records, per_problem_scores, read_records, regrade_records,
    summarize, write_records,
)
from mathrl.eval.metrics import cluster_answers


def _rec(pid, gold, texts, *, greedy=None, meta=None, finish=None):
    finish = finish or ["stop"] * len(texts)
    rec = {"id": pid, "source": "t", "question": "q", "gold": gold, "meta": meta or {},
           "samples": [{"text": t, "finish_reason": f, "tokens": len(t.split())} for t, f in zip(texts, finish)]}
    if greedy is not None:
        rec["greedy"] = {"text": greedy, "finish_reason": "stop", "tokens": 3}
    return rec


def test_equivalent_wrong_answers_vote_together():
    # gold 3; three differently written halves outvote the one correct sample
    s = EvalSettings(n=4, ks=(1, 4), greedy=False, timeout=10.0)
    rec = _rec("p0", "3", ["\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "\\boxed{1/2}", "\\boxed{3}"])
    grade_records([rec], s)
    assert [x["correct"] for x in rec["samples"]] == [False, False, False, True]
    labels = rec["answer_class"]
    assert labels[0] == labels[1] == labels[2] != labels[3] == 0
    scores = per_problem_scores(rec, s)
    assert scores["pass@1"] == 0.25 and scores["pass@4"] == 1.0
    assert scores["maj@4"] == 0.0  # grouping by string would give a 4-way tie: 0.25


def test_correct_answers_in_different_forms_win_the_vote():
    s = EvalSettings(n=4, ks=(1, 3, 4), greedy=False, timeout=10.0)
    rec = _rec("p0", "\\frac{1}{2}", ["\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{7}", "no idea"])
    grade_records([rec], s)
    assert rec["answer_class"][3] is None  # no answer: abstains
    assert rec["num_correct"] == 2
    sc = per_problem_scores(rec, s)
    # k=4: correct class has 2 votes vs 1 -> 1. k=3: subsets of 3 of 4 -> {.5,1/2,7}:1 {.5,1/2,-}:1
    # {.5,7,-}: tie 1/2, {1/2,7,-}: tie 1/2 -> (1+1+.5+.5)/4 = 0.75
    assert sc["maj@4"] == 1.0 and sc["maj@3"] == pytest.approx(0.75)


def test_truncated_responses_need_an_explicit_answer():
    s = EvalSettings(n=2, ks=(1, 2), greedy=False)
    rec = _rec("p0", "12", ["so the total is 12", "the answer is 12."], finish=["length", "length"])
    grade_records([rec], s)
    assert rec["samples"][0]["extracted"] is None and not rec["samples"][0]["correct"]
    assert rec["samples"][1]["correct"]


def test_cluster_batch_matches_per_problem_clustering():
    answers = [["1", "2", "01", "2.0", None, "3"], ["a", "b", "a"], [None], ["5", "5.0", "6"]]
    verdicts = [[False] * 6, [False, True, False], [False], [True, False, False]]

    def eq(a, b):
        try:
            return float(a) == float(b)
        except ValueError:
            return a == b

    calls = []

    def eq_batch(pairs):
        calls.append(len(pairs))
        return [eq(a, b) for a, b in pairs]

    got = cluster_answers_batch(answers, verdicts, eq_batch)
    want = [cluster_answers(a, v, eq) for a, v in zip(answers, verdicts)]
    assert got == want
    # one verifier call per round; problem 0 has 5 distinct wrong answers, the first round has no leader yet
    assert calls == [2, 2, 2, 2]


def test_summary_metrics_breakdown_and_intervals(tmp_path):
    s = EvalSettings(n=2, ks=(1, 2), greedy=True, ci_resamples=500)
    recs = [
        _rec("a", "1", ["\\boxed{1}", "\\boxed{2}"], greedy="\\boxed{1}", meta={"level": 1, "subject": "Algebra"}),
        _rec("b", "1", ["\\boxed{1}", "\\boxed{1}"], greedy="\\boxed{1}", meta={"level": 1, "subject": "Geometry"}),
        _rec("c", "5", ["\\boxed{4}", "\\boxed{4}"], greedy="\\boxed{5}", meta={"level": 2, "subject": "Algebra"}),
        _rec("d", "5", ["\\boxed{3}", "\\boxed{5}"], greedy="\\boxed{3}", meta={"level": 2, "subject": "Algebra"},
             finish=["stop", "length"]),
    ]
    grade_records(recs, s)
    summ = summarize(recs, s, name="toy")
    m = summ["metrics"]
    assert m["greedy"]["value"] == pytest.approx(0.75)
    assert m["pass@1"]["value"] == pytest.approx((0.5 + 1 + 0 + 0.5) / 4)
    assert m["pass@2"]["value"] == pytest.approx((1 + 1 + 0 + 1) / 4)
    assert m["maj@2"]["value"] == pytest.approx((0.5 + 1 + 0 + 0.5) / 4)  # 1-1 ties share credit
    for v in m.values():
        assert v["ci"][0] <= v["value"] <= v["ci"][1]
    lo, hi = m["greedy"]["wilson"]
    assert lo < 0.75 < hi
    assert summ["truncation_rate"] == pytest.approx(1 / 8)
    lv = summ["breakdown"]["level"]
    assert set(lv) == {"1", "2"} and lv["1"]["problems"] == 2
    assert lv["1"]["metrics"]["pass@1"]["value"] == pytest.approx(0.75)
    assert summ["breakdown"]["subject"]["Algebra"]["problems"] == 3

    # records round-trip through JSONL and re-grade to the same summary
    path = write_records(tmp_path / "toy" / "samples.jsonl", recs)
    back = read_records(path)
    assert back == json.loads(json.dumps(recs))
    again = summarize(regrade_records(back, s), s, name="toy")
    assert again["metrics"] == summ["metrics"]


def test_settings_validation():
    with pytest.raises(ValueError):
        EvalSettings(n=4, ks=(1, 8))
    assert EvalSettings(n=8, ks=(8, 1, 4, 4)).ks == (1, 4, 8)


def _toy_run(tmp_path, name, texts_per_problem, golds):
    return _toy_runs(tmp_path, name, {"toy": (texts_per_problem, golds)})


def test_compare_paired_gain(tmp_path):
    from mathrl.eval.compare import compare_summaries

    golds = [str(i) for i in range(30)]
    before = [["\\boxed{x}", "\\boxed{x}"] if i < 20 else [f"\\boxed{{{i}}}"] * 2 for i in range(30)]
    after = [[f"\\boxed{{{i}}}"] * 2 if i < 10 or i >= 20 else ["\\boxed{x}"] * 2 for i in range(30)]
    da, a = _toy_run(tmp_path, "before", before, golds)
    db, b = _toy_run(tmp_path, "after", after, golds)
    assert (da / "report.md").is_file() and (da / "pass_at_k.png").is_file()
    cmp = compare_summaries(a, b, da, db, resamples=500)
    row = cmp["benchmarks"]["toy"]["metrics"]["pass@1"]
    assert row["a"] == pytest.approx(1 / 3) and row["b"] == pytest.approx(2 / 3)
    assert row["paired"] and row["diff"] == pytest.approx(1 / 3)
    assert row["diff_ci"][0] > 0.1 and row["p_b_le_a"] == 0.0
    # without the per-problem records the difference is reported unpaired
    unpaired = compare_summaries(a, b)["benchmarks"]["toy"]["metrics"]["pass@1"]
    assert not unpaired["paired"] and "diff_ci" not in unpaired


def test_compare_pairs_the_problems_both_runs_scored(tmp_path):
    """Issue 38 point 11: 8 vs 4 problems was reported 'unpaired'; now B - A is paired over the 4 shared
    problems and the report says so."""
    from mathrl.eval.compare import compare_summaries, format_compare

    golds = [str(i) for i in range(8)]
    before = [["\\boxed{x}"] * 2] * 8                             # none right
    after = [[f"\\boxed{{{i}}}"] * 2 for i in range(4)]           # the first 4 problems, all right
    da, a = _toy_run(tmp_path, "eight", before, golds)
    db, b = _toy_run(tmp_path, "four", after, golds[:4])
    cmp = compare_summaries(a, b, da, db, resamples=300)
    bench = cmp["benchmarks"]["toy"]
    assert bench["paired"] and bench["shared"] == 4 and bench["problems"] == [8, 4]
    row = bench["metrics"]["pass@1"]
    assert row["paired"] and row["diff"] == pytest.approx(1.0) and row["diff_ci"] == [pytest.approx(1.0)] * 2
    assert "paired over the 4 problems both scored" in format_compare(cmp)


def _toy_runs(tmp_path, name, benches: dict):
    """An evaluation folder with several benchmarks: ``benches`` maps a name to (texts per problem, golds)."""
    from mathrl.eval.report import write_report

    s = EvalSettings(n=2, ks=(1, 2), greedy=False, ci_resamples=300)
    d, summary = tmp_path / name, {"model": name, "command": "test", "backend": "none", "settings": s.to_dict(),
                                   "benchmarks": {}}
    for bench, (texts, golds) in benches.items():
        recs = [_rec(f"p{i}", g, t) for i, (t, g) in enumerate(zip(texts, golds))]
        grade_records(recs, s)
        write_records(d / bench / "samples.jsonl", recs)
        summary["benchmarks"][bench] = summarize(recs, s, name=bench)
    write_report(d, summary)
    return d, summary


def test_compare_adjusts_every_rows_p_over_the_whole_comparison(tmp_path):
    """Every row of --compare is a test: Holm's adjustment runs over the p-values of all benchmarks and metrics
    of the comparison (here 2 benchmarks x pass@1, pass@2, maj@2 = 6), so the smallest p is multiplied by 6,
    and the table and compare.md say what Holm p is."""
    from mathrl.eval.compare import compare_markdown, compare_summaries, format_compare

    golds = [str(i) for i in range(30)]
    right, wrong, half = (lambda i: [f"\\boxed{{{i}}}"] * 2), (lambda i: ["\\boxed{x}"] * 2), \
        (lambda i: [f"\\boxed{{{i}}}", "\\boxed{x}"])
    # A: problems 0-9 right; B on toy: 2-15 right (6 gained, 2 lost); B on toy2: one of two samples right on 0-15
    a_texts = [right(i) if i < 10 else wrong(i) for i in range(30)]
    b_toy = [wrong(i) if i < 2 else right(i) if i < 16 else wrong(i) for i in range(30)]
    b_toy2 = [half(i) if i < 16 else wrong(i) for i in range(30)]
    da, a = _toy_runs(tmp_path, "a", {"toy": (a_texts, golds), "toy2": (a_texts, golds)})
    db, b = _toy_runs(tmp_path, "b", {"toy": (b_toy, golds), "toy2": (b_toy2, golds)})
    cmp = compare_summaries(a, b, da, db, resamples=400)
    rows = [r for bench in ("toy", "toy2") for r in cmp["benchmarks"][bench]["metrics"].values()]
    assert cmp["holm_family"] == len(rows) == 6 and all("p_holm" in r for r in rows)
    ps = sorted(r["p_b_le_a"] for r in rows)
    assert 0 < ps[0] < ps[-1] < 1                                      # real, different p-values
    low = min(rows, key=lambda r: r["p_b_le_a"])
    assert low["p_holm"] == pytest.approx(min(1.0, 6 * low["p_b_le_a"]))  # 6 tests, not 3 per benchmark
    assert all(r["p_holm"] >= r["p_b_le_a"] for r in rows)
    assert "Holm p" in format_compare(cmp).splitlines()[2]
    assert "adjusted over the 6 p-values of this comparison" in format_compare(cmp)
    md = compare_markdown(cmp, da, db)
    assert "| p(B<=A) | Holm p |" in md and "adjusted over the 6 p-values" in md


def test_find_checkpoints_layouts(tmp_path):
    from mathrl.eval.series import find_checkpoints

    for rel in ("checkpoints/step_000020/policy", "checkpoints/step_000005/policy", "checkpoint-7",
                "checkpoints/.tmp-step_000030/policy", "checkpoints/step_000040"):
        (tmp_path / rel).mkdir(parents=True)
    for rel in ("checkpoints/step_000020/policy", "checkpoints/step_000005/policy", "checkpoint-7",
                "checkpoints/.tmp-step_000030/policy"):
        (tmp_path / rel / "config.json").write_text("{}")
    found = find_checkpoints(tmp_path)
    assert [s for s, _ in found] == [5, 7, 20]  # tmp folder and the one without a model are skipped
    assert found[0][1].name == "policy" and found[1][1].name == "checkpoint-7"
