#!/usr/bin/env python
"""The TRL anchor: TRL's GRPOTrainer on the same task as a mathrl recipe, for a wall-clock budget, with
checkpoints that ``mathrl eval --series`` evaluates the same way as mathrl's own; and the plot of
held-out accuracy against training wall-clock for both systems.

    # 1. TRL on the task of a mathrl recipe (checkpoints every 2 minutes, stop after 10)
    OMP_NUM_THREADS=2 python scripts/trl_anchor.py train --config configs/demo.yaml --minutes 10 \\
        --save-every-minutes 2 --out runs/trl_demo [key=value ...]
    # 2. both runs evaluated by the same command (every checkpoint and the base model)
    mathrl eval --config configs/demo.yaml --series runs/trl_demo --out runs/trl_demo/series
    mathrl eval --config configs/demo.yaml --series runs/demo --out runs/demo/series
    # 3. held-out accuracy against wall-clock
    python scripts/trl_anchor.py plot mathrl=runs/demo trl=runs/trl_demo --metric greedy --out demo_vs_trl.png

"The same task" means: the model of ``model.name``, the training problems of ``data.*`` (with
``data.exclude_overlap_with`` applied) in mathrl's per-step order (``train.seed``), the same prompt
template, the same reward terms graded by mathrl's verifier, ``train.batch_size`` prompts x
``rollout.n`` samples per optimizer step, the same sampling (temperature, top-p, ``rollout.max_tokens``)
and the same objective settings (``algo.kl_coef`` as beta, the clip range, std-normalised group
advantages, ``algo.loss_agg`` mapped to TRL's ``loss_type``), learning rate, schedule and clipping;
``model.autocast=bfloat16`` becomes TRL's ``bf16=True``; ``algo.mask_truncated`` its
``mask_truncated_completions``. Settings TRL has no counterpart for (``algo.dynamic_sampling``,
``algo.pass_rate_filter``) are refused: override them off for both runs. TRL generates with transformers (its CPU path;
it has no vLLM-CPU mode). Each checkpoint holds the model only (``save_only_model``).

Wall-clock is the training loop's time, model loading excluded, on both sides: TRL's from the first
optimizer step's start (``<out>/wallclock.jsonl``, one line per step), mathrl's the running sum of
``time/step`` in ``metrics.jsonl``; checkpoint writing and the trainer's own before/after evaluations
are not counted on either side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # bench_vs_trl, for the micro-batch rule

def pinned_trl(pyproject: Path = ROOT / "pyproject.toml") -> str | None:
    """The TRL version pyproject.toml's ``dev`` extra pins (``trl==X``): the one the published comparisons
    ran with; None when the extra names TRL without an exact pin."""
    import tomllib

    dev = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["dev"]
    for req in dev:
        name, _, version = req.replace(" ", "").partition("==")
        if name.lower() == "trl" and version:
            return version
    return None


LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
# algo.std_normalize -> GRPOConfig.scale_rewards
SCALE_REWARDS = {True: "group", "group": "group", "batch": "batch", False: "none"}


def trl_config_kwargs(cfg, out: Path, micro_rows: int) -> dict:
    """GRPOConfig keyword arguments for the task of mathrl config ``cfg`` (see the module docstring)."""
    from mathrl.models.precision import resolve_autocast

    a, r, t = cfg.algo, cfg.rollout, cfg.train
    if a.name != "grpo":
        raise SystemExit(f"trl_anchor: algo.name={a.name!r}: only the GRPO recipes have a TRL counterpart here")
    if cfg.loss_agg not in LOSS_TYPES:
        raise SystemExit(f"trl_anchor: algo.loss_agg={cfg.loss_agg!r} has no TRL loss_type; allowed: "
                         f"{', '.join(LOSS_TYPES)}")
    if cfg.advantage != "grpo":
        raise SystemExit(f"trl_anchor: algo.advantage={cfg.advantage!r}: TRL's GRPOTrainer computes GRPO's group "
                         "advantage only (allowed here: grpo, with algo.std_normalize true/group/batch/false)")
    unmatched = [f"algo.{k}={v!r}" for k, v in (("dynamic_sampling", a.dynamic_sampling),
                                                 ("pass_rate_filter", a.pass_rate_filter)) if v]
    if unmatched:
        raise SystemExit(f"trl_anchor: {', '.join(unmatched)} has no counterpart in TRL's GRPOTrainer, so the two "
                         "runs would not sample the same work; give both runs algo.dynamic_sampling=false "
                         "algo.pass_rate_filter=0 (allowed here: false / 0)")
    rows = t.batch_size * r.n
    accum = rows // micro_rows
    return dict(
        output_dir=str(out), use_cpu=not _cuda(), use_vllm=False,
        bf16=resolve_autocast(cfg.model.autocast) == "bfloat16", fp16=False,
        gradient_checkpointing=False, per_device_train_batch_size=micro_rows, gradient_accumulation_steps=accum,
        steps_per_generation=accum,            # one generation of all B x G rows per optimizer step
        num_generations=r.n, max_completion_length=r.max_tokens, temperature=r.temperature, top_p=r.top_p,
        top_k=r.top_k if r.top_k > 0 else 0,
        beta=a.kl_coef, num_iterations=1, epsilon=cfg.clip_low, epsilon_high=cfg.clip_high,
        loss_type=LOSS_TYPES[cfg.loss_agg], scale_rewards=SCALE_REWARDS[a.std_normalize],
        mask_truncated_completions=a.mask_truncated, disable_dropout=True,
        learning_rate=t.lr, lr_scheduler_type=t.lr_schedule, warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm or 1e9, max_steps=t.steps,
        seed=t.seed, data_seed=t.seed, shuffle_dataset=False,   # the rows are already in mathrl's order
        logging_steps=1, report_to="none", save_strategy="no", save_only_model=True, log_completions=False,
        dataloader_num_workers=0, remove_unused_columns=False, model_init_kwargs={"dtype": "float32"},
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def training_rows(cfg, tokenizer) -> list[dict]:
    """The prompts of every optimizer step in mathrl's order: ``train.batch_size`` problems per step."""
    from mathrl.data import render_prompt
    from mathrl.data.splits import load_training_problems, step_indices

    problems = load_training_problems(cfg)
    rows = []
    for s in range(cfg.train.steps):
        for i in step_indices(len(problems), s, cfg.train.batch_size, cfg.train.seed, cfg.data.shuffle):
            p = problems[i]
            rows.append({"prompt": render_prompt(p, tokenizer, cfg.data.template), "gold": p.gold, "id": p.id})
    return rows


