"""Benchmarks: names, where their files live, and suites (``eval/suites/*.yaml``).

A benchmark spec is a name from :data:`BENCHMARKS`, optionally with a local
file (``gsm8k=/data/gsm8k_test.jsonl``). Files are looked up as
``<data_dir>/<relative path>`` (the layout of ``../shared/data``); without a
data folder the source's hub name is used through ``datasets``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mathrl.config import ConfigError

__all__ = ["Benchmark", "BENCHMARKS", "BenchmarkSpec", "parse_benchmarks", "load_benchmark", "load_suite",
           "heldout_problems", "SUITE_DIR"]

SUITE_DIR = Path(__file__).resolve().parents[2] / "eval" / "suites"


@dataclass(frozen=True)
class Benchmark:
    """A named evaluation set: the data source, its split and its file under a data folder."""

    name: str
    source: str
    split: str
    relpath: str | None
    description: str


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("gsm8k", "gsm8k", "test", "gsm8k/test.jsonl", "GSM8K test, 1319 grade-school word problems"),
    Benchmark("math500", "math500", "test", "math500/test.jsonl", "MATH-500 (subset of the MATH test set), "
              "with subject and level"),
    Benchmark("math", "math", "test", "math/test.jsonl", "full Hendrycks MATH test (5000), when present"),
    Benchmark("minerva_math", "minerva_math", "test", "minerva_math/test.jsonl", "Minerva OCW problems (272)"),
    Benchmark("aime24", "aime24", "test", "aime24/test.jsonl", "AIME 2024 (30)"),
    Benchmark("amc23", "amc23", "test", "amc23/test.jsonl", "AMC 2023 (40)"),
    Benchmark("svamp", "svamp", "test", "svamp/test.jsonl", "SVAMP (1000)"),
    Benchmark("asdiv", "asdiv", "test", "asdiv/test.jsonl", "ASDiv (2215)"),
    Benchmark("synthetic", "synthetic", "test", None, "the embedded synthetic arithmetic task, held-out draw"),
)}


@dataclass
class BenchmarkSpec:
    """One benchmark to run: name (also the output folder), file, limit, metadata filter."""

    name: str
    benchmark: Benchmark
    path: str | None = None
    limit: int | None = None
    where: dict[str, Any] = field(default_factory=dict)
    synthetic_level: int = 1
    seed: int = 0

    def label(self) -> str:
        return self.name


def _unknown(name: str) -> ConfigError:
    return ConfigError(f"unknown benchmark {name!r}; allowed: {', '.join(BENCHMARKS)} "
                       "(optionally name=FILE for a local .jsonl/.json/.parquet file)")


def parse_benchmarks(text: str, *, limit: int | None = None) -> list[BenchmarkSpec]:
    """``gsm8k,math500,svamp=/x/svamp.jsonl`` -> specs (duplicates are an error)."""
    specs: list[BenchmarkSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, path = part.partition("=")
        name = name.strip()
        if name not in BENCHMARKS:
            raise _unknown(name)
        if any(s.name == name for s in specs):
            raise ConfigError(f"--benchmarks: {name!r} is listed twice")
        specs.append(BenchmarkSpec(name=name, benchmark=BENCHMARKS[name], path=path.strip() or None, limit=limit))
    if not specs:
        raise ConfigError(f"--benchmarks {text!r}: no benchmark named; allowed: {', '.join(BENCHMARKS)}")
    return specs


def _resolve_file(spec: BenchmarkSpec, data_dir: str | Path | None) -> str | None:
    if spec.path is not None:
        p = Path(spec.path).expanduser()
        if not p.exists():
            raise ConfigError(f"benchmark {spec.name!r}: file {spec.path} does not exist")
        return str(p)
    if data_dir is None or spec.benchmark.relpath is None:
        return None
    p = Path(data_dir).expanduser() / spec.benchmark.relpath
    if not p.is_file():
        raise ConfigError(f"benchmark {spec.name!r}: {p} does not exist (data dir {data_dir}); give another "
                          f"--data-dir, a file with {spec.name}=FILE, or leave --data-dir out to use the hub")
    return str(p)


def load_benchmark(spec: BenchmarkSpec, data_dir: str | Path | None = None) -> list:
    """The problems of one benchmark spec (limit applied after the metadata filter)."""
    from mathrl.data import load_problems

    b = spec.benchmark
    if b.source == "synthetic":
        n = spec.limit or 200
        problems = load_problems("synthetic", split="test", n=n, level=spec.synthetic_level, seed=spec.seed)
    else:
        path = _resolve_file(spec, data_dir)
        limit = None if spec.where else spec.limit
        problems = load_problems(b.source, path, b.split if path is None or Path(path).is_dir() else None,
                                 limit=limit)
    if spec.where:
        def keep(p) -> bool:
            return all(str(p.meta.get(k)) == str(v) for k, v in spec.where.items())
        problems = [p for p in problems if keep(p)]
        if not problems:
            raise ConfigError(f"benchmark {spec.name!r}: no problem matches where={spec.where}")
        if spec.limit is not None:
            problems = problems[:spec.limit]
    return problems


def heldout_problems(cfg) -> tuple[str, list]:
    """The held-out evaluation set of a training config: ``(name, problems)``.

    * ``data.eval_source`` set: that source (``data.eval_path`` or its hub
      test split), first ``data.eval_limit`` problems;
    * else, for ``data.source = synthetic``: the synthetic ``test`` stream at
      ``data.synthetic_level`` and seed ``train.seed`` -- a stream independent
      of the training problems (the generator keys its RNG on the split) whose
      facts are disjoint from theirs: no held-out problem shares an (operands,
      operator) step with any problem of the training stream, of any length,
      seed or level (see :mod:`mathrl.data.synthetic`);
    * else the training source's test split (``data.eval_path``, or the
      ``test`` file beside ``data.path``).

    The trainer's before/after evaluation and ``mathrl eval --config`` both use
    this, so their numbers are on the same problems.
    """
    from mathrl.data import load_problems

    d = cfg.data
    limit = d.eval_limit
    if d.eval_source is not None:
        if d.eval_source == "synthetic":
            return "synthetic", load_problems("synthetic", split="test", n=limit, level=d.synthetic_level,
                                              seed=cfg.train.seed)
        return d.eval_source, load_problems(d.eval_source, d.eval_path, "test" if d.eval_path is None or
                                            Path(d.eval_path).is_dir() else None, limit=limit)
    if d.source == "synthetic":
        return "synthetic", load_problems("synthetic", split="test", n=limit, level=d.synthetic_level,
                                          seed=cfg.train.seed)
    if d.eval_path is not None:
        return d.source, load_problems(d.source, d.eval_path, None, limit=limit)
    if d.path is not None:
        p = Path(d.path)
        if p.is_dir():
            return d.source, load_problems(d.source, p, "test", limit=limit)
        for cand in sorted(p.parent.glob("test.*")):
            return d.source, load_problems(d.source, cand, "test", limit=limit)
        raise ConfigError(f"data.eval_path is not set and there is no test file beside data.path = {d.path}; "
                          "set data.eval_path (or data.eval_source)")
    return d.source, load_problems(d.source, None, "test", limit=limit)


# --------------------------------------------------------------------------- suites


def _suite_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise ConfigError(f"--suite {name_or_path}: file not found")
        return p
    cand = SUITE_DIR / f"{name_or_path}.yaml"
    if not cand.is_file():
        known = sorted(q.stem for q in SUITE_DIR.glob("*.yaml")) if SUITE_DIR.is_dir() else []
        raise ConfigError(f"--suite {name_or_path!r}: no such suite; known: {', '.join(known) or 'none'} "
                          "(or give a .yaml path)")
    return cand


SUITE_KEYS = {"name", "description", "benchmarks", "data_dir", "n", "k", "temperature", "top_p", "top_k",
              "max_tokens", "greedy", "template", "limit", "seed"}


def load_suite(name_or_path: str) -> dict[str, Any]:
    """Read a suite YAML: sampling settings plus a list of benchmarks.

    ``benchmarks`` entries are names or mappings
    ``{name, file?, limit?, where?: {meta_key: value}}``. Relative ``data_dir``
    values are relative to the current directory (the repository root).
    """
    path = _suite_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a suite must be a mapping with a 'benchmarks' list")
    unknown = sorted(set(data) - SUITE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed: {', '.join(sorted(SUITE_KEYS))}")
    entries = data.get("benchmarks")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: 'benchmarks' must be a non-empty list")
    specs: list[BenchmarkSpec] = []
    for i, e in enumerate(entries):
        if isinstance(e, str):
            e = {"name": e}
        if not isinstance(e, dict) or "name" not in e:
            raise ConfigError(f"{path}: benchmarks[{i}] must be a name or a mapping with 'name'")
        extra = sorted(set(e) - {"name", "benchmark", "file", "limit", "where"})
        if extra:
            raise ConfigError(f"{path}: benchmarks[{i}] has unknown key(s) {extra}; allowed: name, benchmark, "
                              "file, limit, where")
        base = e.get("benchmark", e["name"])
        if base not in BENCHMARKS:
            raise _unknown(base)
        where = e.get("where") or {}
        if not isinstance(where, dict):
            raise ConfigError(f"{path}: benchmarks[{i}].where must be a mapping such as {{level: 1}}")
        limit = e.get("limit", data.get("limit"))
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"{path}: benchmarks[{i}].limit = {limit!r}; allowed: an integer >= 1")
        specs.append(BenchmarkSpec(name=str(e["name"]), benchmark=BENCHMARKS[base], path=e.get("file"),
                                   limit=limit, where=dict(where)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: benchmark names must be unique (they name the output folders): {names}")
    data["benchmarks"] = specs
    data["path"] = str(path)
    return data
