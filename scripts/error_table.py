#!/usr/bin/env python
"""Write docs/errors.md: each bad input mathrl checks before a run, the message mathrl prints for it (verbatim), and the fix.

Every case builds its bad input in a scratch folder (a tiny model with SmolLM2's
tokenizer, small GSM8K-style files, a DeepSpeed JSON) and runs the checks that
``mathrl train`` runs before any expensive work: ``load_config`` (recipe +
overrides + ``validate``) and :func:`mathrl.train.preflight.preflight`. The
message in the table is the exception's text, which ``mathrl train`` prints as
``mathrl train: error: <message>`` with exit status 2; the scratch folder prints
as ``<tmp>``. tests/unit/test_bad_inputs.py runs the same cases and checks that
docs/errors.md is what this script writes.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/error_table.py           # print the page
    OMP_NUM_THREADS=1 .venv/bin/python scripts/error_table.py --write   # rewrite docs/errors.md
    OMP_NUM_THREADS=1 .venv/bin/python scripts/error_table.py --check   # exit 1 if docs/errors.md is stale
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "errors.md"
TMP = "<tmp>"

GOOD_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "He has 3 + 4 = 7 apples.\n#### 7"},
    {"question": "A box holds 12 pens. How many pens are in 5 boxes?", "answer": "12 * 5 = 60\n#### 60"},
    {"question": "Sara had 20 dollars and spent 8. How much is left?", "answer": "20 - 8 = 12\n#### 12"},
]


def write_jsonl(path: Path, rows: list[dict], tail: str = "") -> Path:
    """``rows`` as JSON Lines, then ``tail`` verbatim (e.g. a cut-off last line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


@dataclass(frozen=True)
class Case:
    """One bad input: how to build it, and what the user should do (for the table).

    ``build(tmp)`` writes its files under ``tmp`` and returns config overrides
    (``key=value``) applied on top of :func:`base_overrides`.
    """

    name: str
    bad_input: str
    fix: str
    build: Callable[[Path], list[str]]
    env: dict[str, str] = field(default_factory=dict)


def _truncated(tmp: Path) -> list[str]:
    line = json.dumps(GOOD_ROWS[0])
    write_jsonl(tmp / "trunc" / "train.jsonl", GOOD_ROWS, tail=line[: len(line) // 2])
    write_jsonl(tmp / "trunc" / "test.jsonl", GOOD_ROWS)
    return [f"data.path={tmp}/trunc/train.jsonl", f"data.eval_path={tmp}/trunc/test.jsonl"]


def _wrong_fields(tmp: Path) -> list[str]:
    write_jsonl(tmp / "fields" / "train.jsonl", [{"q": r["question"], "a": r["answer"]} for r in GOOD_ROWS])
    return [f"data.path={tmp}/fields/train.jsonl"]


def _empty_gold(tmp: Path) -> list[str]:
    write_jsonl(tmp / "empty" / "train.jsonl", [*GOOD_ROWS, {"question": "What is 6 * 7?", "answer": ""}])
    return [f"data.path={tmp}/empty/train.jsonl"]


def _word_gold(tmp: Path) -> list[str]:
    write_jsonl(tmp / "word" / "train.jsonl",
                [*GOOD_ROWS, {"question": "What is 6 + 6?", "answer": "6 + 6 = 12\n#### twelve"}])
    return [f"data.path={tmp}/word/train.jsonl"]


def _no_model(tmp: Path) -> list[str]:
    return [f"model.name={tmp}/models/no-such-model"]


def _no_chat_template(tmp: Path) -> list[str]:
    return [f"model.name={tmp}/models/base", "data.template=chat_boxed"]


def _ds_batch(tmp: Path) -> list[str]:
    path = tmp / "ds_bad.json"
    path.write_text(json.dumps({
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2},
    }, indent=2) + "\n")
    return [f"deepspeed.config_path={path}"]


def _g1(tmp: Path) -> list[str]:
    return ["algo.name=grpo", "rollout.n=1"]


def _context(tmp: Path) -> list[str]:
    return ["rollout.max_tokens=1000"]


CASES: list[Case] = [
    Case("truncated JSONL", "`data.path` file whose last line is cut off mid-object (interrupted download)",
         "download/copy the file again or delete the partial last line; or `data.skip_bad_rows=true`", _truncated),
    Case("wrong field names", "GSM8K rows with `q`/`a` instead of `question`/`answer`",
         "rename the fields, or set `data.source` to the dataset the file holds", _wrong_fields),
    Case("empty gold answer", "a GSM8K row with `\"answer\": \"\"`",
         "fill in the answer (ending `#### <number>`) or remove the row; or `data.skip_bad_rows=true`", _empty_gold),
    Case("non-numeric GSM8K gold", "a GSM8K answer ending `#### twelve`",
         "write the gold in digits (`#### 12`); or `data.skip_bad_rows=true`", _word_gold),
    Case("model path does not exist", "`model.name` is a folder that does not exist",
         "point `model.name` at a Hugging Face model folder, `embedded`, or a hub id", _no_model),
    Case("tokenizer without a chat template", "a base model's tokenizer with `data.template=chat_boxed`",
         "`data.template=fewshot_plain`, or an instruct model", _no_chat_template),
    Case("DeepSpeed batch sizes do not multiply out",
         "`deepspeed.config_path` JSON with train_batch_size 64, micro-batch 4, accumulation 2, one process",
         "`\"train_batch_size\": 8` (= 4 x 2 x 1) or `\"auto\"`", _ds_batch, env={"WORLD_SIZE": "1"}),
    Case("G = 1 with GRPO", "`rollout.n=1` with `algo.name=grpo` (every group advantage is 0)",
         "`rollout.n >= 2`, or `algo.advantage=reinforce_pp` / `algo.name=ppo`", _g1),
    Case("max_tokens longer than the context", "`rollout.max_tokens=1000` with a 1024-token model",
         "lower `rollout.max_tokens` to the number given, or a longer-context model", _context),
]


def make_models(tmp: Path) -> None:
    """``tmp/models/tiny`` (tiny random Llama, SmolLM2's tokenizer, 1024-token context) and
    ``tmp/models/base``: the same with the chat template removed, as a base model ships."""
    from mathrl.testing.tiny import save_tiny_model

    tiny = save_tiny_model(tmp / "models" / "tiny", seed=0)
    base = tmp / "models" / "base"
    shutil.copytree(tiny, base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    tok_cfg = base / "tokenizer_config.json"
    data = json.loads(tok_cfg.read_text())
    data.pop("chat_template", None)
    tok_cfg.write_text(json.dumps(data, indent=2))


def base_overrides(tmp: Path) -> list[str]:
    """A good GSM8K run on the tiny model; every case changes one thing."""
    write_jsonl(tmp / "good" / "train.jsonl", GOOD_ROWS)
    write_jsonl(tmp / "good" / "test.jsonl", GOOD_ROWS)
    return [f"model.name={tmp}/models/tiny", "data.source=gsm8k", f"data.path={tmp}/good/train.jsonl",
            f"data.eval_path={tmp}/good/test.jsonl", "data.template=chat_boxed", "rollout.max_tokens=64",
            "eval.max_tokens=64", "rollout.n=4", "train.batch_size=2", f"train.output_dir={tmp}/run"]


def trigger(overrides: list[str], env: dict[str, str] | None = None) -> BaseException | None:
    """Run the pre-start checks of ``mathrl train`` on ``overrides``; the error raised, or None."""
    from mathrl.config import ConfigError, load_config
    from mathrl.data import DataError
    from mathrl.models import ModelError
    from mathrl.train.preflight import preflight

    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        preflight(load_config(None, overrides))
    except (ConfigError, DataError, ModelError) as exc:
        return exc
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return None


def collect(tmp: Path) -> list[tuple[Case, str, str]]:
    """(case, exception type, message with ``tmp`` shown as <tmp>) for every case, in order."""
    tmp = Path(tmp)
    if not (tmp / "models" / "tiny").is_dir():
        make_models(tmp)
    base = base_overrides(tmp)
    rows = []
    for case in CASES:
        exc = trigger(base + case.build(tmp), case.env)
        if exc is None:
            raise AssertionError(f"case {case.name!r}: no error was raised")
        rows.append((case, type(exc).__name__, str(exc).replace(str(tmp), TMP)))
    return rows


HEADER = """# Bad inputs and their messages

mathrl checks a training run's inputs before any expensive work starts: the recipe
and overrides when the config is loaded (`mathrl.config.validate`), then files,
model folder, tokenizer and context in `mathrl.train.preflight.preflight`, the first
call of `prepare_run` -- before the process group, DeepSpeed and any model weights.
It reads only small files (the DeepSpeed JSON, `config.json`, the tokenizer, the
problem files), so a bad input is reported within seconds. Each problem is one line
naming the file and line or the config key, and the fix; `mathrl train` prints it as
`mathrl train: error: <message>` and exits with status 2 (no traceback).

The messages below are produced by `scripts/error_table.py`, which builds each bad
input in a scratch folder (shown as `<tmp>`) and runs the real checks on a tiny
model with SmolLM2's tokenizer; `tests/unit/test_bad_inputs.py` fails when this page
is out of date (regenerate: `OMP_NUM_THREADS=1 .venv/bin/python scripts/error_table.py --write`).

Choices: G = 1 with a group-baseline advantage (grpo, dr_grpo, rloo) is refused, not
warned about -- every advantage would be exactly 0, so the run would learn nothing
while its logs look normal. A row that cannot be mapped stops the run unless
`data.skip_bad_rows=true`, which skips and counts such rows (logged once with the first
one's location).

One check comes later, once the models are loaded, since it needs the model's size and the
free memory: a pinned `train.micro_batch_tokens` (a number) whose largest micro-batch the
free memory does not hold stops the run before its first step, as a TrainingError (exit
status 3), with one line naming what that micro-batch needs, what is free, the largest
value that fits and the settings to change (`train.micro_batch_tokens=auto` or at most
that value). `auto`, the default, is lowered to what fits instead (README, "Memory of a
training micro-batch"); a value that is neither a positive integer nor `auto` is a
ConfigError when the config is loaded.

| bad input | error | message (verbatim) | fix |
|---|---|---|---|
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[tuple[Case, str, str]]) -> str:
    """The page: header and one table row per case."""
    lines = [f"| **{c.name}**: {_cell(c.bad_input)} | {kind} | `{_cell(msg)}` | {_cell(c.fix)} |"
             for c, kind, msg in rows]
    return HEADER + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {DOC.relative_to(REPO)}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {DOC.relative_to(REPO)} differs")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="mathrl-errors-") as tmp:
        page = render(collect(Path(tmp)))
    if args.write:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(page)
        print(f"wrote {DOC}")
        return 0
    if args.check:
        current = DOC.read_text() if DOC.is_file() else ""
        if current != page:
            print(f"{DOC} is out of date; run: python scripts/error_table.py --write", file=sys.stderr)
            return 1
        print(f"{DOC} is up to date")
        return 0
    print(page, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