def make_reward(cfg, eos_ids: set[int]):
    """mathrl's reward terms of ``cfg`` (its verifier, its truncation rule) as a TRL reward function."""
    from mathrl.reward import GradeOptions, compute_rewards, grade_batch
    from mathrl.reward.rewards import RewardContext, needs_grades, reward_terms

    terms = reward_terms(cfg)
    options = GradeOptions.from_config(cfg)
    T = cfg.rollout.max_tokens

    def mathrl_reward(prompts, completions, completion_ids, gold, **_kw):
        truncated = [len(ids) >= T and ids[-1] not in eos_ids for ids in completion_ids]
        grades = grade_batch(completions, gold, options, truncated=truncated) if needs_grades(terms) else None
        return compute_rewards(terms, RewardContext(responses=completions, grades=grades, truncated=truncated,
                                                    lengths=[len(i) for i in completion_ids], max_length=T,
                                                    golds=list(gold)))

    mathrl_reward.__name__ = "mathrl_" + "_".join(terms)
    return mathrl_reward


def micro_rows_for(rows: int, width: int, budget: int) -> int:
    """Largest divisor of ``rows`` whose padded micro-batch ``d x width`` tokens fits ``budget`` (>= 1):
    the rule bench_vs_trl sizes TRL's micro-batches by."""
    from bench_vs_trl import trl_micro_rows

    return trl_micro_rows(rows, width, 0, budget)


def cmd_train(args) -> int:
    import yaml
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mathrl.config import load_config
    from mathrl.models import resolve_model_path
    from mathrl.train.memory import token_cap

    import trl

    pin = pinned_trl()
    if pin is not None and trl.__version__ != pin:
        print(f"trl_anchor: warning: TRL {trl.__version__} is installed but the published comparisons ran TRL "
              f"{pin} (pyproject.toml, dev extra); its defaults may differ: pip install trl=={pin}",
              file=sys.stderr, flush=True)
    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok = AutoTokenizer.from_pretrained(model_path)
    rows = training_rows(cfg, tok)
    width = max(len(tok(r["prompt"])["input_ids"]) for r in rows) + cfg.rollout.max_tokens
    # TRL has no memory fit: train.micro_batch_tokens=auto is its upper value here (memory.token_cap)
    micro = micro_rows_for(cfg.train.batch_size * cfg.rollout.n, width, token_cap(cfg.train.micro_batch_tokens))
    kwargs = trl_config_kwargs(cfg, out, micro)
    # the run folder reads like a mathrl run to `mathrl eval --series`: its config names the base model
    (out / "config.yaml").write_text(yaml.safe_dump({"model": {"name": cfg.model.name}, "trl_anchor": {
        "config": args.config, "trl_version": trl.__version__, "overrides": list(args.overrides), "minutes": args.minutes,
        "trl_settings": {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool))}}}))
    budget_s = args.minutes * 60.0 if args.minutes else float("inf")
    every_s = args.save_every_minutes * 60.0 if args.save_every_minutes else float("inf")
    clock = out / "wallclock.jsonl"
    clock.write_text("")

    class Budget(TrainerCallback):
        """Records each step's wall-clock, saves every ``--save-every-minutes`` and stops at ``--minutes``."""

        t0: float | None = None
        next_save = every_s
        saving = 0.0  # seconds spent writing checkpoints, left out of the clock (as mathrl's time/step)
        step_end = 0.0

        def on_step_begin(self, a, state, control, **kw):
            if self.t0 is None:
                self.t0 = time.perf_counter()

        def on_save(self, a, state, control, **kw):
            self.saving += time.perf_counter() - self.step_end

        def on_step_end(self, a, state, control, **kw):
            self.step_end = time.perf_counter()
            elapsed = self.step_end - self.t0 - self.saving
            with clock.open("a") as fh:
                fh.write(json.dumps({"step": state.global_step, "seconds": round(elapsed, 2)}) + "\n")
            if elapsed >= self.next_save:
                control.should_save = True
                while self.next_save <= elapsed:
                    self.next_save += every_s
            if elapsed >= budget_s:
                control.should_training_stop = True
                control.should_save = True

    eos: set[int] = set()
    trainer = GRPOTrainer(model=model_path, reward_funcs=make_reward(cfg, eos), args=GRPOConfig(**kwargs),
                          train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[Budget()])
    eos.update(int(i) for i in trainer.eos_token_ids)
    trainer.train()
    final = out / f"checkpoint-{trainer.state.global_step}"
    if not final.is_dir():  # the last step was not a save point (max_steps reached before the budget)
        trainer.save_model(str(final))
    last = json.loads(clock.read_text().splitlines()[-1]) if clock.read_text().strip() else {}
    print(f"trl_anchor: {trainer.state.global_step} steps in {last.get('seconds', 0):.0f} s; checkpoints under {out}")
    return 0


