"""The three worked extension examples of docs/architecture.md ("Where to add things") run as written.

Each section's first python block is the extension (a complete module, imports included) and its second
python block is the extension's test, as the reader writes them. Both run in a fresh interpreter (the
registries are process-wide), in that order and in separate namespaces, as the two files would: the test
reaches the extension only through mathrl's registries. Then the checks below confirm what the doc's prose
claims and the reader's test does not check itself (``mathrl train --help``, the YAML recipe, where a
benchmark's file is found). Tracebacks name docs/architecture.md and its line numbers."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mathrl

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
HEADINGS = {"estimator": "### An advantage estimator", "reward": "### A reward term", "data": "### A data source"}

# runs [(label, first line, source), ...] one after another, each in its own namespace; a test_* function a
# source defines is called (with a fresh tmp_path when it asks for one)
HARNESS = """
import inspect, json, sys, tempfile
from pathlib import Path
for i, (label, line, source) in enumerate(json.loads(sys.argv[1])):
    ns = {"__name__": f"example_part{i}"}
    exec(compile("\\n" * (line - 1) + source, label, "exec"), ns)
    for name, fn in list(ns.items()):
        if name.startswith("test_") and callable(fn):
            params = inspect.signature(fn).parameters
            fn(**({"tmp_path": Path(tempfile.mkdtemp(dir="."))} if "tmp_path" in params else {}))
            print("passed", name)
print("ok")
"""


def section(heading: str, text: str | None = None) -> tuple[str, int]:
    """The text of one ``###`` section of the doc and the line it starts on."""
    text = DOC.read_text() if text is None else text
    start = text.index(heading + "\n")
    ends = [i for i in (text.find("\n### ", start + 1), text.find("\n## ", start + 1)) if i != -1]
    return text[start:min(ends) if ends else len(text)], text[:start].count("\n") + 1


def blocks(heading: str, lang: str, text: str | None = None) -> list[tuple[int, str]]:
    """(doc line of the block's first code line, code) of every ``lang`` block of a section."""
    body, first = section(heading, text)
    return [(first + body[:m.start(1)].count("\n"), m.group(1))
            for m in re.finditer(rf"```{lang}\n(.*?)```", body, flags=re.S)]


