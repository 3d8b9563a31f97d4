"""Evaluation records on disk: ``samples.jsonl.gz`` (:func:`write_records`, :func:`read_records`,
:func:`samples_path`) and the
journal of the finished generation chunks of one benchmark (:class:`ChunkJournal`), which makes a long
evaluation resumable.

A full evaluation on a CPU can take hours (SVAMP and GSM8K test, n = 4 plus greedy: a few million
tokens). :func:`mathrl.eval.runner.generate_records` samples a benchmark in chunks (chunk ``j`` with
seed ``seed + j``); after each chunk its ungraded records are appended to
``<out>/<benchmark>/generated.partial.jsonl`` and flushed to disk. ``mathrl eval ... --out DIR
--resume`` reads the journal back and generates only the chunks it lacks, so a killed evaluation loses
at most one chunk, and the records of a resumed run are those of an uninterrupted one (same chunks,
same seeds). The journal is removed once ``samples.jsonl.gz`` is written.

The per-problem samples are written gzip-compressed (``samples.jsonl.gz``, about a tenth of the text):
they are what every recorded figure is recomputed from (``scripts/check_results.py``), so they are kept
beside ``summary.json`` and small enough to commit. Folders written before hold ``samples.jsonl``;
:func:`samples_path` finds either and :func:`read_records` reads both.

The journal's first line is a key: the model, the engine, the problems (count and a hash of their ids
and golds), the generation settings and the chunk bounds. Resuming with a different key is refused
with the fields that differ: records sampled under other settings are never mixed into one report.
A line cut short by a kill (the last one) is dropped and its chunk generated again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Sequence

from mathrl.config import ConfigError

__all__ = ["ChunkJournal", "JOURNAL_NAME", "SAMPLES_NAME", "generation_key", "read_records", "samples_path",
           "write_records"]

JOURNAL_NAME = "generated.partial.jsonl"
SAMPLES_NAME = "samples.jsonl.gz"  # what an evaluation writes; "samples.jsonl" (uncompressed) is read too
_PLAIN_NAME = "samples.jsonl"


def samples_path(bench_dir: str | Path) -> Path:
    """The per-problem samples file of one benchmark folder: ``samples.jsonl.gz``, or ``samples.jsonl`` where
    only that exists (a folder written before the samples were compressed); the ``.gz`` name when neither does."""
    bench_dir = Path(bench_dir)
    gz, plain = bench_dir / SAMPLES_NAME, bench_dir / _PLAIN_NAME
    return plain if plain.is_file() and not gz.is_file() else gz

# the settings that change what is generated (grading settings do not: records are journalled ungraded)
_GENERATION_FIELDS = ("n", "temperature", "top_p", "top_k", "max_tokens", "greedy", "seed", "template",
                      "system_prompt", "stop", "chunk_rows")


def generation_key(problems: Sequence, settings_dict: dict[str, Any], bounds: Sequence[tuple[int, int]],
                   model: str | None, engine: str) -> dict[str, Any]:
    """What must be equal for two generations of a benchmark to be chunk-for-chunk the same run."""
    h = hashlib.sha1()
    for p in problems:
        h.update(f"{p.id}\x00{p.gold}\x01".encode("utf-8", "surrogatepass"))
    return {"model": model, "engine": engine, "problems": len(problems), "problems_sha1": h.hexdigest(),
            "settings": {k: settings_dict.get(k) for k in _GENERATION_FIELDS},
            "bounds": [list(b) for b in bounds]}


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            shown = (lambda v: f"{str(v)[:60]}..." if len(str(v)) > 60 else str(v))
            out.append(f"{prefix}{k}: journal {shown(a)}, this run {shown(b)}")
    return out


class ChunkJournal:
    """The finished chunks of one benchmark's generation (see the module docstring).

    ``resume=False`` starts a new journal (an old one at ``path`` is replaced); ``resume=True`` keeps
    the chunks of an existing journal with the same key and raises ``ConfigError`` naming the fields
    that differ when the key is not the same.
    """

    def __init__(self, path: str | Path, key: dict[str, Any], resume: bool = False) -> None:
        self.path = Path(path)
        self.key = json.loads(json.dumps(key))  # as it reads back from disk (tuples become lists)
        self._done: dict[int, list[dict]] = {}
        if resume and self.path.is_file():
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("w", encoding="utf-8") as fh:
                fh.write(json.dumps({"journal": 1, "key": self.key}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _load(self) -> None:
        good: list[str] = []
        with self.path.open(encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        try:
            header = json.loads(lines[0])
            old_key = header["key"]
        except (json.JSONDecodeError, KeyError, TypeError, IndexError):
            raise ConfigError(f"{self.path}:1: not an evaluation journal (expected a key line); delete the file "
                             "or evaluate into another --out folder") from None
        if old_key != self.key:
            diff = "; ".join(_differences(old_key, self.key))
            raise ConfigError(f"{self.path}: cannot resume: this evaluation differs from the journalled one "
                             f"({diff}). Evaluate into another --out folder, or run without --resume to start over")
        good.append(lines[0])
        for line in lines[1:]:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                self._done[int(obj["chunk"])] = list(obj["records"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                break  # cut short by a kill: this chunk and anything after it is generated again
            good.append(line)
        with self.path.open("w", encoding="utf-8") as fh:  # drop a torn tail before appending to it
            fh.write("\n".join(good) + "\n")

    @property
    def chunks_done(self) -> int:
        return len(self._done)

    def get(self, chunk: int) -> list[dict] | None:
        """The journalled records of ``chunk``, or None when it has to be generated."""
        return self._done.get(chunk)

    def add(self, chunk: int, records: list[dict]) -> None:
        """Append one finished chunk and flush it to disk."""
        self._done[chunk] = records
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"chunk": chunk, "records": records}, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def finish(self) -> None:
        """The benchmark's samples are written: the journal is no longer needed."""
        self.path.unlink(missing_ok=True)


@contextmanager
def _open_text(path: Path, mode: str):
    """A text file of ``path`` for "r" or "w", gzip when the name ends in ``.gz`` (written with mtime 0 and no
    name in the header: the same records give the same bytes)."""
    if not path.name.endswith(".gz"):
        with path.open(mode, encoding="utf-8") as fh:
            yield fh
        return
    with open(path, mode + "b") as raw, gzip.GzipFile(filename="", mode=mode + "b", fileobj=raw, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as fh:
        yield fh


def write_records(path: str | Path, records: Iterable[dict]) -> Path:
    """One JSON object per line, gzip-compressed when the name ends in ``.gz`` (written to a temporary name,
    then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + (".gz" if path.name.endswith(".gz") else ""))
    with _open_text(tmp, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_records(path: str | Path) -> list[dict]:
    """Read a ``samples.jsonl(.gz)`` written by :func:`write_records`."""
    path = Path(path)
    out = []
    with _open_text(path, "r") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return out