# --------------------------------------------------------------------------- the plot


def wallclock(run: Path) -> dict[int, float]:
    """Step -> seconds of training at its end: TRL's wallclock.jsonl or mathrl's metrics.jsonl."""
    if (run / "wallclock.jsonl").is_file():
        rows = [json.loads(x) for x in (run / "wallclock.jsonl").read_text().splitlines() if x.strip()]
        return {0: 0.0} | {int(r["step"]): float(r["seconds"]) for r in rows}
    total, out = 0.0, {0: 0.0}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("event") in (None, "step") and "time/step" in row:
            total += float(row["time/step"])
            out[int(row["step"])] = total
    return out


def curve(run: Path, series: Path, benchmark: str | None, metric: str) -> tuple[list[float], list[float], str]:
    """(minutes, metric in %, benchmark) of every evaluated checkpoint of a run."""
    data = json.loads((series / "series.json").read_text())
    clock = wallclock(run)
    xs, ys = [], []
    for pt in data["points"]:
        b = benchmark or next(iter(pt["benchmarks"]))
        if pt["step"] in clock and metric in pt["benchmarks"].get(b, {}):
            xs.append(clock[pt["step"]] / 60)
            ys.append(100 * pt["benchmarks"][b][metric])
            benchmark = b
    return xs, ys, benchmark or ""


def cmd_plot(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    table = []
    for spec in args.runs:
        label, _, path = spec.partition("=")
        run, _, series = path.partition(":")
        run_p = Path(run)
        xs, ys, bench = curve(run_p, Path(series) if series else run_p / "series", args.benchmark, args.metric)
        ax.plot(xs, ys, marker="o", label=label)
        table += [(label, f"{x:.1f}", f"{y:.1f}") for x, y in zip(xs, ys)]
    ax.set_xlabel("training wall-clock (minutes)")
    ax.set_ylabel(f"{args.metric} on held-out {bench} (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print("| system | minutes | " + args.metric + " (%) |\n|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(f"wrote {args.out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="TRL GRPOTrainer on the task of a mathrl recipe")
    tr.add_argument("--config", required=True, help="the mathrl recipe, e.g. configs/demo.yaml")
    tr.add_argument("--minutes", type=float, default=None, help="stop after this much training wall-clock")
    tr.add_argument("--save-every-minutes", type=float, default=None, help="checkpoint period (wall-clock)")
    tr.add_argument("--out", required=True, help="run folder (checkpoint-N/, wallclock.jsonl, config.yaml)")
    tr.add_argument("overrides", nargs="*", help="config overrides key.sub=value, as for mathrl train")
    pl = sub.add_parser("plot", help="held-out accuracy against wall-clock of several evaluated runs")
    pl.add_argument("runs", nargs="+", help="LABEL=RUN_DIR[:SERIES_DIR] (series default RUN_DIR/series)")
    pl.add_argument("--metric", default="greedy", help="greedy, pass@1, maj@4, ... (default greedy)")
    pl.add_argument("--benchmark", default=None, help="benchmark of the series (default: the first)")
    pl.add_argument("--out", required=True, help="PNG file")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    return cmd_train(args) if args.cmd == "train" else cmd_plot(args)


if __name__ == "__main__":
    raise SystemExit(main())
