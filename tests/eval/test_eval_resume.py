"""A long evaluation survives being killed: `mathrl eval --out DIR --resume` continues from the journal
of generated chunks (mathrl/eval/records.py), with the real hf engine, a tiny model and GSM8K rows."""

from __future__ import annotations

import json

import pytest

from mathrl.cli import main as mathrl_main
from mathrl.config import ConfigError, load_config
from mathrl.eval.evaluate import evaluate_model
from mathrl.eval.records import JOURNAL_NAME, read_records


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, embedded_model_path):
    from mathrl.models import load_tokenizer
    from mathrl.testing.tiny import save_tiny_model

    d = tmp_path_factory.mktemp("tiny") / "model"
    save_tiny_model(d, load_tokenizer(str(embedded_model_path)), seed=0)
    return d


class Killed(Exception):
    pass


class CountingEngine:
    """The real engine, counting its generate calls and raising (like a kill) at call ``die_at``."""

    def __init__(self, engine, die_at: int | None = None):
        self.engine, self.calls, self.die_at = engine, 0, die_at
        self.tokenizer = engine.tokenizer

    def generate(self, *args, **kwargs):
        self.calls += 1
        if self.die_at is not None and self.calls == self.die_at:
            raise Killed()
        return self.engine.generate(*args, **kwargs)

    def close(self):
        pass


def _setup(tiny_dir, shared_data, n=2, max_tokens=5):
    from mathrl.data import load_problems
    from mathrl.rollout import make_engine

    cfg = load_config(None, [f"model.name={tiny_dir}", f"eval.n={n}", "eval.k=1,2", f"eval.max_tokens={max_tokens}",
                             "eval.chunk_rows=4", "rollout.backend=hf"])  # 2 problems a chunk: 6 chunks
    problems = load_problems("gsm8k", shared_data / "gsm8k" / "test.jsonl", "test", limit=12)
    return cfg, [("gsm8k", problems)], make_engine("hf", str(tiny_dir), dtype="float32", seed=0)


def _texts(path):
    return [[s["text"] for s in r["samples"]] + [r["greedy"]["text"]] for r in read_records(path)]


@pytest.mark.slow
def test_killed_evaluation_resumes_from_its_journal(tiny_dir, shared_data, tmp_path):
    cfg, sets, real = _setup(tiny_dir, shared_data)
    ref = CountingEngine(real)
    evaluate_model(cfg, sets, tmp_path / "ref", model_spec=str(tiny_dir), command="t", engine=ref)
    assert ref.calls == 12  # 6 chunks x (sampled + greedy)
    assert not (tmp_path / "ref" / "gsm8k" / JOURNAL_NAME).exists()  # removed once samples.jsonl.gz is written

    out = tmp_path / "run"
    dying = CountingEngine(real, die_at=8)  # killed in chunk 3's sampling: chunks 0-2 are journalled
    with pytest.raises(Killed):
        evaluate_model(cfg, sets, out, model_spec=str(tiny_dir), command="t", engine=dying)
    journal = out / "gsm8k" / JOURNAL_NAME
    lines = journal.read_text().splitlines()
    assert len(lines) == 4 and [json.loads(x)["chunk"] for x in lines[1:]] == [0, 1, 2]
    with journal.open("a") as fh:  # a kill while writing chunk 3 leaves a torn line: it is generated again
        fh.write('{"chunk": 3, "records": [{"id": "gsm8k/te')

    again = CountingEngine(real)
    summary = evaluate_model(cfg, sets, out, model_spec=str(tiny_dir), command="t", engine=again, resume=True)
    assert again.calls == 6  # only chunks 3, 4, 5
    assert summary["benchmarks"]["gsm8k"]["problems"] == 12
    assert _texts(out / "gsm8k" / "samples.jsonl.gz") == _texts(tmp_path / "ref" / "gsm8k" / "samples.jsonl.gz")
    assert not journal.exists()

    # a finished benchmark is not evaluated again on --resume ...
    idle = CountingEngine(real)
    evaluate_model(cfg, sets, out, model_spec=str(tiny_dir), command="t", engine=idle, resume=True)
    assert idle.calls == 0
    # ... unless it now has other problems (a changed --limit): then it is evaluated again
    other = CountingEngine(real)
    evaluate_model(cfg, [("gsm8k", sets[0][1][:10])], out, model_spec=str(tiny_dir), command="t", engine=other,
                   resume=True)
    assert other.calls == 10
    # ... and without --resume (negative control) everything is generated again
    fresh = CountingEngine(real)
    evaluate_model(cfg, sets, out, model_spec=str(tiny_dir), command="t", engine=fresh)
    assert fresh.calls == 12


def test_resume_with_other_settings_is_refused_naming_the_field(tiny_dir, shared_data, tmp_path):
    cfg, sets, real = _setup(tiny_dir, shared_data)
    with pytest.raises(Killed):
        evaluate_model(cfg, sets, tmp_path, model_spec=str(tiny_dir), command="t",
                       engine=CountingEngine(real, die_at=3))
    cfg2, _, _ = _setup(tiny_dir, shared_data, max_tokens=7)
    with pytest.raises(ConfigError, match=r"cannot resume.*settings\.max_tokens: journal 5, this run 7"):
        evaluate_model(cfg2, sets, tmp_path, model_spec=str(tiny_dir), command="t", engine=CountingEngine(real),
                       resume=True)


def test_cli_resume_needs_out(capsys):
    assert mathrl_main(["eval", "--model", "embedded", "--benchmarks", "gsm8k", "--resume"]) == 2
    assert "--resume continues an evaluation folder: give it with --out DIR" in capsys.readouterr().err
