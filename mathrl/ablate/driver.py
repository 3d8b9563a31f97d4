"""Run a study: baseline evaluation, each run (train, evaluate), resume, launcher commands, the report.

Study folder layout::

    <out>/plan.json                    the expanded runs (name, method, overrides)
    <out>/baseline-<key>/              evaluation of the initial model ("before"), shared by the runs
                                       with the same model, held-out set and evaluation settings
    <out>/prm_initial/                 with study.prm: the PRM of the process-supervised rows (grpo_ps
                                       without model.prm), trained on the initial policy's labelled samples
                                       (labels.jsonl kept beside it) before the first such run
    <out>/<run>/                       the training run folder (config.yaml, metrics.jsonl, checkpoints/)
    <out>/<run>/eval/step_<N>/         evaluation of the checkpoint of step N (the last one = "after")
    <out>/<run>/trained.json           training finished (wall time, tokens)
    <out>/<run>/DONE.json              completion marker, written last: the run is not redone
    <out>/report.md, report.json       the table
    <out>/accuracy_curve.png           accuracy over training steps, per run
    <out>/maj_pass_at_k.png            Maj@K and Pass@K vs K before and after (DeepSeekMath Fig. 7 form)

Resume: a run with ``DONE.json`` is skipped; one with ``trained.json`` only is evaluated again; a
stopped run with a complete checkpoint continues from it (``train.resume=auto``: weights, optimizer,
step; offline RFT also its samples of the initial model), and one without any checkpoint is deleted
and redone from step 0. ``train.save_every`` sets how much a stop can cost. A run's wall time adds
up its attempts (``attempts.json``; a stopped attempt counts until its last metrics record).
Evaluation settings come from each run's ``eval.*`` (K = powers of two up to ``eval.n``, plus ``eval.k``).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from mathrl.ablate.methods import Task, run_method
from mathrl.ablate.study import DONE, HELDOUT_EVAL, HELDOUT_LABELS, PRM_FOLDER, TRAINED, RunSpec, Study, base_config, load_study, run_config
from mathrl.config import Config
from mathrl.data.splits import heldout_problems, load_training_problems
from mathrl.dist.collectives import init_distributed
from mathrl.eval.evaluate import powers_up_to
from mathrl.prm.evaluation import evaluate_prm
from mathrl.prm.pipeline import label_problem_sets, train_prm, write_labels
from mathrl.reward.options import GradeOptions
from mathrl.procs import without_dist_env

__all__ = ["run_study", "print_commands", "eval_settings", "DONE", "TRAINED"]

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _barrier() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
    except ImportError:  # pragma: no cover
        pass


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(path)


def eval_settings(cfg: Config):
    """The evaluation settings of a run: the config's, with K = powers of two up to eval.n (plus eval.k)."""
    from mathrl.eval.evaluate import settings_from_config

    s = settings_from_config(cfg)
    ks = tuple(sorted(set(powers_up_to(cfg.eval.n)) | set(cfg.eval.k)))
    return dataclasses.replace(s, ks=ks)


def _eval_problems(cfg: Config, task: Task) -> tuple[str, list]:
    if task.eval_problems is not None:
        return task.eval_name, list(task.eval_problems)
    from mathrl.data.splits import heldout_problems

    return heldout_problems(cfg)


