"""Bad input files and configs: one clear line each, before any expensive work.

Each case of scripts/error_table.py (the generator of docs/errors.md) is run through the real
checks -- ``load_config`` and :func:`mathrl.train.preflight.preflight` -- and its message is
checked for the file/line or key at fault and the fix. Two cases go through the real
``mathrl train`` command line (exit status 2, one line on stderr, before DeepSpeed starts).
No model weights are loaded and no process group is started.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.data import DataError, load_problems
from mathrl.data.readers import json_line_error
from mathrl.models import ModelError
from mathrl.procs import without_dist_env
from mathrl.dist.ds_json import check_batch_sizes, ds_config
from mathrl_testenv import require

REPO = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("mathrl_error_table", REPO / "scripts" / "error_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


et = _load_script()
CASES = {c.name: c for c in et.CASES}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A scratch folder with the tiny model (SmolLM2 tokenizer), its base-model copy and good data."""
    tmp = tmp_path_factory.mktemp("bad_inputs")
    try:
        et.make_models(tmp)
    except ModelError as exc:
        require(False, f"the tiny test model needs SmolLM2's tokenizer: {exc}")
    return tmp


@pytest.fixture(scope="module")
def base(scratch) -> list[str]:
    return et.base_overrides(scratch)


def _error(base: list[str], scratch: Path, name: str):
    case = CASES[name]
    return et.trigger(base + case.build(scratch), case.env)


# (exception type, fragments the one-line message must hold: where, what, and the fix)
EXPECTED = {
    "truncated JSONL": (DataError, [r"trunc/train.jsonl:4: field '<json>'", "last line is cut off",
                                    "looks truncated", "fetch it again", "data.skip_bad_rows=true"]),
    "wrong field names": (DataError, ["fields/train.jsonl:1: field 'question': missing", "['a', 'q']",
                                      "reads the fields question, answer", "rename the fields"]),
    "empty gold answer": (DataError, ["empty/train.jsonl:4: field 'answer': is empty: no gold answer",
                                      "#### 12", "remove the row"]),
    "non-numeric GSM8K gold": (DataError, ["word/train.jsonl:4: field 'answer'", "'twelve', not a number",
                                           "in digits after '####'"]),
    "model path does not exist": (ModelError, ["model.name = '", "no-such-model", "does not exist",
                                               "'embedded'", "config.json"]),
    "tokenizer without a chat template": (ConfigError, ["data.template = 'chat_boxed'", "models/base",
                                                        "has none", "chat_template.jinja",
                                                        "data.template=fewshot_plain"]),
    "DeepSpeed batch sizes do not multiply out": (ConfigError, [
        "ds_bad.json:2: train_batch_size = 64", "(4) x gradient_accumulation_steps (2) x world size (1) = 8",
        '"train_batch_size": 8', '"auto"']),
    "G = 1 with GRPO": (ConfigError, ["rollout.n = 1", "every advantage is 0", "needs rollout.n >= 2",
                                      "algo.advantage=reinforce_pp"]),
    "max_tokens longer than the context": (ConfigError, ["rollout.max_tokens = 1000", "good/train.jsonl:",
                                                         "max_position_embeddings = 1024", "tiny/config.json",
                                                         "or less"]),
}


def test_every_case_of_the_issue_is_covered():
    assert set(EXPECTED) == set(CASES)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_bad_input_gives_one_clear_line(base, scratch, name):
    kind, fragments = EXPECTED[name]
    exc = _error(base, scratch, name)
    assert isinstance(exc, kind), f"{name}: expected {kind.__name__}, got {exc!r}"
    msg = str(exc)
    assert "\n" not in msg and len(msg) < 600, msg
    for frag in fragments:
        assert frag in msg, f"{name}: {frag!r} not in {msg!r}"


def test_good_inputs_pass(base):
    assert et.trigger(base) is None


def test_skip_bad_rows_lets_the_run_start(base, scratch):
    assert et.trigger(base + CASES["truncated JSONL"].build(scratch) + ["data.skip_bad_rows=true"]) is None


@pytest.mark.parametrize("overrides, kind, start", [
    (["model.ref_model=/no/such/ref"], ModelError, "model.ref_model = '/no/such/ref': the folder does not exist"),
    (["data.template=chat"], ConfigError, "data.template = 'chat': unknown prompt template 'chat'; known:"),
    (["data.template=fewshot_plain", "data.system_prompt=Be brief."], ConfigError,
     "data.system_prompt = 'Be brief.': prompt template 'fewshot_plain' is plain text"),
])
def test_other_settings_name_their_key(base, overrides, kind, start):
    exc = et.trigger(base + overrides)
    assert isinstance(exc, kind) and str(exc).startswith(start), exc