def env() -> dict[str, str]:
    """The test process's own mathrl first on the path, one thread."""
    path = [str(Path(mathrl.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "OMP_NUM_THREADS": "1"}


def run_example(name: str, checks: str, cwd: Path, text: str | None = None) -> str:
    """The section's extension, then its test, then ``checks``, in a fresh interpreter in ``cwd``."""
    heading = HEADINGS[name]
    code = blocks(heading, "python", text)
    assert len(code) == 2, f"{heading}: expected the extension and its test as two python blocks, got {len(code)}"
    (ext_line, ext), (test_line, test) = code
    parts = [(str(DOC), ext_line, ext), (str(DOC), test_line, test), (f"checks of {name}", 1, checks)]
    proc = subprocess.run([sys.executable, "-c", HARNESS, json.dumps(parts)], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


# ----------------------------------------------------------------------------- an advantage estimator

ESTIMATOR_CHECKS = """
from mathrl.cli import train_parser
from mathrl.registry import ESTIMATORS

spec = ESTIMATORS["median_baseline"]
assert (spec.level, spec.min_group, spec.needs_critic) == ("sequence", 2, False)
text = train_parser().format_help()  # mathrl train --help: the field's choices and the estimator list
assert "'median_baseline'" in text, text
assert "  median_baseline    (sequence level; rollout.n >= 2)" in text
assert "Score minus the median score of its group (a baseline one outlier cannot move)." in text
"""


@pytest.mark.slow
def test_the_estimator_example(tmp_path):
    out = run_example("estimator", ESTIMATOR_CHECKS, tmp_path)
    assert "passed test_median_baseline" in out


@pytest.mark.slow
def test_the_estimator_example_as_its_own_mathrl(tmp_path):
    """The extension as a file of its own that ends by running mathrl's command line (the doc's launcher):
    `python my_estimator.py train ...` knows the estimator, and refuses rollout.n=1 as mathrl does."""
    [(_, ext)] = blocks(HEADINGS["estimator"], "python")[:1]
    where, _ = section("## Where to add things")
    [launcher] = re.findall(r"```\n(if __name__ == \"__main__\":.*?)```", where, flags=re.S)
    script = tmp_path / "my_estimator.py"
    script.write_text(ext + "\n\n" + launcher)

    def mathrl_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env(), capture_output=True,
                              text=True, timeout=300)

    ok = mathrl_cli("train", "--print-config", "algo.advantage=median_baseline", "rollout.n=4")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert yaml.safe_load(ok.stdout)["algo"]["advantage"] == "median_baseline"
    refused = mathrl_cli("train", "--print-config", "algo.advantage=median_baseline", "rollout.n=1")
    assert refused.returncode == 2 and "needs rollout.n >= 2" in refused.stderr, refused.stderr[-3000:]
    assert len(refused.stderr.strip().splitlines()) == 1  # one line, no traceback


# ----------------------------------------------------------------------------- a reward term

REWARD_CHECKS = """
import json, sys
from pathlib import Path

from mathrl.cli import train_parser
from mathrl.config import ConfigError, load_config
from mathrl.reward.grader import Grade
from mathrl.reward.rewards import RewardContext, compute_rewards, reward_terms

recipe, want_terms, message = json.loads(Path("doc_claims.json").read_text())
Path("r.yaml").write_text(recipe)
cfg = load_config("r.yaml")
assert reward_terms(cfg) == want_terms, reward_terms(cfg)  # the recipe gives the mapping the doc's test uses
ctx = RewardContext(responses=["a", "b", "c"], lengths=[0, 100, 1000],
                    grades=[Grade(True, "1", "ok"), Grade(False, "2", "mismatch"), Grade(True, "3", "ok")])
assert [round(x, 9) for x in compute_rewards(reward_terms(cfg), ctx)] == [1.0, -0.1, 0.0]
Path("r.yaml").write_text(recipe.replace("per_token", "per_tokn"))
try:
    load_config("r.yaml")
    raise AssertionError("a misspelt parameter was accepted")
except ConfigError as exc:
    assert str(exc) == message, str(exc)
assert "  brevity    (params: weight, per_token)" in train_parser().format_help()
"""


def reward_claims(text: str | None = None) -> tuple[str, dict, str]:
    """The doc's YAML recipe, the mapping its test calls "the YAML above", and the error message it shows."""
    [(_, recipe)] = blocks(HEADINGS["reward"], "yaml", text)
    (_, test) = blocks(HEADINGS["reward"], "python", text)[1]
    [terms] = [ast.literal_eval(node.value) for node in ast.walk(ast.parse(test))
               if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["terms"]]
    body, _ = section(HEADINGS["reward"], text)
    [message] = re.findall(r"`(reward\.terms\.brevity\.per_tokn [^`]*)`", " ".join(body.split()))
    return recipe, terms, message


@pytest.mark.slow
def test_the_reward_term_example(tmp_path):
    recipe, terms, message = reward_claims()
    assert yaml.safe_load(recipe)["reward"]["terms"] == terms
    (tmp_path / "doc_claims.json").write_text(json.dumps([recipe, terms, message]))
    out = run_example("reward", REWARD_CHECKS, tmp_path)
    assert "passed test_brevity" in out


# ----------------------------------------------------------------------------- a data source

DATA_CHECKS = """
import contextlib, io

from mathrl.cli import train_parser
from mathrl.data.cli import main as data_main
from mathrl.eval.benchmarks import parse_benchmarks

[bench] = parse_benchmarks("mydata")
assert bench.benchmark.relpath == "mydata/test.jsonl"  # <data-dir>/mydata/test.jsonl
text = train_parser().format_help()
assert "  mydata\\n      My problems (500 test)" in text
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    assert data_main(["sources"]) == 0  # mathrl data sources
assert "mydata" in buf.getvalue() and "My problems (500 test)" in buf.getvalue()
"""


@pytest.mark.slow
def test_the_data_source_example(tmp_path):
    out = run_example("data", DATA_CHECKS, tmp_path)
    assert "passed test_mydata" in out


# ----------------------------------------------------------------------------- the harness itself


def test_the_harness_reads_the_doc():
    text = DOC.read_text()
    for heading in HEADINGS.values():
        code = blocks(heading, "python", text)
        assert len(code) == 2, heading
        for line, source in code:  # the reported line is the block's first line in the doc
            assert text.splitlines()[line - 1] == source.splitlines()[0]
    recipe, terms, message = reward_claims(text)
    assert "brevity" in terms and message.startswith("reward.terms.brevity.per_tokn (r.yaml:")


@pytest.mark.slow
def test_a_broken_example_fails(tmp_path):
    # negative control: the doc with register_reward misspelt in the reward example's extension
    text = DOC.read_text()
    body, _ = section(HEADINGS["reward"], text)
    broken = text.replace(body, body.replace("import RewardContext, register_reward\n",
                                             "import RewardContext, register_rewards\n", 1))
    assert broken != text
    with pytest.raises(AssertionError, match="ImportError: cannot import name 'register_rewards'"):
        run_example("reward", REWARD_CHECKS, tmp_path, broken)
