"""Every evaluation keeps its per-problem samples, compressed, beside its summary (issue 40): what
``mathrl eval``, ``--series`` and the trainer's held-out evaluation write (all through
``evaluate_benchmark``), and what ``--compare`` / ``--regrade`` / ``scripts/check_results.py`` read back."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import torch

from mathrl.data.problem import Problem
from mathrl.eval.compare import per_problem
from mathrl.eval.records import SAMPLES_NAME, read_records, samples_path, write_records
from mathrl.eval.report import write_report
from mathrl.eval.runner import EvalSettings, evaluate_benchmark
from mathrl.eval.series import regrade_run


class AlwaysTwo:
    """An engine that answers every prompt with ``\\boxed{2}`` (no tokenizer: a plain template)."""

    tokenizer = None

    def generate(self, prompts, g, sampling, on_row=None):
        n = len(prompts) * g
        return SimpleNamespace(num_prompts=len(prompts), response_text=["so \\boxed{2}"] * n,
                               finish_reason=["stop"] * n, response_lengths=torch.full((n,), 4))


def _evaluate(out):
    settings = EvalSettings(n=2, ks=(1, 2), template="fewshot_plain", ci_resamples=50)
    problems = [Problem(id=f"t/{i}", question=f"{i} + 1?", gold=str(i + 1), source="toy") for i in range(3)]
    res = evaluate_benchmark(AlwaysTwo(), problems, settings, name="toy", out_dir=out, log=lambda _m: None)
    write_report(out, {"model": "always-two", "command": "test", "backend": "AlwaysTwo",
                       "settings": settings.to_dict(), "benchmarks": {"toy": res.summary}})
    return res


def test_an_evaluation_writes_its_samples_compressed_beside_the_summary(tmp_path):
    res = _evaluate(tmp_path / "a")
    kept = tmp_path / "a" / "toy" / SAMPLES_NAME
    assert SAMPLES_NAME == "samples.jsonl.gz" and kept.is_file()
    assert not (tmp_path / "a" / "toy" / "samples.jsonl").exists()
    assert kept.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    assert read_records(kept) == json.loads(json.dumps(res.records))
    assert (tmp_path / "a" / "summary.json").is_file()
    # the same records give the same bytes (no time or name in the gzip header): a re-run changes no file
    _evaluate(tmp_path / "b")
    assert (tmp_path / "b" / "toy" / SAMPLES_NAME).read_bytes() == kept.read_bytes()
    # what --compare reads: problem 1 (gold 2) right, the others wrong
    assert {i: s["pass@1"] for i, s in per_problem(tmp_path / "a").items()} == {"t/0": 0.0, "t/1": 1.0, "t/2": 0.0}


def test_folders_written_before_compression_are_still_read(tmp_path):
    _evaluate(tmp_path / "a")
    bench = tmp_path / "a" / "toy"
    plain = bench / "samples.jsonl"
    plain.write_text(gzip.decompress((bench / SAMPLES_NAME).read_bytes()).decode())
    (bench / SAMPLES_NAME).unlink()
    assert samples_path(bench) == plain
    assert per_problem(tmp_path / "a")["t/1"]["pass@1"] == 1.0
    summary = regrade_run(tmp_path / "a", log=lambda _m: None)  # regrades the old file in place
    assert summary["benchmarks"]["toy"]["metrics"]["pass@1"]["value"] == 1 / 3 and plain.is_file()


def test_a_new_evaluation_into_an_old_folder_leaves_one_samples_file(tmp_path):
    write_records(tmp_path / "a" / "toy" / "samples.jsonl", [{"id": "stale"}])
    _evaluate(tmp_path / "a")
    assert samples_path(tmp_path / "a" / "toy").name == SAMPLES_NAME
    assert not (tmp_path / "a" / "toy" / "samples.jsonl").exists()