def baseline_key(cfg: Config, eval_name: str, problems: list) -> str:
    """Identity of a "before" evaluation: model, held-out problems, evaluation settings, backend."""
    blob = json.dumps({"model": cfg.model.name, "dtype": cfg.model.dtype, "set": eval_name,
                       "problems": [(p.id, p.question, p.gold) for p in problems],
                       "settings": eval_settings(cfg).to_dict(), "backend": cfg.rollout.backend}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def evaluate_at(cfg: Config, model_spec: str, out_dir: Path, task: Task, *, log: Log = _log,
                extra: dict | None = None) -> dict:
    """Evaluate ``model_spec`` on the run's held-out set; write ``summary.json`` and ``report.md``."""
    from mathrl.eval.evaluate import make_eval_engine
    from mathrl.eval.report import markdown_report, write_summary
    from mathrl.eval.runner import evaluate_benchmark

    name, problems = _eval_problems(cfg, task)
    settings = eval_settings(cfg)
    t0 = time.time()
    engine = make_eval_engine(cfg, model_spec)
    try:
        res = evaluate_benchmark(engine, problems, settings, name=name, out_dir=out_dir, grader=task.grader, log=log)
    finally:
        engine.close()
    summary = {"model": str(model_spec), "backend": type(engine).__name__, "settings": settings.to_dict(),
               "benchmarks": {name: res.summary}, "seconds": round(time.time() - t0, 2), **(extra or {})}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_summary(out_dir, summary)
    (out_dir / "report.md").write_text(markdown_report(summary))
    return summary


def _metric_values(summary: dict) -> dict[str, float]:
    (b,) = summary["benchmarks"].values()
    out = {k: float(v["value"]) for k, v in b["metrics"].items()}
    out["mean_length"] = float(b["mean_length"])
    return out


def _baseline(study: Study, cfg: Config, task: Task, log: Log) -> tuple[str, dict]:
    name, problems = _eval_problems(cfg, task)
    key = baseline_key(cfg, name, problems)
    folder = study.out / f"baseline-{key}"
    if (folder / "summary.json").is_file():
        summary = json.loads((folder / "summary.json").read_text())
    else:
        log(f"[ablate] baseline: evaluating the initial model {cfg.model.name} -> {folder}")
        summary = evaluate_at(cfg, cfg.model.name, folder, task, log=log, extra={"step": 0})
    return key, summary


def _read_metrics(run_dir: Path) -> list[dict]:
    from mathrl.train.metrics import read_metrics

    p = run_dir / "metrics.jsonl"
    return read_metrics(p) if p.is_file() else []


def _tokens(records: list[dict]) -> float:
    return float(sum(r.get("tokens", 0.0) or 0.0 for r in records
                     if r.get("event") in (None, "rft_sampling", "dpo_sampling") and isinstance(r.get("tokens", 0.0), (int, float))))


# config keys that do not change what a run computes: a finished run stays valid when only these change
RESULT_NEUTRAL = ("train.resume", "train.save_every", "train.keep_last", "logging.")


# (recorded, now) pairs that mean the same run: train.micro_batch_tokens was 8192 by default and lowered to the free
# memory, which is what "auto" means now (issue 40: a number is a pin since)
SAME_AS_BEFORE = {"train.micro_batch_tokens": ((8192, "auto"),)}

# settings whose default became "auto" (issue 41: the method's paper value): a run recorded with a number equal to
# what "auto" resolves to for the study's config ran the same (a recorded ppo clip 0.2 = auto's 0.2)
RESOLVED_AUTO = {"algo.clip_low": lambda c: c.clip_low, "algo.clip_high": lambda c: c.clip_high,
                 "algo.loss_agg": lambda c: c.loss_agg}

# fields mathrl gained after runs were recorded, with the value such a run effectively had: before
# data.eval_seed a generated held-out set was drawn with train.seed (issue 41)
IMPLIED_BEFORE = {"data.eval_seed": lambda recorded: recorded.get("train", {}).get("seed")}


def result_config(cfg_dict: dict) -> dict:
    """The config as recorded in DONE.json, less the keys that cannot change the result."""
    out: dict = {}
    for section, fields in json.loads(json.dumps(cfg_dict, default=str)).items():
        if not isinstance(fields, dict):
            out[section] = fields
            continue
        kept = {k: v for k, v in fields.items()
                if not any(f"{section}.{k}" == n or (n.endswith(".") and f"{section}.".startswith(n))
                           for n in RESULT_NEUTRAL)}
        if kept:
            out[section] = kept
    return out


def config_differences(recorded: dict, cfg: Config) -> list[str]:
    """Keys (``section.field``) whose value in ``cfg`` differs from a finished run's recorded config,
    less the result-neutral ones. A field the record lacks (added to mathrl after the run) counts as
    different only when ``cfg`` sets it to something other than its default or, for the fields of
    ``IMPLIED_BEFORE``, than the value the run effectively had."""
    defaults = result_config(Config().to_dict())
    old, new = result_config(recorded), result_config(cfg.to_dict())
    out = []
    for section in sorted(set(old) | set(new)):
        o, n, d = old.get(section, {}), new.get(section, {}), defaults.get(section, {})
        for key in sorted(set(o) | set(n)):
            if key not in o and key in d and n.get(key) == d[key]:
                continue
            implied = IMPLIED_BEFORE.get(f"{section}.{key}")
            if key not in o and implied is not None and n.get(key) == implied(recorded):
                continue
            if (o.get(key), n.get(key)) in SAME_AS_BEFORE.get(f"{section}.{key}", ()):
                continue
            resolved = RESOLVED_AUTO.get(f"{section}.{key}")
            if resolved is not None and n.get(key) == "auto" and o.get(key) == resolved(cfg):
                continue
            if o.get(key) != n.get(key):
                out.append(f"{section}.{key}")
    return out


def _attempts_wall(run_dir: Path, *, start: float | None = None, end: float | None = None) -> float:
    """Record an attempt's start or end in ``attempts.json``; return the summed wall time of all attempts.

    An attempt that never recorded its end (the process was stopped) ends at the last write of its
    ``metrics.jsonl`` (or counts zero if there is none)."""
    path = run_dir / "attempts.json"
    attempts: list[dict] = json.loads(path.read_text()) if path.is_file() else []
    metrics = run_dir / "metrics.jsonl"
    for a in attempts:
        if a.get("end") is None and (start is not None or a is not attempts[-1]):
            a["end"] = max(a["start"], metrics.stat().st_mtime) if metrics.is_file() else a["start"]
            a["stopped"] = True
    if start is not None:
        attempts.append({"start": start, "end": None})
    if end is not None and attempts:
        attempts[-1]["end"] = end
    if _is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(path, attempts)
    return sum((a["end"] or a["start"]) - a["start"] for a in attempts)


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def ensure_initial_prm(study: Study, task: Task, *, log: Log = _log) -> None:
    """With ``study.prm`` and a run that reads ``<out>/prm_initial`` (see :func:`~mathrl.ablate.study.run_config`):
    train that PRM once, on rank 0, unless it exists (:func:`mathrl.prm.pipeline.label_problem_sets` on the first
    ``study.prm.problems`` training problems with the base config's policy and sampler, then
    :func:`~mathrl.prm.pipeline.train_prm`); the labelled records stay in ``labels.jsonl`` beside it (written by
    ``train_prm``: the history an iterative row replays). With
    ``study.prm.heldout = N`` the first N held-out problems are labelled the same way, on the same engine
    (``heldout_labels.jsonl``), and the PRM is measured on them (:func:`mathrl.prm.evaluation.evaluate`: step
    AUC, best-of-N against majority voting with intervals and the per-problem picks, ``heldout_eval.json``)."""
    folder = study.out / PRM_FOLDER
    wanted = study.prm and any(run_config(study, r).model.prm == str(folder) for r in study.runs)
    if not wanted or (folder / "backbone.safetensors").is_file():
        return
    if _is_main():
        cfg, opts = base_config(study), study.prm
        problems = (task.train_problems if task.train_problems is not None else load_training_problems(cfg))
        problems = problems[: opts["problems"]]
        held = task.eval_problems if task.eval_problems is not None or not opts["heldout"] else heldout_problems(cfg)[1]
        held = (held or [])[: opts["heldout"]]
        log(f"[ablate] initial PRM: labelling {len(problems)} problems x {cfg.rollout.n} samples of {cfg.model.name} "
            f"(k = {opts['k']} completions per step; and {len(held)} held-out problems) -> {folder}")
        records, *held_sets = label_problem_sets(cfg, [problems] + ([held] if held else []), k=opts["k"])
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        budget = cfg.train.micro_batch_tokens if isinstance(cfg.train.micro_batch_tokens, int) else 8192
        stats = train_prm(records, cfg.model.name, tmp, dist=init_distributed(), epochs=opts["epochs"], lr=opts["lr"],
                          batch=opts["batch"], token_budget=budget, seed=cfg.train.seed)
        log(f"[ablate] initial PRM: {len(records)} responses, {sum(len(r['ends']) for r in records)} steps, "
            f"last loss {stats['prm/loss']:.4f} (predicting the label mean at every step: "
            f"{stats['prm/constant_loss']:.4f})")
        if held:
            held_records = held_sets[0]
            write_labels(tmp / HELDOUT_LABELS, held_records)
            result = evaluate_prm(tmp, held_records, token_budget=budget, options=GradeOptions.from_config(cfg))
            _write_json(tmp / HELDOUT_EVAL, result)
            d = result["best_minus_majority"]
            log(f"[ablate] initial PRM on {result['problems']:.0f} held-out problems: step AUC "
                f"{result['step_auc']:.3f}, best-of-{cfg.rollout.n} {100 * result['best_of_n']:.1f}% vs majority "
                f"{100 * result['majority']:.1f}% ({100 * d['diff']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}])")
        tmp.rename(folder)  # complete: a stopped stage is redone, never half-used
        log(f"[ablate] initial PRM -> {folder}")
    _barrier()


def run_one(study: Study, run: RunSpec, task: Task, *, log: Log = _log) -> dict:
    """Train and evaluate one run (resuming at run granularity); returns its DONE record."""
    from mathrl.eval.series import find_checkpoints

    ensure_initial_prm(study, task, log=log)
    cfg = run_config(study, run)
    # the config as the study gives it: the trainer fills derived fields in place (rollout.max_model_len from the
    # prompts, the fitted train.micro_batch_tokens), which a later comparison with the study must not count
    given = result_config(cfg.to_dict())
    run_dir = Path(cfg.train.output_dir)
    done = run_dir / DONE
    if done.is_file():
        rec = json.loads(done.read_text())
        log(f"[ablate] {run.name}: complete ({done}); skipped")
        changed = config_differences(rec["config"], cfg) if rec.get("config") is not None else []
        if changed:
            log(f"[ablate] {run.name}: warning: the study now gives this run another config than the one it ran "
                f"with ({', '.join(changed)}); delete {run_dir} to redo it")
        return rec
    trained_path = run_dir / TRAINED
    if trained_path.is_file():
        trained = json.loads(trained_path.read_text())
        log(f"[ablate] {run.name}: training had finished; evaluating again")
    else:
        from mathrl.train import checkpoint as ckpt

        saved = ckpt.list_checkpoints(run_dir) if run_dir.exists() else []
        if saved:
            log(f"[ablate] {run.name}: {run_dir} holds a stopped run; resuming from its checkpoint of step "
                f"{saved[-1][0]}")
            cfg.train.resume = "auto"
        elif run_dir.exists() and _is_main():
            log(f"[ablate] {run.name}: {run_dir} holds a stopped run without a checkpoint; redoing it from step 0")
            shutil.rmtree(run_dir)
        _barrier()
        log(f"[ablate] {run.name}: training ({run.method}, {cfg.train.steps} steps) -> {run_dir}")
        _attempts_wall(run_dir, start=time.time())
        run_method(run.method, cfg, rft_opts=run.rft, task=task)
        wall = _attempts_wall(run_dir, end=time.time())
        _free_memory()
        trained = {"wall_train_s": round(wall, 2), "tokens": _tokens(_read_metrics(run_dir))}
        if _is_main():
            _write_json(trained_path, trained)
    record: dict[str, Any] = {}
    if _is_main():
        key, before = _baseline(study, cfg, task, log)
        t0 = time.time()
        curve = [{"step": 0, **_metric_values(before)}]
        ckpts = find_checkpoints(run_dir)
        if not ckpts:
            raise RuntimeError(f"{run_dir}: training finished without a checkpoint")
        final_step = ckpts[-1][0]
        after = before if final_step == 0 else None  # train.steps = 0: the initial model is the result
        for step, model in ckpts:
            if step == 0 or (step != final_step and not study.curve_every):
                continue
            sub = run_dir / "eval" / f"step_{step:06d}"
            log(f"[ablate] {run.name}: evaluating step {step} ({model})")
            summary = evaluate_at(cfg, str(model), sub, task, log=log, extra={"step": step})
            curve.append({"step": step, **_metric_values(summary)})
            if step == final_step:
                after = summary
        record = {"name": run.name, "method": run.method, "overrides": {k: v for k, v in run.override_dict().items()},
                  "rft": run.rft, "steps": cfg.train.steps, "final_step": final_step, "baseline": key,
                  "before": _metric_values(before), "after": _metric_values(after), "curve": curve,
                  "wall_train_s": trained["wall_train_s"], "wall_eval_s": round(time.time() - t0, 2),
                  "tokens": trained["tokens"], "eval_problems": next(iter(after["benchmarks"].values()))["problems"],
                  "eval_settings": after["settings"], "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "config": given}
        _write_json(done, record)
        log(f"[ablate] {run.name}: done (train {trained['wall_train_s']:.0f} s, eval {record['wall_eval_s']:.0f} s)")
    _barrier()
    return record


def commands(study: Study, study_path: str | Path) -> list[str]:
    """Launcher lines: one per run that is not complete, then the report."""
    out = shlex.quote(str(study.out))
    sp = shlex.quote(str(study_path))
    extra = "".join(" " + shlex.quote(o) for o in study.cli_overrides)
    lines = [f"{study.launcher} {sp} --only {shlex.quote(r.name)} --out {out}{extra}"
             for r in study.runs if not (study.out / r.name / DONE).is_file()]
    lines.append(f"{study.launcher} {sp} --report-only --out {out}{extra}")
    return lines


def print_commands(study_path: str | Path, *, out: str | Path | None = None,
                   overrides: list[str] | None = None) -> list[str]:
    study = load_study(study_path, out, overrides)
    lines = commands(study, study_path)
    print("\n".join(lines))
    return lines


CHILD_ENV = "MATHRL_ABLATE_WORKER"


class AblationError(RuntimeError):
    """A run of the study failed; the message names the run and how to resume."""


def _run_in_worker(study: Study, run: RunSpec, log: Log) -> None:
    """Run one run in a fresh interpreter (``python -m mathrl.ablate.cli STUDY --only RUN``).

    Each run's models, DeepSpeed engines and rollout engine then live and die with their own
    process: nothing accumulates over a grid (on CPU, memory; on GPU, memory and fragmentation).
    """
    import subprocess

    cmd = [sys.executable, "-m", "mathrl.ablate.cli", str(study.path), "--only", run.name, "--out", str(study.out),
           "--no-report", *study.cli_overrides]
    log(f"[ablate] {run.name}: worker process: {' '.join(shlex.quote(c) for c in cmd)}")
    # a world of one: the worker builds its own process group (a parent's RANK / MASTER_PORT would
    # point it at this process's rendezvous)
    env = without_dist_env()
    rc = subprocess.run(cmd, env={**env, CHILD_ENV: "1"}).returncode
    if rc != 0:
        raise AblationError(f"run {run.name!r} of {study.path} failed (exit status {rc}); finished runs are kept: "
                            f"run the same command again to resume (the stopped run continues from its last checkpoint)")


def run_study(study_path: str | Path | Study, *, out: str | Path | None = None, only: list[str] | None = None,
              report_only: bool = False, print_only: bool = False, task: Task | None = None,
              isolate: bool | None = None, report: bool = True, overrides: list[str] | None = None,
              log: Log = _log) -> dict:
    """Run (or resume) every run of a study, then write the report; returns the report dict.

    ``study_path``: a study YAML, or a :class:`~mathrl.ablate.study.Study` already loaded (and
    possibly edited, e.g. by ``scripts/ablate_estimate.py``).

    ``only``: run just these runs (cluster jobs, see ``--print-commands``); the report then covers
    every run that is complete. ``report_only``: no training, only the report. ``print_only``: print
    the launcher commands and return. ``task``: custom problems / reward (scripts and tests).
    ``isolate``: train and evaluate each run in its own worker process (default: yes, unless a
    ``task`` object is given, which cannot cross processes, or this process is already a worker or
    one of several launched ranks). ``report = False``: skip the report (worker processes).
    ``overrides``: ``key=value`` items for the base of every run (see :func:`load_study`).
    """
    from mathrl.ablate.report import write_study_report

    study = study_path if isinstance(study_path, Study) else load_study(study_path, out, overrides)
    if print_only:
        return {"commands": commands(study, study.path)}
    task = task or Task()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # launched on several processes: barriers need the group
        init_distributed()
    if only:
        for name in only:
            study.run(name)  # unknown names are errors
    if _is_main():
        study.out.mkdir(parents=True, exist_ok=True)
        _write_json(study.out / "plan.json", {"study": study.name, "file": str(study.path), "runs": [
            {"name": r.name, "method": r.method, "overrides": r.override_dict(), "rft": r.rft} for r in study.runs]})
    if isolate is None:
        isolate = (task.train_problems is None and task.eval_problems is None and task.reward_terms is None
                   and task.grader is None and os.environ.get(CHILD_ENV) != "1"
                   and int(os.environ.get("WORLD_SIZE", "1")) == 1)
    if not report_only:
        from mathrl.progress import Progress

        runs = [r for r in study.runs if not only or r.name in only]
        shown = _is_main() and os.environ.get(CHILD_ENV) != "1"  # a worker's run is on its parent's bar
        with Progress(len(runs), f"ablation {study.name}", unit="run", enabled=None if shown else False) as bar:
            for i, r in enumerate(runs):
                if i == 0:
                    bar.set_postfix(r.name)
                if isolate and not (study.out / r.name / DONE).is_file():
                    _run_in_worker(study, r, log)
                else:
                    run_one(study, r, task, log=log)
                bar.set_postfix(runs[i + 1].name if i + 1 < len(runs) else "")  # drawn by this update
                bar.update()
    data: dict = {}
    if report and _is_main():
        data = write_study_report(study, log=log)
    return data


__all__ += ["ensure_initial_prm", "run_one", "commands", "baseline_key", "evaluate_at", "base_config", "AblationError", "CHILD_ENV"]
