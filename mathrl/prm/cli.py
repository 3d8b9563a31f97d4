"""``mathrl prm``: label steps automatically, train a process reward model, evaluate it.

    mathrl prm label CONFIG [key=value ...] --out labels.jsonl [--k 4] [--split train|heldout] [--problems N]
    mathrl prm train --labels labels.jsonl --out prm/ [--model M] [--epochs 2] [--lr 1e-5] [--batch 16]
                     [--target soft|hard] [--token-budget 8192] [--seed 0]
    mathrl prm eval --prm prm/ --labels heldout.jsonl [--out eval.json]

``label`` samples ``rollout.n`` responses per problem with the config's policy and rollout engine, grades them
with the verifier and labels every step with :func:`mathrl.prm.labels.label_steps` (``--k`` completions per
step); one JSON line per response. ``train`` fits the scalar head and the decoder of ``--model`` (default: the
model the labels were sampled from) to the labels with :func:`mathrl.prm.model.prm_train_step`. ``eval`` reports
the step accuracy and AUC against the hard labels and best-of-N: per problem, the response whose weakest step
scores highest (Math-Shepherd's min), against majority voting and a random response (mean accuracy), with
intervals and the per-problem picks (:mod:`mathrl.prm.evaluation`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mathrl.config import load_config
from mathrl.data.splits import heldout_problems, load_training_problems
from mathrl.dist.collectives import init_distributed
from mathrl.errors import InputError
from mathrl.jsonl import json_objects
from mathrl.prm.evaluation import evaluate_prm
from mathrl.prm.pipeline import label_problems, train_prm, write_labels

__all__ = ["main", "read_records"]


class PRMInputError(InputError):
    """A bad ``mathrl prm`` input, reported as one line."""


REQUIRED = {"problem_id": str, "gold": str, "prompt_ids": list, "response_ids": list, "correct": bool,
            "ends": list, "hard": list, "soft": list}


def read_records(path: str | Path) -> list[dict]:
    """The labelled responses of a ``mathrl prm label`` file; a bad line raises :class:`PRMInputError` naming the
    file, the line and the key at fault."""
    p = Path(path)
    out = []
    for ln, rec in json_objects(p, PRMInputError, missing="write one with `mathrl prm label`"):
        for key, tp in REQUIRED.items():
            if not isinstance(rec.get(key), tp):
                raise PRMInputError(f"{p}:{ln}: key {key!r} must be a {tp.__name__}, got {rec.get(key)!r:.60}")
        if not (len(rec["ends"]) == len(rec["hard"]) == len(rec["soft"])):
            raise PRMInputError(f"{p}:{ln}: 'ends', 'hard' and 'soft' must have one length (one entry per step)")
        if any(not 0 <= int(e) < len(rec["response_ids"]) for e in rec["ends"]):
            raise PRMInputError(f"{p}:{ln}: a step end lies outside the response's {len(rec['response_ids'])} tokens")
        out.append(rec)
    if not out:
        raise PRMInputError(f"{p}: no records")
    return out


def cmd_label(args) -> int:
    cfg = load_config(args.config, args.overrides)
    problems = load_training_problems(cfg) if args.split == "train" else heldout_problems(cfg)[1]
    problems = problems[: args.problems] if args.problems else problems
    records = label_problems(cfg, problems, k=args.k)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_labels(out, records)
    print(f"mathrl prm label: {len(records)} responses of {len(problems)} problems, "
          f"{sum(len(r['ends']) for r in records)} steps, {sum(sum(r['hard']) for r in records):.0f} labelled correct "
          f"(hard) -> {out}")
    return 0


def cmd_train(args) -> int:
    records = read_records(args.labels)
    dist = init_distributed()
    train_prm(records, args.model or records[0].get("model", "embedded"), args.out, dist=dist, epochs=args.epochs,
              lr=args.lr, batch=args.batch, target=args.target, token_budget=args.token_budget, seed=args.seed)
    print(f"mathrl prm train: {len(records)} responses, {sum(len(r['ends']) for r in records)} steps -> {args.out}")
    return 0


def cmd_eval(args) -> int:
    if not Path(args.prm, "backbone.safetensors").is_file():
        raise PRMInputError(f"--prm {args.prm}: not a PRM folder written by `mathrl prm train` "
                            "(no backbone.safetensors)")
    result = evaluate_prm(args.prm, read_records(args.labels), token_budget=args.token_budget)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_problem", "step_scores")}, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mathrl prm", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lab = sub.add_parser("label", help="sample, grade and label steps automatically")
    lab.add_argument("config", nargs="?")
    lab.add_argument("overrides", nargs="*")
    lab.add_argument("--out", required=True)
    lab.add_argument("--k", type=int, default=4, help="completions per step (default 4)")
    lab.add_argument("--split", choices=("train", "heldout"), default="train")
    lab.add_argument("--problems", type=int, default=None, help="only the first N problems")
    tr = sub.add_parser("train", help="train a PRM on labelled steps")
    tr.add_argument("--labels", required=True)
    tr.add_argument("--out", required=True)
    tr.add_argument("--model", default=None, help="the model to start from (default: the one that was labelled)")
    tr.add_argument("--epochs", type=int, default=2)
    tr.add_argument("--lr", type=float, default=1e-5)
    tr.add_argument("--batch", type=int, default=16, help="responses per optimizer step")
    tr.add_argument("--target", choices=("soft", "hard"), default="soft")
    tr.add_argument("--token-budget", type=int, default=8192)
    tr.add_argument("--seed", type=int, default=0)
    ev = sub.add_parser("eval", help="step accuracy, AUC and best-of-N of a PRM on labelled held-out responses")
    ev.add_argument("--prm", required=True)
    ev.add_argument("--labels", required=True)
    ev.add_argument("--token-budget", type=int, default=8192)
    ev.add_argument("--out", default=None, help="also write the figures and the per-problem picks here (JSON)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if getattr(args, "k", 1) < 1 or getattr(args, "epochs", 1) < 1 or getattr(args, "batch", 1) < 1:
        raise PRMInputError("--k, --epochs and --batch must be >= 1")
    if args.cmd == "label" and args.config is not None and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    return {"label": cmd_label, "train": cmd_train, "eval": cmd_eval}[args.cmd](args)
