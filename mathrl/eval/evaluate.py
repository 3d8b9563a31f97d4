"""Evaluating a model on benchmark sets: the library behind ``mathrl eval`` (also used by checkpoint
series and the ablation study). The command line (argument parsing, suites, modes) is in
:mod:`mathrl.eval.cli`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mathrl.config import ConfigError
from mathrl.eval.report import format_table, write_report, write_summary
from mathrl.eval.runner import EvalSettings, evaluate_benchmark, samples_path


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def powers_up_to(n: int) -> list[int]:
    """The default k list for n samples: 1, 2, 4, ... up to n, and n itself."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


def settings_from_config(cfg, top_k: int | None = None):

    return EvalSettings.from_config(cfg, top_k=top_k)


_SAID: set[str] = set()  # console notes already shown by this process


def make_eval_engine(cfg, model_spec: str, *, log=_log):
    """The rollout engine for evaluation (``rollout.backend``; the model path resolved first).

    The hf backend runs on the trainer's device (:func:`mathrl.dist.collectives.device`: this rank's GPU
    when CUDA is available, else the CPU). ``backend: auto`` without a usable vLLM says once, on the
    console, that it fell back to hf and how to install vLLM or choose the backend."""
    from mathrl.models import resolve_model_path  # here: mathrl.models/mathrl.rollout pull torch into `mathrl eval --help` (eval.cli start-up)
    from mathrl.rollout.options import EngineOptions  # here: mathrl.models/mathrl.rollout pull torch into `mathrl eval --help` (eval.cli start-up)
    from mathrl.dist.collectives import device  # here: looked up at call time, tests stand in for collectives.device

    path = resolve_model_path(model_spec, cfg.model.cache_dir)
    try:
        opts = EngineOptions.from_config(cfg, purpose="eval", device=device())
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if opts.backend == "hf" and cfg.rollout.backend == "auto" and "auto-hf" not in _SAID:
        _SAID.add("auto-hf")
        log(f"rollout.backend=auto: evaluating with the hf (transformers) engine on {opts.options['device']}, "
            f"since {opts.why}; vLLM is much faster: install it (on a GPU `pip install -e '.[gpu]'`, on a CPU "
            "`make vllm-env` or rollout.vllm_python=PATH), or set rollout.backend=hf to choose hf")
    if opts.backend == "vllm" and cfg.rollout.tensor_parallel_size > 1 and "eval-tp" not in _SAID:
        _SAID.add("eval-tp")
        log(f"rollout.tensor_parallel_size={cfg.rollout.tensor_parallel_size} applies to training (the trainer's "
            "ranks form the tensor-parallel groups); `mathrl eval` runs one vLLM engine per process with "
            "tensor_parallel_size 1")
    try:
        return opts.build(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _finished(out_dir: Path, model_spec: str, settings, sets) -> dict:
    """The benchmarks an earlier run into ``out_dir`` finished with the same model, settings and number of
    problems (their summaries, by name): a resumed evaluation does not run them again."""
    import json

    try:
        old = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if old.get("model") != model_spec or old.get("settings") != settings.to_dict():
        return {}
    sizes = {name: len(problems) for name, problems in sets}
    return {name: s for name, s in (old.get("benchmarks") or {}).items()
            if samples_path(out_dir / name).is_file() and s.get("problems") == sizes.get(name)}


def evaluate_model(cfg, sets, out_dir: Path, *, model_spec: str, command: str, top_k: int | None = None,
                   engine=None, extra: dict | None = None, log=_log, resume: bool = False) -> dict:
    """Evaluate one model on the given sets; write the run folder; return the summary.

    ``resume``: benchmarks an earlier run into ``out_dir`` finished (same model and settings) are kept,
    and an interrupted one continues from its journal of generated chunks (:mod:`mathrl.eval.records`)."""
    settings = settings_from_config(cfg, top_k)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _evaluate_into(cfg, sets, out_dir, settings, model_spec=model_spec, command=command, engine=engine,
                              extra=extra, log=log, resume=resume)
    except BaseException:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed start leaves no empty folder behind (what it did write stays)
        raise


def _evaluate_into(cfg, sets, out_dir: Path, settings, *, model_spec: str, command: str, engine, extra, log,
                   resume: bool) -> dict:

    own = engine is None
    t0 = time.time()
    finished = _finished(out_dir, model_spec, settings, sets) if resume else {}
    if finished:
        log(f"resuming in {out_dir}: {', '.join(finished)} already evaluated")
    sets = [(name, problems) for name, problems in sets if name not in finished]
    if own:
        log(f"loading {model_spec} (backend {cfg.rollout.backend}) ...")
        engine = make_eval_engine(cfg, model_spec, log=log)
    backend = type(engine).__name__
    summary = {"model": model_spec, "command": command, "backend": backend, "settings": settings.to_dict(),
               "benchmarks": dict(finished), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})}
    try:
        for name, problems in sets:
            log(f"[{name}] {len(problems)} problems, n={settings.n}, max_tokens={settings.max_tokens}")
            res = evaluate_benchmark(engine, problems, settings, name=name, out_dir=out_dir, log=log,
                                     resume=resume, model=model_spec)
            summary["benchmarks"][name] = res.summary
            write_summary(out_dir, summary)
    finally:
        if own:
            engine.close()
    summary["seconds"] = round(time.time() - t0, 1)
    paths = write_report(out_dir, summary)
    print(format_table(summary))
    print(f"\nwrote {paths['summary']}, {paths['markdown']}" +
          (f", {', '.join(Path(p).name for p in paths['plots'])}" if paths["plots"] else "") +
          f" and per-problem samples under {out_dir}/<benchmark>/samples.jsonl.gz ({summary['seconds']:.0f} s)")
    return summary
