"""The one entry point: ``mathrl train | eval | ablate | verify | data | prm``.

Every sub-command validates its input before doing any work; configuration and
input errors are printed as one line (no traceback) and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from mathrl import __version__
from mathrl.accelerator import set_ds_accelerator
from mathrl.errors import InputError, MathrlError

USAGE = """mathrl <command> [options]

commands:
  train    run RL (GRPO / PPO) from a YAML recipe plus key=value overrides
  eval     evaluate a model on benchmarks (pass@k, maj@k, greedy accuracy)
  ablate   run an ablation study (RFT, online RFT, GRPO, PPO, variants) and write its report
  verify   grade a response against a gold answer, or a JSONL file of cases
  data     inspect problem sources (show rows, statistics)
  prm      label steps automatically, train and evaluate a process reward model

run `mathrl <command> --help` for the options of a command."""


class UserError(InputError):
    """An input problem reported to the user as one line (exit status 2)."""


def train_parser() -> argparse.ArgumentParser:
    from mathrl.config import help_text

    p = argparse.ArgumentParser(
        prog="mathrl train",
        description="Train a policy with verifiable rewards. Settings come from the dataclass defaults, "
                    "then the YAML recipe, then key=value overrides (e.g. algo.kl_coef=0.04).",
        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="YAML recipe, e.g. configs/demo.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides key.sub=value")
    p.add_argument("--resume", help="'auto' or a checkpoint folder (same as train.resume=...)")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a train.output_dir that holds another "
                   "run, moving that run aside to <output_dir>.replaced-<time> (same as train.overwrite=true)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    return p


def cmd_train(argv: list[str]) -> int:
    from mathrl.config import dump_yaml, load_config

    args = train_parser().parse_args(argv)
    config_path, overrides = args.config, list(args.overrides)
    if config_path is not None and "=" in config_path and not config_path.endswith((".yaml", ".yml")):
        overrides.insert(0, config_path)  # `mathrl train key=value` with no recipe
        config_path = None
    if args.resume:
        overrides.append(f"train.resume={args.resume}")
    if args.overwrite:
        overrides.append("train.overwrite=true")
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
    if cfg.algo.prm_update_every:  # iterative RL that retrains the PRM: the prm package's method on the trainer
        from mathrl.prm.iterative import run as iterative_run

        return int(iterative_run(cfg) or 0)
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


def cmd_prm(argv: list[str]) -> int:
    from mathrl.prm.cli import main as prm_main

    return prm_main(argv)


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "ablate": cmd_ablate, "verify": cmd_verify, "data": cmd_data,
            "prm": cmd_prm}


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
    try:
        return COMMANDS[cmd](rest)
    except MathrlError as exc:  # bad input (exit 2) or a run that stopped itself (exit 3): mathrl/errors.py
        print(f"mathrl {cmd}: {exc.verb}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"mathrl {cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        lost = lost_rank_message(exc)
        if lost is not None:
            print(f"mathrl {cmd}: stopped: {lost}", file=sys.stderr)
            return 3
        raise


#: what gloo and NCCL say when the process at the other end of a collective is gone
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "remote process exited", "NCCL communicator was aborted")


def lost_rank_message(exc: BaseException) -> str | None:
    """One line for a collective that failed because another rank stopped (killed, out of memory, crashed),
    naming the ranks; None for any other error."""
    text = str(exc)
    if not any(marker in text for marker in _PEER_GONE):
        return None
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        rank, world = 0, 1
    if world < 2:
        return None
    other = f"rank {1 - rank}" if world == 2 else f"another of the {world} ranks"
    first = " ".join(text.split())[:200]
    return (f"rank {rank} lost {other}: it stopped (killed, out of memory or an error: its own log says which) "
            f"while this rank waited in a collective ({type(exc).__name__}: {first}); the run's checkpoints are "
            "intact: continue with --resume auto once every rank can run")


if __name__ == "__main__":
    raise SystemExit(main())
