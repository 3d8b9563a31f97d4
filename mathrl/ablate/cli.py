"""``mathrl ablate STUDY.yaml``: run (or resume) an ablation grid and write its report.

    mathrl ablate configs/ablations/cpu_demo.yaml                 run every run not yet complete, then report
    mathrl ablate configs/ablations/cpu_demo.yaml --print-commands  one launcher line per pending run (cluster)
    mathrl ablate STUDY --only grpo,rft --out DIR                  just these runs (what a cluster job runs)
    mathrl ablate STUDY --report-only                              only the report from the complete runs
    mathrl ablate STUDY data.path=/data/asdiv/test.jsonl            key=value for the base of every run
"""

from __future__ import annotations

import argparse
import sys

from mathrl.config.help import registry_help
from mathrl.registry import ABLATION_METHODS

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mathrl ablate",
        description="Run a DeepSeekMath-style ablation study (RFT, online RFT, GRPO, PPO and variants) on one "
                    "machine, resuming a half-finished grid, and write report.md/report.json and the plots "
                    "accuracy_curve.png and maj_pass_at_k.png into the study folder.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] + "\n" + "\n".join(registry_help(ABLATION_METHODS)))
    p.add_argument("study", help="study YAML, e.g. configs/ablations/cpu_demo.yaml")
    p.add_argument("overrides", nargs="*", help="config overrides key.sub=value applied to the base of every run "
                                                "(a run's own overrides still win), e.g. data.path=FILE")
    p.add_argument("--out", help="study folder (default: study.out of the YAML, else runs/ablations/<name>)")
    p.add_argument("--print-commands", action="store_true",
                   help="print one launcher command per run that is not complete (then the report command) and exit")
    p.add_argument("--only", help="comma list of run names to run (default: all)")
    p.add_argument("--report-only", action="store_true", help="do not train; write the report of the complete runs")
    p.add_argument("--no-report", action="store_true", help="do not write the report (used by worker processes)")
    p.add_argument("--in-process", action="store_true",
                   help="run every run in this process instead of one worker process per run")
    return p


def main(argv: list[str]) -> int:
    from mathrl.ablate.driver import run_study

    args = build_parser().parse_intermixed_args(argv)  # overrides may come after the options
    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    if args.print_commands:
        print("\n".join(run_study(args.study, out=args.out, print_only=True, overrides=args.overrides)["commands"]))
        return 0
    from mathrl.ablate.driver import AblationError

    try:
        run_study(args.study, out=args.out, only=only, report_only=args.report_only, report=not args.no_report,
                  isolate=False if args.in_process else None, overrides=args.overrides)
    except AblationError as exc:
        print(f"mathrl ablate: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # python -m mathrl.ablate.cli, or `deepspeed --module mathrl.ablate.cli ...`
    import os

    from mathrl.config import ConfigError

    argv = sys.argv[1:]
    for item in [a for a in argv if a.startswith(("--local_rank=", "--local-rank="))]:
        os.environ.setdefault("LOCAL_RANK", item.split("=", 1)[1])  # added by the deepspeed launcher
        argv.remove(item)
    from mathrl.accelerator import set_ds_accelerator

    set_ds_accelerator()  # DS_ACCELERATOR=cpu only where no CUDA device can be visible
    try:
        raise SystemExit(main(argv))
    except ConfigError as exc:
        print(f"mathrl ablate: error: {exc}", file=sys.stderr)
        raise SystemExit(2)
