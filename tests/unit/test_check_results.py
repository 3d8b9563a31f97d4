"""``scripts/check_results.py`` (issue 40): every recorded evaluation figure of README and docs/results/
recomputes from the kept per-problem samples, and the check fails when a sample, a printed figure, a
kept file or a withdrawal note changes (negative controls on copies: ``--root``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from mathrl.eval.records import read_records, write_records

ROOT = Path(__file__).resolve().parents[2]
GSM_B = "docs/results/wordproblems_cpu/eval_step40_gsm8k"
DEMO_B = "docs/results/demo/eval/step_000012"
SVAMP_A = "docs/results/wordproblems_cpu/eval_svamp_base_n8"
WP_README = "docs/results/wordproblems_cpu/README.md"


def _checker():
    if "check_results" not in sys.modules:
        spec = importlib.util.spec_from_file_location("check_results", ROOT / "scripts" / "check_results.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["check_results"] = mod  # its dataclass looks its module up
        spec.loader.exec_module(mod)
    return sys.modules["check_results"]


def run(root: Path) -> tuple[int, list[str]]:
    lines: list[str] = []
    rc = _checker().check(root, out=lines.append)
    return rc, lines


def test_every_recorded_figure_recomputes_from_the_kept_samples():
    rc, lines = run(ROOT)
    assert rc == 0, "\n".join(line for line in lines if not line.startswith(("ok", "withdrawn")))
    assert sum(line.startswith("ok") for line in lines) >= 50
    assert any("GSM8K row greedy" in line for line in lines) and any("demo --compare" in line for line in lines)


@pytest.fixture
def copy(tmp_path) -> Path:
    """The files the check reads: README, docs/results/, docs/ablations/ and the ablation studies' configs."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "docs" / "results", root / "docs" / "results")
    shutil.copytree(ROOT / "docs" / "ablations", root / "docs" / "ablations")
    (root / "configs" / "ablations").mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "ablations" / "wordproblems_cpu.yaml", root / "configs" / "ablations")
    shutil.copy(ROOT / "configs" / "grpo_wordproblems_cpu.yaml", root / "configs")  # the study's base
    shutil.copy(ROOT / "configs" / "ablations" / "deepseekmath_cpu.yaml", root / "configs" / "ablations")
    shutil.copy(ROOT / "configs" / "demo.yaml", root / "configs")  # the DeepSeekMath CPU study's base
    return root


def _failures(root: Path) -> list[str]:
    rc, lines = run(root)
    bad = [line for line in lines if line.startswith(("MISMATCH", "NO DATA"))]
    assert rc == 1 and bad, lines[-1]
    return bad


@pytest.mark.slow
def test_one_flipped_sample_fails_the_figures_it_enters(copy):
    path = copy / GSM_B / "gsm8k" / "samples.jsonl.gz"
    recs = read_records(path)
    rec = next(r for r in recs if r["greedy"].get("correct"))
    rec["greedy"]["correct"] = False  # one problem's greedy answer graded wrong
    write_records(path, recs)
    bad = _failures(copy)
    assert any("README.md: GSM8K row greedy" in line for line in bad), bad
    assert any("eval_step40_gsm8k/summary.json" in line for line in bad), bad
    assert any("compare_gsm8k/compare.md" in line for line in bad), bad
    assert not any("row pass@4" in line.splitlines()[0] for line in bad), bad  # a greedy flip leaves pass@4