def test_a_missing_vllm_environment_names_the_hf_backend(base, monkeypatch):
    """Issue 38 point 8: rollout.backend=vllm without vLLM ended in a RuntimeError traceback after the model
    loaded (and left a run folder); now preflight stops first, naming make vllm-env and rollout.backend=hf."""
    import mathrl.rollout.vllm as vllm_mod

    exc = et.trigger(base + ["rollout.backend=vllm", "rollout.vllm_python=/no/such/python"])
    assert isinstance(exc, ConfigError) and str(exc).startswith("rollout.vllm_python=/no/such/python: no such "
                                                                "interpreter"), exc
    assert "rollout.backend=hf" in str(exc) and "make vllm-env" in str(exc)
    monkeypatch.delenv("MATHRL_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vllm_mod, "vllm_importable", lambda: False)       # a machine without vLLM ...
    monkeypatch.setattr(vllm_mod, "default_vllm_python", lambda: None)    # ... and without .venv-vllm
    exc = et.trigger(base + ["rollout.backend=vllm"])
    assert isinstance(exc, ConfigError) and str(exc).startswith("rollout.backend=vllm: vllm is not installed"), exc
    assert "rollout.backend=hf" in str(exc) and "\n" not in str(exc)
    assert et.trigger(base + ["rollout.backend=hf"]) is None


def test_context_limit_suggested_is_exact(base, scratch):
    """The message's suggested max_tokens is the largest that passes: it passes, one more fails."""
    msg = str(_error(base, scratch, "max_tokens longer than the context"))
    allowed = int(re.search(r"set rollout.max_tokens=(\d+) or less", msg).group(1))
    assert 0 < allowed < 1024
    assert et.trigger(base + [f"rollout.max_tokens={allowed}"]) is None
    assert isinstance(et.trigger(base + [f"rollout.max_tokens={allowed + 1}"]), ConfigError)
    # the held-out prompts have their own budget
    held = et.trigger(base + ["eval.max_tokens=1020"])
    assert isinstance(held, ConfigError) and str(held).startswith("eval.max_tokens = 1020: the longest held-out")


def test_prepare_run_checks_before_the_process_group(base, scratch, monkeypatch):
    """preflight is the first thing prepare_run does: a bad input never reaches init_distributed."""
    from mathrl.train import setup

    reached = []

    def fake_init(*_args):  # records the call; the real one would start DeepSpeed's process group
        reached.append(True)
        raise RuntimeError("init_distributed reached")

    monkeypatch.setattr(setup, "init_distributed", fake_init)
    bad = load_config(None, base + CASES["truncated JSONL"].build(scratch))
    with pytest.raises(DataError, match="last line is cut off"):
        setup.prepare_run(bad)
    assert not reached
    with pytest.raises(RuntimeError, match="init_distributed reached"):
        setup.prepare_run(load_config(None, base))
    assert reached == [True]


# --------------------------------------------------------------------------- the real CLI


def _mathrl() -> str:
    exe = Path(sys.executable).parent / "mathrl"
    require(exe.is_file(), f"console script {exe} not installed (pip install -e .)")
    return str(exe)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["truncated JSONL", "model path does not exist"])
