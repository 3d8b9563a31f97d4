"""``mathrl eval``: evaluate a model (or every checkpoint of a run), compare runs, re-grade saved runs.

Modes::

    mathrl eval --config configs/demo.yaml [key=value ...] --out DIR
    mathrl eval --model PATH_OR_ID --benchmarks gsm8k,math500 --data-dir ~/mathrl-data \\
                --n 16 --k 1,4,16 --temperature 0.6 --top-p 0.95 --max-tokens 1024 --limit 200
    mathrl eval --suite smoke --model embedded          (eval/suites/smoke.yaml)
    mathrl eval --compare RUN_A RUN_B [--out DIR]       (two finished eval folders, e.g. before/after RL)
    mathrl eval --series TRAIN_RUN_DIR --benchmarks ... (every checkpoint of a training run)
    mathrl eval --regrade EVAL_DIR                      (grade saved samples again, no generation)
    mathrl eval ... --out DIR --resume                  (continue an interrupted evaluation)
    mathrl eval --model M --benchmarks jsonl=my.jsonl   (your own file: question and answer fields)
    mathrl eval --model RUN/checkpoints/step_N/adapter  (a LoRA adapter: merged onto its base once)

Settings are resolved like ``mathrl train``: config defaults, the YAML
(``--config``), a suite's settings (``--suite``), ``key=value`` overrides, then
the flags. Without ``--benchmarks``/``--suite`` the held-out set of the config
is evaluated (:func:`mathrl.eval.benchmarks.heldout_problems`).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path

from mathrl.config import ConfigError
from mathrl.eval.evaluate import evaluate_model, powers_up_to

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mathrl eval",
        description="Evaluate a model on math benchmarks: greedy accuracy, unbiased pass@k, maj@k (answers "
                    "grouped by verified equivalence), lengths and truncation, with bootstrap intervals. "
                    "Writes summary.json, report.md, PNG plots and per-problem samples.jsonl.gz.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("Settings")[0].split("Modes::")[1])
    p.add_argument("overrides", nargs="*", help="config overrides key.sub=value (e.g. eval.n=16 rollout.backend=hf)")
    p.add_argument("--config", help="YAML recipe (model, held-out data, eval sampling), e.g. configs/demo.yaml")
    p.add_argument("--model", help="model: 'embedded', a local Hugging Face folder / checkpoint, or a hub id "
                                   "(= model.name)")
    p.add_argument("--benchmarks", help=f"comma list of benchmarks, optionally name=FILE; known: "
                                        f"{', '.join(_benchmark_names())}")
    p.add_argument("--suite", help="a suite name under eval/suites/ or a suite .yaml file")
    p.add_argument("--data-dir", help="folder of local copies, <benchmark>/test.jsonl (e.g. gsm8k/test.jsonl); "
                                      "default: $MATHRL_DATA if set, else the hub")
    p.add_argument("--n", type=int, help="samples per problem (= eval.n)")
    p.add_argument("--k", help="comma list of k for pass@k / maj@k, each <= n (= eval.k)")
    p.add_argument("--temperature", type=float, help="sampling temperature (= eval.temperature)")
    p.add_argument("--top-p", type=float, help="nucleus mass (= eval.top_p)")
    p.add_argument("--top-k", type=int, default=None, help="top-k sampling (-1 = off)")
    p.add_argument("--max-tokens", type=int, help="max new tokens per sample (= eval.max_tokens)")
    p.add_argument("--limit", type=int, help="first N problems of each benchmark (config mode: data.eval_limit)")
    p.add_argument("--template", help="prompt template (= data.template): chat_boxed, chat_boxed_oneshot, "
                                      "fewshot_plain")
    p.add_argument("--backend", choices=["auto", "vllm", "hf"], help="rollout engine (= rollout.backend)")
    p.add_argument("--seed", type=int, help="sampling seed (= train.seed)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy (temperature 0) decode")
    p.add_argument("--out", help="output folder (default runs/eval/<model>-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted evaluation into the same --out folder: finished benchmarks are "
                        "kept, generated chunks are not sampled again (same model and settings required)")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="compare two evaluation folders (A = before, B = after)")
    p.add_argument("--series", metavar="RUN_DIR", help="evaluate every checkpoint found in a training run folder")
    p.add_argument("--regrade", metavar="EVAL_DIR", help="grade the saved samples of an evaluation folder again")
    return p


def _benchmark_names() -> list[str]:
    from mathrl.eval.benchmarks import benchmarks

    return list(benchmarks())


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- config resolution


def _parse_k(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--k {text!r}: expected a comma list of integers, e.g. 1,4,16") from None
    if not ks:
        raise ConfigError(f"--k {text!r}: expected a comma list of integers, e.g. 1,4,16")
    return ks


def resolve(args: argparse.Namespace):
    """(Config, suite or None) from the arguments; raises ConfigError on bad input."""
    from mathrl.config import load_config
    from mathrl.eval.benchmarks import load_suite

    if args.config is not None and not Path(args.config).is_file():
        raise ConfigError(f"--config {args.config}: file not found")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise ConfigError(f"unexpected argument {bad[0]!r}: overrides look like key.sub=value; options start "
                          "with -- (see mathrl eval --help)")
    overrides: list[str] = []
    suite = None
    if args.suite:
        suite = load_suite(args.suite)
        for key, field in (("n", "eval.n"), ("temperature", "eval.temperature"), ("top_p", "eval.top_p"),
                           ("max_tokens", "eval.max_tokens"), ("greedy", "eval.greedy"),
                           ("template", "data.template"), ("seed", "train.seed")):
            if suite.get(key) is not None:
                overrides.append(f"{field}={suite[key]}")
        if suite.get("k") is not None:
            overrides.append(f"eval.k={','.join(str(k) for k in suite['k'])}")
    overrides += list(args.overrides)
    flag_map = (("model", "model.name"), ("n", "eval.n"), ("temperature", "eval.temperature"),
                ("top_p", "eval.top_p"), ("max_tokens", "eval.max_tokens"), ("template", "data.template"),
                ("backend", "rollout.backend"), ("seed", "train.seed"))
    for attr, field in flag_map:
        v = getattr(args, attr)
        if v is not None:
            overrides.append(f"{field}={v}")
    if args.k is not None:
        overrides.append(f"eval.k={','.join(str(k) for k in _parse_k(args.k))}")
    if args.no_greedy:
        overrides.append("eval.greedy=false")
    if args.limit is not None:
        if args.limit < 1:
            raise ConfigError(f"--limit {args.limit}: out of range; allowed: >= 1")
        overrides.append(f"data.eval_limit={args.limit}")
    # n set (flag or suite) without an explicit k (flag or eval.k=...): keep the k that fit, else powers of two
    n_set = args.n is not None or (suite is not None and suite.get("n") is not None)
    k_explicit = args.k is not None or any(o.startswith("eval.k=") for o in args.overrides)
    if n_set and not k_explicit:
        n = int([o for o in overrides if o.startswith("eval.n=")][-1].split("=", 1)[1])
        probe = load_config(args.config, [o for o in overrides if not o.startswith("eval.n=")] + ["eval.n=1000000"])
        if any(k > n for k in probe.eval.k):
            overrides.append(f"eval.k={','.join(str(k) for k in powers_up_to(n))}")
    cfg = load_config(args.config, overrides)
    return cfg, suite


def _default_out(model: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.strip("/").split("/")[-1] or "model")[:60]
    return Path("runs") / "eval" / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}"


# --------------------------------------------------------------------------- one evaluation


def _eval_sets(cfg, args, suite):
    """[(name, problems)], loaded before any model work so that data errors stop the run early."""
    from mathrl.data.loader import get_source
    from mathrl.data.splits import heldout_problems
    from mathrl.eval.benchmarks import load_benchmark, parse_benchmarks

    # the flag, then $MATHRL_DATA (the same rule as every command), then the suite's own default
    data_dir = args.data_dir or os.environ.get("MATHRL_DATA") or None
    if suite is not None:
        specs = suite["benchmarks"]
        if data_dir is None and suite.get("data_dir"):
            data_dir = suite["data_dir"]
    if suite is not None:
        if args.limit is not None:
            for s in specs:
                s.limit = args.limit
    elif args.benchmarks:
        specs = parse_benchmarks(args.benchmarks, limit=args.limit)
    else:
        name, problems = heldout_problems(cfg)
        return [(name, problems)]
    out = []
    for s in specs:
        s.synthetic_level = cfg.data.synthetic_level
        s.seed = cfg.train.seed
        if s.limit is None and get_source(s.benchmark.source).is_generated:
            s.limit = cfg.data.eval_limit
        out.append((s.name, load_benchmark(s, data_dir)))
    return out


# --------------------------------------------------------------------------- entry point


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    command = "mathrl eval " + " ".join(shlex.quote(a) for a in argv)
    modes = [m for m in ("compare", "series", "regrade") if getattr(args, m)]
    if len(modes) > 1:
        raise ConfigError(f"--{modes[0]} and --{modes[1]} cannot be combined")
    if args.benchmarks and args.suite:
        raise ConfigError("give either --benchmarks or --suite, not both")
    if args.compare:
        from mathrl.eval.compare import compare_runs

        compare_runs(args.compare[0], args.compare[1], out_dir=args.out)
        return 0
    if args.regrade:
        from mathrl.eval.series import regrade_run

        regrade_run(Path(args.regrade))
        return 0
    if args.series and args.config is None and (Path(args.series) / "config.yaml").is_file():
        # the run's own settings (held-out set, eval.*, rollout.backend, template); flags and key=value still win
        args.config = str(Path(args.series) / "config.yaml")
        print(f"mathrl eval --series: settings from {args.config} (give --config to use others)", file=sys.stderr)
    cfg, suite = resolve(args)
    if args.series:
        from mathrl.eval.series import evaluate_series

        evaluate_series(Path(args.series), cfg, lambda: _eval_sets(cfg, args, suite),
                        out_dir=Path(args.out) if args.out else None, command=command, top_k=args.top_k)
        return 0
    if args.resume and not args.out:
        raise ConfigError("--resume continues an evaluation folder: give it with --out DIR")
    sets = _eval_sets(cfg, args, suite)
    out_dir = Path(args.out) if args.out else _default_out(cfg.model.name)
    evaluate_model(cfg, sets, out_dir, model_spec=cfg.model.name, command=command, top_k=args.top_k,
                   resume=args.resume)
    return 0