@pytest.mark.slow
def test_one_edited_readme_figure_fails(copy):
    text = (copy / "README.md").read_text(encoding="utf-8")
    old = "| greedy | 2.4 [1.6, 3.2] | 2.0 [1.3, 2.8] | -0.3 [-1.4, +0.8] |"
    assert text.count(old) == 1
    (copy / "README.md").write_text(text.replace(old, old.replace("2.0 [1.3", "2.1 [1.3")), encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 1 and "README.md: GSM8K row greedy" in bad[0], bad


def test_an_edited_bench_eval_pass_fails_its_lines_and_the_summary(copy):
    """The evaluation-speed figures recompute from the kept JSON: one pass's tokens/s changed there (as if
    the JSON and the printed lines disagreed) fails that pass's line and the summary line, in README and in
    the kept console, and nothing else."""
    path = copy / "docs/results/bench_eval/bench_eval.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["runs"]["eval"][1]["tok_s"] = 180.0  # run 2 of mathrl eval
    path.write_text(json.dumps(data), encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 4, bad
    for doc in ("README.md", "docs/results/bench_eval/console.txt"):
        assert any(f"{doc}: bench_eval run 2 eval" in line for line in bad), bad
        assert any(f"{doc}: bench_eval summary line" in line for line in bad), bad


def test_the_training_log_summary_and_the_trainers_checks_recompute_from_the_kept_log(copy):
    """The word-problem run's kept metrics log is the data of its 10-step summary, of README's excerpt of it
    and of the trainer's held-out checks it logged: one step's KL edited in the log fails the summary and
    README's window row of that step and nothing else; one logged check figure edited fails the check claim
    (its kept samples say otherwise) and the summary, which prints it."""
    path = copy / "docs/results/wordproblems_cpu/metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    step = next(r for r in rows if r.get("step") == 75 and "event" not in r)
    step["kl/mean"] += 0.5  # the window 71-80's mean KL moves by 0.05
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 2, bad
    assert any("wordproblems_cpu/metrics_summary.md" in line for line in bad), bad
    assert any("README.md: word-problem training window 71-80" in line for line in bad), bad

    step["kl/mean"] -= 0.5
    check = next(r for r in rows if r.get("event") == "eval" and r["step"] == 80)
    check["greedy"] += 0.01  # one more problem right than the kept samples say
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 2, bad
    assert any("metrics.jsonl: the trainer's held-out checks" in line for line in bad), bad
    assert any("wordproblems_cpu/metrics_summary.md" in line for line in bad), bad


@pytest.mark.slow
def test_the_svamp_table_and_speed_lines_recompute_from_both_kept_evaluations(copy):
    """The paired SVAMP table (README and the run's README) and each evaluation's speed line recompute from
    the kept samples and time.txt. One of the initial model's wrong greedy answers graded right fails the
    greedy rows of both tables, the run's summary row, that evaluation's summary and report and the
    comparison, and nothing that greedy does not enter; a longer wall time in that evaluation's time.txt
    fails its speed line in both documents and nothing else."""
    path = copy / SVAMP_A / "svamp" / "samples.jsonl.gz"
    recs = read_records(path)
    rec = next(r for r in recs if not r["greedy"].get("correct"))
    rec["greedy"]["correct"] = True
    write_records(path, recs)
    heads = [line.splitlines()[0] for line in _failures(copy)]
    for doc in ("README.md", WP_README):
        assert any(f"{doc}: SVAMP row greedy" in h for h in heads), heads
    for where in ("summary row SVAMP greedy (80 steps)", "eval_svamp_base_n8/summary.json",
                  "eval_svamp_base_n8/report.md", "compare_svamp_n8/compare.json", "compare_svamp_n8/compare.md"):
        assert any(where in h for h in heads), (where, heads)
    assert not any(m in h for h in heads for m in ("pass@1", "pass@4", "pass@8", "maj@8", "speed", "GSM8K")), heads

    shutil.copy(ROOT / SVAMP_A / "svamp" / "samples.jsonl.gz", path)
    time_txt = copy / SVAMP_A / "time.txt"
    text = time_txt.read_text(encoding="utf-8")
    wall = "Elapsed (wall clock) time (h:mm:ss or m:ss): "
    assert text.count(wall) == 1
    time_txt.write_text(text.replace(wall, wall + "1:"), encoding="utf-8")  # an hour longer
    heads = [line.splitlines()[0] for line in _failures(copy)]
    assert len(heads) == 2 and all("the initial model's SVAMP evaluation speed" in h for h in heads), heads


@pytest.mark.slow
def test_a_demo_sample_flipped_fails_the_demo_table(copy):
    path = copy / DEMO_B / "heldout" / "samples.jsonl.gz"
    recs = read_records(path)
    recs[0]["samples"][0]["text"] = "no answer at all"  # one sample loses its \boxed{}
    write_records(path, recs)
    bad = _failures(copy)
    assert any("demo before/after row boxed_rate" in line for line in bad), bad


@pytest.mark.slow
def test_missing_samples_an_unlisted_result_or_a_lost_withdrawal_note_fail(copy):
    (copy / GSM_B / "gsm8k" / "samples.jsonl.gz").unlink()
    bad = _failures(copy)
    assert any(line.startswith("NO DATA") and "eval_step40_gsm8k" in line for line in bad), bad

    shutil.copytree(ROOT / GSM_B, copy / GSM_B, dirs_exist_ok=True)
    new = copy / "docs" / "results" / "new_study" / "summary.json"
    new.parent.mkdir()
    new.write_text(json.dumps({"benchmarks": {}}))
    bad = _failures(copy)
    assert bad == ["NO DATA   docs/results/new_study/summary.json: a result file no claim recomputes (add a claim, "
                   "or withdraw it and remove it)"], bad

    new.unlink()
    assert run(copy)[0] == 0
    text = (copy / "README.md").read_text(encoding="utf-8")
    (copy / "README.md").write_text(text.replace("The three-seed table is withdrawn", "The three-seed table"),
                                    encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 1 and "three-seed" in bad[0], bad


@pytest.mark.slow
def test_the_ablation_summary_and_report_recompute_from_the_run_archives(copy):
    """README's reading of the word-problem study and its kept report are what the archived run folders give:
    an edited README figure, or a report whose Holm-adjusted p was rounded in its favour, fails."""
    text = (copy / "README.md").read_text(encoding="utf-8")
    assert text.count("smallest adjusted p 0.10") == 1
    (copy / "README.md").write_text(text.replace("smallest adjusted p 0.10", "smallest adjusted p 0.04"),
                                    encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 1 and "smallest Holm-adjusted p" in bad[0], bad

    (copy / "README.md").write_text(text, encoding="utf-8")
    report = copy / "docs" / "ablations" / "wordproblems_cpu" / "report.md"
    kept = report.read_text(encoding="utf-8")
    assert "| 0.1044 | no |" in kept
    report.write_text(kept.replace("| 0.1044 | no |", "| 0.0444 | yes |"), encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 1 and "wordproblems_cpu/report.md" in bad[0], bad


def test_a_prose_phrase_matches_wherever_its_line_wraps():
    # every prose claim goes through phrase(): a space of its pattern matches any white space, so re-wrapping a
    # README paragraph neither breaks a claim nor needs hand-written \s+ at today's wrap points
    find = _checker().phrase(r"smallest adjusted p [\d.]+ over \d+ contrasts")
    want = "smallest adjusted p 0.10 over 18 contrasts"
    assert find("the\nsmallest adjusted\n  p 0.10 over 18\ncontrasts, and") == want
    assert find(want) == want
    with pytest.raises(LookupError, match="no text matching"):
        find("smallest adjusted-p 0.10 over 18 contrasts")


def _rewrite_record(copy: Path, name: str, edit) -> None:
    """Unpack the DeepSeekMath CPU study's archive ``name`` (a PRM record or a run folder) in the copy, let
    ``edit(folder)`` change its files, pack it again."""
    import tarfile

    archive = copy / "docs/ablations/deepseekmath_cpu/run_archives" / f"{name}.tar.gz"
    work = copy / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    edit(work / name)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(work / name, arcname=name)
    shutil.rmtree(work)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


@pytest.mark.slow
def test_the_initial_prm_figures_recompute_from_the_archived_labels_and_scores(copy):
    """The CPU study's initial PRM: its README phrase and its kept heldout_eval.json are recomputed from the
    archived held-out labels and step scores. Every step score of one held-out problem's responses turned into
    1 - score (as if the kept result and the scores disagreed) fails exactly those two claims."""
    def invert_one_problem(folder: Path) -> None:
        path = folder / "heldout_eval.json"
        kept = json.loads(path.read_text(encoding="utf-8"))
        held = _jsonl(folder / "heldout_labels.jsonl")
        for i, r in enumerate(held):
            if r["problem_id"] == held[0]["problem_id"]:
                kept["step_scores"][i] = [1.0 - p for p in kept["step_scores"][i]]
        path.write_text(json.dumps(kept), encoding="utf-8")

    _rewrite_record(copy, "prm_initial-record", invert_one_problem)
    bad = _failures(copy)
    assert len(bad) == 2 and all("deepseekmath_cpu" in line for line in bad), bad
    assert any("the initial PRM's labels and held-out measurement" in line for line in bad), bad


@pytest.mark.slow
def test_the_level3_prm_figures_recompute_from_its_record(copy):
    """The study's first (level-3) PRM stage, which learned nothing: README's and the study README's figures
    are recomputed from its record (labels, the PRM's score of every training step, the stage's log). Right
    training steps scored 0.9 (a PRM that had learned) fail exactly those two claims; the log's last loss
    changed fails only README's (the one that prints it)."""
    def right_steps_high(folder: Path) -> None:
        train = _jsonl(folder / "labels.jsonl")
        path = folder / "train_step_scores.json"
        scores = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps([[0.9 if h > 0.5 else p for p, h in zip(ps, r["hard"])]
                                    for ps, r in zip(scores, train)]), encoding="utf-8")

    _rewrite_record(copy, "prm_level3-record", right_steps_high)
    bad = _failures(copy)
    assert len(bad) == 2 and all("level-3" in line for line in bad), bad

    def other_loss(folder: Path) -> None:
        log = folder / "study.log"
        log.write_text(log.read_text(encoding="utf-8").replace("last loss 0.4985", "last loss 0.1000"),
                       encoding="utf-8")

    shutil.copy(ROOT / "docs/ablations/deepseekmath_cpu/run_archives/prm_level3-record.tar.gz",
                copy / "docs/ablations/deepseekmath_cpu/run_archives/prm_level3-record.tar.gz")
    _rewrite_record(copy, "prm_level3-record", other_loss)
    bad = _failures(copy)
    assert len(bad) == 1 and "README.md: the level-3 PRM that learned nothing" in bad[0], bad


@pytest.mark.slow
def test_a_prm_record_without_a_required_file_is_no_data(copy):
    """A PRM record that lost its held-out labels reports NO DATA for the claims that read it, naming the
    archive and the missing member, instead of stopping the check with an exception
    (the old code's ``json.loads(None)`` / ``None.decode``)."""
    _rewrite_record(copy, "prm_initial-record", lambda folder: (folder / "heldout_labels.jsonl").unlink())
    bad = _failures(copy)
    assert len(bad) == 2 and all(line.startswith("NO DATA") for line in bad), bad
    assert all("prm_initial-record.tar.gz lacks prm_initial-record/heldout_labels.jsonl" in line for line in bad), bad


@pytest.mark.slow
def test_the_deepseekmath_study_results_recompute_from_its_run_archives(copy):
    """The CPU study's results (the group and declared-contrast rows in README and the study README, its
    report.md and report.json) are what its archived run folders give. One held-out problem's greedy answer of
    grpo_ps-seed0 turned from right to wrong fails GRPO+PS's group row in both documents and the report (greedy
    is exploratory: no declared contrast reads it); README's GRPO vs DPO row with its Holm p rounded in its
    favour fails that row only."""
    def one_greedy_wrong(folder: Path) -> None:
        path = folder / "eval" / "step_000020" / "synthetic" / "samples.jsonl.gz"
        recs = read_records(path)
        next(r for r in recs if r["greedy"].get("correct"))["greedy"]["correct"] = False
        write_records(path, recs)

    _rewrite_record(copy, "grpo_ps-seed0", one_greedy_wrong)
    bad = _failures(copy)
    assert sum("GRPO+PS: pass@1, greedy" in line for line in bad) == 2, bad
    assert any("deepseekmath_cpu/report.md" in line for line in bad), bad
    assert any("deepseekmath_cpu/report.json" in line for line in bad), bad
    assert not any("study: declared contrast" in line for line in bad), bad

    shutil.copy(ROOT / "docs/ablations/deepseekmath_cpu/run_archives/grpo_ps-seed0.tar.gz",
                copy / "docs/ablations/deepseekmath_cpu/run_archives/grpo_ps-seed0.tar.gz")
    text = (copy / "README.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| GRPO vs DPO |")]
    assert len(rows) == 1, rows
    cells = rows[0].split(" | ")
    cells[2] = "0.000" if cells[2] != "0.000" else "0.001"  # the Holm p, rounded in its favour
    (copy / "README.md").write_text(text.replace(rows[0], " | ".join(cells)), encoding="utf-8")
    bad = _failures(copy)
    assert len(bad) == 1 and "README.md: DeepSeekMath CPU study: declared contrast GRPO vs DPO" in bad[0], bad
