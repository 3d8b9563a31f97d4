"""The one entry point: ``mathrl train | eval | ablate | verify | data``.

Every sub-command validates its input before doing any work; configuration and
input errors are printed as one line (no traceback) and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Iterable, Mapping, MutableMapping

from mathrl import __version__

USAGE = """mathrl <command> [options]

commands:
  train    run RL (GRPO / PPO) from a YAML recipe plus key=value overrides
  eval     evaluate a model on benchmarks (pass@k, maj@k, greedy accuracy)
  ablate   run an ablation study (RFT, online RFT, GRPO, PPO, variants) and write its report
  verify   grade a response against a gold answer, or a JSONL file of cases
  data     inspect problem sources (show rows, statistics)

run `mathrl <command> --help` for the options of a command."""


class UserError(Exception):
    """An input problem reported to the user as one line (exit status 2)."""


def _train_parser() -> argparse.ArgumentParser:
    from mathrl.config import help_text

    p = argparse.ArgumentParser(
        prog="mathrl train",
        description="Train a policy with verifiable rewards. Settings come from the dataclass defaults, "
                    "then the YAML recipe, then key=value overrides (e.g. algo.kl_coef=0.04).",
        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="YAML recipe, e.g. configs/demo.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides key.sub=value")
    p.add_argument("--resume", help="'auto' or a checkpoint folder (same as train.resume=...)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    return p


def cmd_train(argv: list[str]) -> int:
    from mathrl.config import dump_yaml, load_config

    args = _train_parser().parse_args(argv)
    config_path, overrides = args.config, list(args.overrides)
    if config_path is not None and "=" in config_path and not config_path.endswith((".yaml", ".yml")):
        overrides.insert(0, config_path)  # `mathrl train key=value` with no recipe
        config_path = None
    if args.resume:
        overrides.append(f"train.resume={args.resume}")
    cfg = load_config(config_path, overrides)
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    try:
        from mathrl.train import run as train_run  # the RL loop
    except ImportError:
        raise UserError("the training loop is not part of this version of mathrl yet; "
                        "`mathrl train --print-config` validates a recipe, `mathrl eval` evaluates a model") \
            from None
    return int(train_run(cfg) or 0)


def cmd_eval(argv: list[str]) -> int:
    from mathrl.eval.cli import main as eval_main

    return eval_main(argv)


def cmd_ablate(argv: list[str]) -> int:
    from mathrl.ablate.cli import main as ablate_main

    return ablate_main(argv)


def cmd_verify(argv: list[str]) -> int:
    from mathrl.reward.cli import main as verify_main

    return verify_main(argv)


def cmd_data(argv: list[str]) -> int:
    from mathrl.data.cli import main as data_main

    return data_main(argv)


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "ablate": cmd_ablate, "verify": cmd_verify, "data": cmd_data}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the `deepspeed` launcher adds --local_rank=N before the user's arguments; the env var carries it too
    for item in [a for a in argv if a.startswith(("--local_rank=", "--local-rank="))]:
        os.environ.setdefault("LOCAL_RANK", item.split("=", 1)[1])
        argv.remove(item)
    set_ds_accelerator()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"mathrl {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"mathrl: unknown command {cmd!r}; allowed: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    from mathrl.config import ConfigError

    try:
        return COMMANDS[cmd](rest)
    except (ConfigError, UserError) as exc:
        print(f"mathrl {cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mathrl {cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # known input-error types from the stages
        if type(exc).__name__ in ("DataError", "ModelError", "VerifyInputError"):
            print(f"mathrl {cmd}: error: {exc}", file=sys.stderr)
            return 2
        if type(exc).__name__ in ("TrainingError", "CheckpointError"):  # the run stopped; the message says why
            print(f"mathrl {cmd}: stopped: {exc}", file=sys.stderr)
            return 3
        raise


_NVIDIA_GPU_FILE = re.compile(r"^/dev/nvidia[0-9]+$")  # not nvidiactl, nvidia-uvm, nvidia-modeset, nvidia-caps


def ds_accelerator_choice(env: Mapping[str, str], device_files: Iterable[str]) -> tuple[str | None, str | None]:
    """What to put in ``DS_ACCELERATOR`` before DeepSpeed is imported, and a note for the console.

    DeepSpeed picks its accelerator once per process: ``DS_ACCELERATOR`` when set, else CUDA when
    ``torch.cuda.is_available()`` (the test :func:`mathrl.train.engines.device` makes too), else the CPU
    with a warning that it could not find a GPU. mathrl sets ``cpu`` only where no CUDA device can be
    visible, to spare that warning on a CPU machine: no ``/dev/nvidia<N>`` file (a container given only
    GPU 3 has ``/dev/nvidia3`` and no ``/dev/nvidia0``), no ``/dev/dxg`` (WSL2), and no
    ``CUDA_VISIBLE_DEVICES`` naming a device; or where GPUs exist but ``CUDA_VISIBLE_DEVICES`` is empty
    or ``-1`` (then the note says the GPUs are hidden). A ``DS_ACCELERATOR`` the user set is never
    changed. Anything else is left to DeepSpeed's own detection, which agrees with ``device()``.
    Checking files does not initialise CUDA in this (parent) process.

    Returns ``(value, note)``: ``value`` is ``"cpu"`` or ``None`` (leave it unset), ``note`` a line for
    stderr or ``None``.
    """
    if "DS_ACCELERATOR" in env:
        return None, None
    files = sorted(set(device_files))
    gpus = [f for f in files if _NVIDIA_GPU_FILE.match(f)]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and visible.strip() in ("", "-1")
    if gpus and hidden:
        return "cpu", (f"mathrl: CUDA GPUs are present ({', '.join(gpus)}) but CUDA_VISIBLE_DEVICES={visible!r} "
                       "hides them all: running on the CPU (unset CUDA_VISIBLE_DEVICES or name a device, e.g. "
                       "CUDA_VISIBLE_DEVICES=0, to use a GPU)")
    if gpus or "/dev/dxg" in files or (visible and not hidden):
        return None, None
    return "cpu", None


def device_files() -> list[str]:
    """The ``/dev`` entries :func:`ds_accelerator_choice` reads (``/dev/nvidia*``, ``/dev/dxg``)."""
    import glob

    return glob.glob("/dev/nvidia*") + glob.glob("/dev/dxg")


def set_ds_accelerator(env: MutableMapping[str, str] | None = None) -> str | None:
    """Apply :func:`ds_accelerator_choice` to ``env`` (default ``os.environ``); print its note once, on
    the first rank. Returns the value set, or ``None``."""
    env = os.environ if env is None else env
    value, note = ds_accelerator_choice(env, device_files())
    if value is not None:
        env["DS_ACCELERATOR"] = value
    if note and env.get("RANK", env.get("LOCAL_RANK", "0")) == "0":
        print(note, file=sys.stderr, flush=True)
    return value


if __name__ == "__main__":
    raise SystemExit(main())
