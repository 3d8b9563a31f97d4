"""Benchmarks: names, where their files live, and suites (``eval/suites/*.yaml``).

A benchmark spec is a name from :func:`benchmarks`, optionally with a local
file (``gsm8k=/data/gsm8k_test.jsonl``). Files are looked up as
``<data_dir>/<relative path>`` (``gsm8k/test.jsonl``, ``math500/test.jsonl``, ...; ``mathrl eval
--data-dir`` or ``$MATHRL_DATA``); without a data folder the source's hub name is used through
``datasets``.

:func:`benchmarks` derives them from the source registry :data:`mathrl.registry.SOURCES`: one
benchmark per source with an eval split (``SourceSpec.eval_split``, ``local_file``,
``eval_description``), so registering a source makes it a benchmark; there is no second table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mathrl.config import ConfigError
from mathrl.data.sources import SOURCES, SourceSpec

__all__ = ["Benchmark", "benchmarks", "BenchmarkSpec", "benchmarks_from_sources", "parse_benchmarks",
           "load_benchmark", "load_suite", "SUITE_DIR"]

SUITE_DIR = Path(__file__).resolve().parents[2] / "eval" / "suites"


@dataclass(frozen=True)
class Benchmark:
    """A named evaluation set: the data source, its split and its file under a data folder."""

    name: str
    source: str
    split: str
    relpath: str | None
    description: str


# Listing order only (help text, "allowed: ..." messages): these benchmarks come first, then every other
# source with an eval split in registration order. A new source needs no entry here.
LISTED_FIRST = ("gsm8k", "math500")


def benchmark_of(spec: SourceSpec) -> Benchmark:
    """The benchmark of a source with an eval split (same name as the source)."""
    if spec.eval_split is None:
        raise ValueError(f"source {spec.name!r} has no eval split, so it is not a benchmark")
    return Benchmark(spec.name, spec.name, spec.eval_split, spec.benchmark_file, spec.benchmark_description)


def benchmarks_from_sources(sources: Mapping[str, SourceSpec] | None = None) -> dict[str, Benchmark]:
    """One :class:`Benchmark` per source with an eval split (default: the registry :data:`SOURCES`)."""
    sources = SOURCES if sources is None else sources
    names = [n for n in LISTED_FIRST if n in sources] + [n for n in sources if n not in LISTED_FIRST]
    return {n: benchmark_of(sources[n]) for n in names if sources[n].eval_split is not None}


def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark by name, derived from the source registry now (:func:`benchmarks_from_sources`): a source
    registered later (a plugin, a test fixture) is a benchmark from then on."""
    return benchmarks_from_sources(SOURCES)


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
    return ConfigError(f"unknown benchmark {name!r}; allowed: {', '.join(benchmarks())} "
                       "(optionally name=FILE for a local .jsonl/.json/.parquet file), or jsonl=FILE for your own "
                       "file with question and answer fields")


#: ``jsonl=FILE``: your own file (fields ``question`` and ``answer``, the gold taken as written), as the
#: training source ``jsonl`` reads it
CUSTOM = Benchmark("jsonl", "jsonl", "test", None, "your own .jsonl/.json/.parquet file (question, answer)")


def parse_benchmarks(text: str, *, limit: int | None = None) -> list[BenchmarkSpec]:
    """``gsm8k,math500,svamp=/x/svamp.jsonl`` -> specs (duplicates are an error)."""
    specs: list[BenchmarkSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, path = part.partition("=")
        name = name.strip()
        if name == CUSTOM.name:
            if not path.strip():
                raise ConfigError("--benchmarks jsonl: give your file as jsonl=FILE (.jsonl/.json/.parquet with "
                                  "question and answer fields)")
        elif name not in benchmarks():
            raise _unknown(name)
        if any(s.name == name for s in specs):
            raise ConfigError(f"--benchmarks: {name!r} is listed twice")
        bench = CUSTOM if name == CUSTOM.name else benchmarks()[name]
        specs.append(BenchmarkSpec(name=name, benchmark=bench, path=path.strip() or None, limit=limit))
    if not specs:
        raise ConfigError(f"--benchmarks {text!r}: no benchmark named; allowed: {', '.join(benchmarks())}")
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
    source = SOURCES.get(b.source, None)
    if source is not None and source.is_generated:
        offered = {"n": spec.limit or 200, "level": spec.synthetic_level, "seed": spec.seed}
        problems = load_problems(b.source, split=b.split,
                                 **{k: v for k, v in offered.items() if k in source.options})
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
        if base not in benchmarks():
            raise _unknown(base)
        where = e.get("where") or {}
        if not isinstance(where, dict):
            raise ConfigError(f"{path}: benchmarks[{i}].where must be a mapping such as {{level: 1}}")
        limit = e.get("limit", data.get("limit"))
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"{path}: benchmarks[{i}].limit = {limit!r}; allowed: an integer >= 1")
        specs.append(BenchmarkSpec(name=str(e["name"]), benchmark=benchmarks()[base], path=e.get("file"),
                                   limit=limit, where=dict(where)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: benchmark names must be unique (they name the output folders): {names}")
    data["benchmarks"] = specs
    data["path"] = str(path)
    return data
