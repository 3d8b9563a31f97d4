"""README's command examples run as written.

Every ``mathrl`` line of README's command blocks is run here through the product's own entry point
(:func:`mathrl.cli.main`) at a cost a unit test can pay:

- ``mathrl train RECIPE overrides`` with ``--print-config`` appended: the recipe and every override are
  validated by the real loader, exactly as the training run would start;
- ``mathrl eval --model ...``: the arguments go through the real parser and the real setting resolution
  (recipe, overrides, flags, benchmark names), everything the command checks before it loads a model;
- ``mathrl eval --compare A B``: A and B must be folders an earlier README line writes (``--out``);
- ``mathrl verify``, ``mathrl data show`` and ``--help`` lines run for real on small local files;
- a line that README shows failing (``$ mathrl ...`` followed by its output) must print that output.

Besides, every ``runs/NAME/checkpoints/step_N`` and ``runs/NAME/eval/step_N`` that README names
anywhere must be one a README training command (``make demo`` included) keeps on disk.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

os.environ.setdefault("OMP_NUM_THREADS", "1")


def command_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block, with backslash continuations joined."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
            continue
        if current is None:
            continue
        if current and current[-1].endswith("\\"):
            current[-1] = current[-1][:-1].rstrip() + " " + line.strip()
        else:
            current.append(line)
    return blocks


def readme_commands(text: str) -> list[tuple[list[str], str | None]]:
    """(argv after ``mathrl``, the output README prints for it or None) for each ``mathrl`` line."""
    out: list[tuple[list[str], str | None]] = []
    for block in command_blocks(text):
        transcript = any(line.startswith("$ ") for line in block)  # commands after "$ ", their output below
        for i, line in enumerate(block):
            shown = line.startswith("$ ")
            if transcript and not shown:
                continue
            line = line[2:] if shown else line
            if not line.startswith("mathrl "):
                continue
            words = shlex.split(line, comments=True)
            expected = block[i + 1] if shown and i + 1 < len(block) else None
            out.append(([w for w in words[1:] if w != "..."], expected))
    return out


def kept_steps(cfg) -> set[int]:
    """The checkpoint steps a finished run of ``cfg`` keeps: the steps the trainer's own
    ``checkpoint_due`` saves (timed saves left out: they only add newer ones) and the last step, of which
    rotation keeps the newest ``train.keep_last``."""
    import time

    from mathrl.train.checkpoint import checkpoint_due

    t = cfg.train
    saved = sorted({s for s in range(1, t.steps) if checkpoint_due(cfg, s, time.monotonic())} | {t.steps})
    return set(saved[-t.keep_last:])


def train_writes(cfg) -> set[str]:
    """The folders a finished run of ``cfg`` leaves that README may name: the run folder, its kept
    checkpoints (and their ``policy/``), and the evaluations before training and after the last step."""
    out = cfg.train.output_dir.rstrip("/")
    folders = {out, f"{out}/eval/step_{0:06d}", f"{out}/eval/step_{cfg.train.steps:06d}"}
    for step in kept_steps(cfg):
        folders |= {f"{out}/checkpoints/step_{step:06d}", f"{out}/checkpoints/step_{step:06d}/policy"}
    return folders


@pytest.fixture()
def readme_env(tmp_path, monkeypatch):
    """A working folder with the small local files README's lines name: MATHRL_DATA, ~/mathrl-data and
    cases.jsonl."""
    data = tmp_path / "data"
    rows = [{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
             "answer": "He has 3 + 4 = 7 apples.\n#### 7"},
            {"question": "A box holds 6 pens. How many pens are in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"},
            {"question": "Sara had 10 cards and gave away 4. How many are left?", "answer": "10 - 4 = 6\n#### 6"}]
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    home = tmp_path / "home"
    (home / "mathrl-data").mkdir(parents=True)
    (home / "mathrl-data" / "gsm8k").symlink_to(data / "gsm8k")
    (tmp_path / "cases.jsonl").write_text(
        json.dumps({"gold": "7", "response": "so $\\boxed{7}$", "equivalent": True}) + "\n"
        + json.dumps({"gold": "1/2", "response": "the answer is 0.25", "equivalent": False}) + "\n")
    monkeypatch.setenv("MATHRL_DATA", str(data))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _expand(argv: list[str]) -> list[str]:
    return [os.path.expanduser(os.path.expandvars(a)) for a in argv]


def _train_config(argv: list[str]):
    """The resolved config of a README ``mathrl train`` line, through the product's own parser."""
    from mathrl.cli import train_parser
    from mathrl.config import load_config

    args = train_parser().parse_args(argv)
    overrides = list(args.overrides) + ([f"train.resume={args.resume}"] if args.resume else [])
    return load_config(str(ROOT / args.config), overrides)


