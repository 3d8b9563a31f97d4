"""One entry point for every source: :func:`load_problems` (and :func:`load_source` with the report)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mathrl.data.errors import BadRow, DataError, RowError
from mathrl.data.problem import Problem
from mathrl.data.readers import RawRow, iter_hub_rows, iter_local_rows, resolve_local_path
from mathrl.data.sources import SOURCES, SourceSpec

logger = logging.getLogger("mathrl.data")

DEFAULT_SPLIT = "test"


@dataclass
class LoadResult:
    """What a load produced: the problems, and every row that was skipped and why.

    Attributes:
        source: the source name.
        split: the split label used in ids.
        origin: the file read, or ``hub:<name>``, or the name of a generated source (``synthetic``).
        problems: the mapped problems, in file order.
        bad_rows: rows skipped because ``skip_bad_rows`` was set (empty otherwise:
            without the flag the first bad row raises).
        rows_read: rows looked at (good + bad); with ``limit`` reading stops early.
    """

    source: str
    split: str
    origin: str
    problems: list[Problem] = field(default_factory=list)
    bad_rows: list[BadRow] = field(default_factory=list)
    rows_read: int = 0


def source_names() -> list[str]:
    """The sources ``load_problems`` accepts, sorted: datasets, generated ones (``synthetic``) and the
    generic file readers (``jsonl``: a user's file with field names given by ``fields=``)."""
    return sorted(SOURCES)


def get_source(name: str) -> SourceSpec:
    """The registered :class:`SourceSpec` for ``name``.

    Raises:
        DataError: unknown name (the message lists the known ones).
    """
    try:
        return SOURCES[name]
    except KeyError:
        raise DataError(
            f"unknown data source '{name}'; known sources: {', '.join(source_names())}"
        ) from None


def local_copy(source: str, split: str = "test") -> str | None:
    """``$MATHRL_DATA/<source>/<split>.jsonl`` when ``$MATHRL_DATA`` is set and that file exists (the folder
    layout of ``mathrl eval --data-dir``), else None (the hub). Every command reads a registered source this
    way when no file is given (training data, held-out sets, ``mathrl data``, ``mathrl eval``); an explicit
    file (data.path, --path, --data-dir, NAME=FILE) comes first."""
    root = os.environ.get("MATHRL_DATA")
    if not root:
        return None
    cand = Path(root).expanduser() / source / f"{split}.jsonl"
    return str(cand) if cand.is_file() else None


def load_problems(
    source: str,
    path: str | Path | None = None,
    split: str | None = None,
    *,
    limit: int | None = None,
    skip_bad_rows: bool = False,
    **options: Any,
) -> list[Problem]:
    """Load ``source`` as a list of :class:`Problem`.

    Args:
        source: a registered name (see :func:`source_names`), or ``synthetic``.
        path: a local ``.jsonl``/``.json``/``.parquet`` file, or a folder holding
            ``<split>.<suffix>``; ``None`` loads from the Hugging Face hub through
            ``datasets.load_dataset``.
        split: the split to read. For a folder or the hub the default is
            ``test``; for a file it only labels ids and defaults to the file's
            stem (``train.jsonl`` -> ``train``). Synthetic: ``train`` and
            ``test`` draw different problems (default ``train``).
        limit: keep at most this many problems (reading stops there).
        skip_bad_rows: skip rows that cannot be mapped instead of raising; the
            count is logged at WARNING (use :func:`load_source` for the list).
        **options: source options (:attr:`SourceSpec.options`): ``synthetic``
            takes ``n``, ``level``, ``seed`` (see :func:`mathrl.data.synthetic.generate`);
            ``jsonl`` takes ``fields`` (``{"question": ..., "answer": ...}``, the
            file's field names; default ``question`` and ``answer``). ``fields=None``
            is accepted by every source and means "not given", so a caller can
            pass ``fields=cfg.data.fields`` whatever the source.

    Raises:
        DataError: unknown source or option, unreadable or empty file, or (without
            ``skip_bad_rows``) the first bad row, named by file, line and field.
    """
    return load_source(
        source, path, split, limit=limit, skip_bad_rows=skip_bad_rows, **options
    ).problems


def load_source(
    source: str,
    path: str | Path | None = None,
    split: str | None = None,
    *,
    limit: int | None = None,
    skip_bad_rows: bool = False,
    **options: Any,
) -> LoadResult:
    """Like :func:`load_problems` but returns the :class:`LoadResult` with the skipped rows."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise DataError(f"limit must be a non-negative integer or None, got {limit!r}")
    spec = get_source(source)
    if options.get("fields", ()) is None:
        del options["fields"]  # "not given": lets callers pass data.fields for any source
    if spec.is_generated:
        return _load_generated(spec, path, split, limit, options)
    if options and not spec.options:
        with_options = ", ".join(f"{s.name} ({', '.join(s.options)})" for s in SOURCES.values() if s.options)
        raise DataError(
            f"source '{source}' takes no options, got {sorted(options)}; sources with options: {with_options}"
        )
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise DataError(f"unknown option(s) {unknown} for source '{source}'; allowed: {', '.join(spec.options)}")
    if spec.is_generic:
        spec = replace(spec, map_row=spec.map_fields(options.get("fields")))  # type: ignore[misc]
    elif spec.map_row is None:  # pragma: no cover - a registration error
        raise DataError(f"source '{source}' has neither a row mapper nor a generator")
    if path is None and spec.hub_name is not None:  # one rule in every command: $MATHRL_DATA before the hub
        path = local_copy(source, split or spec.default_split)
    if path is not None:
        file = resolve_local_path(path, split or spec.default_split)
        label = split or (file.stem if Path(path).is_file() else spec.default_split)
        rows: Iterator[RawRow] = iter_local_rows(file)
        origin = str(file)
    else:
        if spec.hub_name is None:
            raise DataError(f"source '{source}' has no hub location; pass a local file with --path "
                            "(mathrl train: data.path; held-out sets: data.eval_path; mathrl eval: "
                            f"--benchmarks {source}=FILE)")
        label = split or spec.default_split
        rows = iter_hub_rows(spec.hub_name, spec.hub_configs, spec.hub_splits.get(label, label))
        origin = f"hub:{spec.hub_name}"
    result = LoadResult(source=source, split=label, origin=origin)
    _map_rows(spec, rows, result, limit, skip_bad_rows)
    if result.rows_read == 0 and limit != 0:
        raise DataError(f"{origin}: no rows (the file or split is empty)")
    if result.bad_rows:
        logger.warning(
            "%s: skipped %d bad row(s) of %d read from %s; first: %s",
            source,
            len(result.bad_rows),
            result.rows_read,
            origin,
            result.bad_rows[0].message(),
        )
    return result


def sources_matching(row: Any, exclude: str | None = None) -> list[str]:
    """Registered sources whose mapper accepts ``row`` (used to say which source a file is for)."""
    if not isinstance(row, dict):
        return []
    out = []
    for name, spec in SOURCES.items():
        if name == exclude or spec.map_row is None or spec.is_generic:
            continue
        try:
            spec.map_row(row)
        except (RowError, ValueError, TypeError):
            continue
        out.append(name)
    return out


def _fix_for(spec: SourceSpec, row: Any, exc: RowError) -> str:
    """Generic advice for a bad row: the fields the source reads, and, when a field is missing,
    which other registered source the row's fields fit (a file meant for another dataset)."""
    expects = f"source '{spec.name}' reads the fields {', '.join(spec.fields)}"
    if isinstance(row, dict) and exc.reason.startswith("missing"):
        others = sources_matching(row, exclude=spec.name)
        if others:
            return (f"{expects}, but this row fits source {' / '.join(repr(o) for o in others)}: set "
                    f"data.source={others[0]} if the file is that dataset, else rename the fields")
        return f"{expects}: rename the fields in the file (or set data.source to the dataset the file holds)"
    return f"{expects}: correct the row"


def _map_rows(
    spec: SourceSpec, rows: Iterator[RawRow], result: LoadResult, limit: int | None, skip: bool
) -> None:
    if limit == 0:
        return
    for index, (location, row) in enumerate(rows):
        result.rows_read += 1
        try:
            if isinstance(row, RowError):
                raise row
            question, gold, meta = spec.map_row(row)  # type: ignore[misc]
        except RowError as exc:
            fix = exc.fix or _fix_for(spec, row, exc)
            bad = BadRow(location=location, field=exc.field, reason=exc.reason, fix=fix)
            if not skip:
                raise DataError(
                    f"{bad.message()}; fix: {fix}; or set data.skip_bad_rows=true (mathrl data: "
                    f"--skip-bad-rows) to skip and count such rows"
                ) from None
            result.bad_rows.append(bad)
            continue
        meta = {**meta, "location": location}
        result.problems.append(
            Problem(
                id=f"{spec.name}/{result.split}/{index}",
                question=question.strip(),
                gold=gold,
                source=spec.name,
                meta=meta,
            )
        )
        if limit is not None and len(result.problems) >= limit:
            return


def _load_generated(
    spec: SourceSpec, path: str | Path | None, split: str | None, limit: int | None, options: dict[str, Any]
) -> LoadResult:
    if path is not None:
        raise DataError(f"source '{spec.name}' is generated, it reads no file (got path {str(path)!r})")
    label = split or spec.default_split
    problems = spec.generate(label, **options)  # type: ignore[misc]
    if limit is not None:
        problems = problems[:limit]
    return LoadResult(
        source=spec.name, split=label, origin=spec.name, problems=problems, rows_read=len(problems)
    )