def test_cli_exit_2_one_line_before_deepspeed(base, scratch, name, tmp_path):
    """``mathrl train recipe.yaml overrides...`` on a bad input: status 2, one stderr line (no traceback,
    no DeepSpeed log line), within seconds, and no run folder (prepare_run creates it only after the
    process group is up; test_prepare_run_checks_before_the_process_group shows the order in-process)."""
    out_dir = tmp_path / "run"
    overrides = [o for o in base if not o.startswith("train.output_dir=")] + CASES[name].build(scratch)
    recipe = tmp_path / "recipe.yaml"
    sections: dict[str, dict[str, str]] = {}
    for item in overrides[:4]:  # half in a recipe, half on the command line, as users do
        key, value = item.split("=", 1)
        sec, fld = key.split(".")
        sections.setdefault(sec, {})[fld] = value
    recipe.write_text("".join(f"{s}:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in f.items())
                              for s, f in sections.items()))
    # a world of its own (this pytest process may hold a process group and its MASTER_PORT)
    env = {**without_dist_env(), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.run([_mathrl(), "train", str(recipe), *overrides[4:], f"train.output_dir={out_dir}"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    elapsed = time.perf_counter() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("mathrl train: error: "), proc.stderr
    assert EXPECTED[name][1][0] in lines[0]
    assert "deepspeed" not in proc.stderr.lower() and not out_dir.exists()
    assert elapsed < 30, f"took {elapsed:.1f}s"  # typically 3-5 s: imports + reading small files


# --------------------------------------------------------------------------- pieces


def test_json_line_error_kinds():
    def err(line):
        try:
            json.loads(line)
        except json.JSONDecodeError as exc:
            return json_line_error(line, exc)

    last = err('{"question": "q", "ans')
    assert "last line is cut off" in last.reason and "truncated" in last.fix
    mid = err('{"question": "q", "answer": \n')
    assert mid.reason.startswith("the line is cut off") and "truncated" not in mid.fix
    plain = err('{"question": "q",, "answer": "#### 3"}\n')
    assert plain.reason.startswith("invalid JSON at column") and "correct the JSON" in plain.fix


def test_wrong_source_suggests_the_matching_one(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"problem": "What is 1+1?", "solution": "It is \\boxed{2}."}) + "\n")
    with pytest.raises(DataError, match=r"m.jsonl:1: field 'question': missing.*fits source 'math'.*"
                                        r"set data.source=math"):
        load_problems("gsm8k", path)


@pytest.mark.parametrize("gold, ok", [("12", True), ("-3", True), ("2.5", True), ("1,200", True),
                                      ("twelve", False), ("12 apples", False), ("$12", False), ("1/2", False)])
def test_gsm8k_gold_must_be_a_number(tmp_path, gold, ok):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": f"work\n#### {gold}"}) + "\n")
    if ok:
        assert load_problems("gsm8k", path)[0].gold == gold.replace(",", "")
    else:
        with pytest.raises(DataError, match=r"g.jsonl:1: field 'answer': the gold after '####' is .* not a number"):
            load_problems("gsm8k", path)


def test_ds_config_checks_the_users_json(tmp_path):
    import torch

    def write(obj) -> str:
        p = tmp_path / "ds.json"
        p.write_text(json.dumps(obj, indent=2))
        return str(p)

    kw = dict(micro_batch=1, grad_clip=1.0, dtype=torch.float32)
    auto = write({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 1}})
    filled = ds_config(1, "none", world_size=2, config_path=auto, **kw)
    assert (filled["train_batch_size"], filled["train_micro_batch_size_per_gpu"],
            filled["gradient_accumulation_steps"]) == (2, 1, 1)
    good = write({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                  "zero_optimization": {"stage": 1}})
    assert ds_config(1, "none", world_size=2, config_path=good, **kw)["train_batch_size"] == 16
    with pytest.raises(ConfigError, match=r"ds.json:2: train_batch_size = 16 .* = 8; fix: set \"train_batch_size\": 8"):
        ds_config(1, "none", world_size=1, config_path=good, **kw)
    only_total = write({"train_batch_size": 32, "zero_optimization": {"stage": 1}})
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu \(1 from \"auto\"\)"):
        check_batch_sizes(json.loads(Path(only_total).read_text()), 4, only_total)
    bad_value = write({"gradient_accumulation_steps": "two"})
    with pytest.raises(ConfigError, match=r"ds.json:2: gradient_accumulation_steps = 'two' .*positive integer"):
        ds_config(1, "none", world_size=1, config_path=bad_value, **kw)
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 1\n')
    with pytest.raises(ConfigError, match=r"broken.json:\d+:\d+: invalid JSON in deepspeed.config_path"):
        ds_config(1, "none", world_size=1, config_path=str(broken), **kw)


def test_hub_errors_are_one_line():
    from mathrl.models import load_tokenizer

    with pytest.raises(ModelError) as info:
        load_tokenizer("mathrl-test/no-such-model-xyz")
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- docs and real data


def test_docs_errors_md_is_current(scratch):
    """docs/errors.md is exactly what scripts/error_table.py writes from the real messages."""
    page = et.render(et.collect(scratch))
    assert et.DOC.is_file(), "docs/errors.md is missing: run scripts/error_table.py --write"
    assert et.DOC.read_text() == page, "docs/errors.md is stale: run scripts/error_table.py --write"


@pytest.mark.slow
def test_real_gsm8k_passes_and_longest_prompt_is_found(shared_data, embedded_model_path):
    """The shipped GSM8K files pass every check with the embedded model, and the candidate
    shortcut of the context check finds the same longest prompt as tokenising all of them."""
    from mathrl.models import load_tokenizer
    from mathrl.train.preflight import longest_prompt, preflight

    gsm = shared_data / "gsm8k"
    cfg = load_config("configs/grpo_gsm8k.yaml" if (REPO / "configs/grpo_gsm8k.yaml").is_file() else None,
                      ["model.name=embedded", "data.source=gsm8k", f"data.path={gsm / 'train.jsonl'}",
                       f"data.eval_path={gsm / 'test.jsonl'}", "data.template=chat_boxed_oneshot"])
    preflight(cfg)
    tok = load_tokenizer(str(embedded_model_path))
    test = load_problems("gsm8k", gsm / "test.jsonl")
    n, _ = longest_prompt(cfg, tok, test, None)
    from mathrl.data import get_template

    texts = get_template("chat_boxed_oneshot").render_batch(test, tok)
    assert n == max(len(x) for x in tok(texts, add_special_tokens=False)["input_ids"])