def test_readme_command_lines_run_as_written(readme_env, capsys):
    from mathrl.cli import main
    from mathrl.eval.benchmarks import parse_benchmarks
    from mathrl.eval.cli import build_parser as eval_parser, resolve

    commands = readme_commands(README.read_text(encoding="utf-8"))
    assert len(commands) >= 15, f"README's command blocks hold only {len(commands)} mathrl lines"
    written: set[str] = set()  # the folders earlier lines write
    for argv, expected in commands:
        argv = _expand(argv)
        line = "mathrl " + " ".join(argv)
        where = f"README line `{line}`"
        if "--help" in argv:
            with pytest.raises(SystemExit) as exit_:
                main(argv)
            assert exit_.value.code == 0, where
            capsys.readouterr()
            continue
        if argv[0] == "train":
            argv = [str(ROOT / a) if a.endswith(".yaml") else a for a in argv]
            rc = main(argv + ["--print-config"])
            err = capsys.readouterr().err
            if expected is not None:  # README shows this line failing, with its message
                assert rc == 2, where
                shown = expected.split("...")[0].rstrip(", ")
                assert err.strip().startswith(shown), f"{where}: README shows\n{expected}\nthe command prints\n{err}"
                continue
            assert rc == 0, f"{where}: {err}"
            written |= train_writes(_train_config(argv[1:]))
        elif argv[0] == "eval":
            args = eval_parser().parse_args(argv[1:])
            if args.compare:
                for folder in args.compare:
                    assert folder in written, f"{where}: no README line before it writes {folder}"
                continue
            if args.model and args.model.startswith("runs/"):
                assert args.model in written, f"{where}: no README training line before it writes {args.model}"
            if args.config:
                args.config = str(ROOT / args.config)
            resolve(args)  # the recipe, the overrides and the flags: raises ConfigError on bad input
            if args.benchmarks:
                parse_benchmarks(args.benchmarks, limit=args.limit)
            if args.out:
                written.add(args.out)
        elif argv[0] in ("verify", "data"):
            rc = main(argv)
            out = capsys.readouterr()
            assert rc == 0, f"{where}: exit {rc}\n{out.out}\n{out.err}"
            if argv[0] == "verify" and "--gold" in argv:
                assert "CORRECT" in out.out, f"{where}: README's example should grade as correct:\n{out.out}"
        else:
            pytest.fail(f"{where}: the test does not know how to run `mathrl {argv[0]}`; teach it here")


def test_readme_names_only_checkpoints_its_runs_keep():
    """Anywhere in README (prose too): a named checkpoint or trainer evaluation is one a README run keeps."""
    text = README.read_text(encoding="utf-8")
    written: set[str] = set()
    for argv, expected in readme_commands(text):
        if argv[0] == "train" and expected is None and "--help" not in argv:
            written |= train_writes(_train_config(_expand(argv[1:])))
    named = re.findall(r"runs/[\w.-]+/(?:checkpoints|eval)/step_\d+", text)
    assert named, "README names no checkpoint: the check below would prove nothing"
    for folder in named:
        assert folder in written, (f"README names {folder}, which no README training line keeps; they keep "
                                   f"{sorted(w for w in written if '/step_' in w and not w.endswith('policy'))}")


def test_checkpoint_check_rejects_a_step_the_demo_never_writes():
    """Negative control: README's old line (step_000020 of the 12-step demo) is refused by the rule."""
    from mathrl.config import load_config

    demo = load_config(str(ROOT / "configs" / "demo.yaml"), [])
    assert demo.train.steps in kept_steps(demo)
    assert "runs/demo/checkpoints/step_000020/policy" not in train_writes(demo)
    assert "runs/demo/checkpoints/step_000012/policy" in train_writes(demo)
    assert kept_steps(load_config(str(ROOT / "configs" / "demo.yaml"),
                                  ["train.steps=20", "train.save_every=5", "train.keep_last=2"])) == {15, 20}
