"""Row readers: local ``.jsonl`` / ``.json`` / ``.parquet`` files and the Hugging Face hub.

Every reader yields ``(location, row)`` pairs where ``location`` names the file
and line (or row) of the record, so a row that cannot be mapped is reported
where the user can find it. A JSON Lines line that is not valid JSON is yielded
as a :class:`RowError` instead of a row, so the loader can skip and count it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from mathrl.data.errors import DataError, RowError, shorten
from mathrl.hub import offline_if_unreachable

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")

RawRow = tuple[str, "dict[str, Any] | RowError"]


def resolve_local_path(path: str | Path, split: str) -> Path:
    """The file to read for ``path``: the file itself, or ``<dir>/<split>.{jsonl,json,parquet}``.

    Raises:
        DataError: the path does not exist, has an unsupported suffix, or the
            directory holds no file for the split.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        for suffix in LOCAL_SUFFIXES:
            candidate = p / f"{split}{suffix}"
            if candidate.is_file():
                return candidate
        present = sorted(c.name for c in p.iterdir() if c.suffix in LOCAL_SUFFIXES)
        raise DataError(
            f"{p}: no file for split '{split}' (looked for {split}.jsonl, {split}.json, "
            f"{split}.parquet); data files present: {present or 'none'}"
        )
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if p.suffix not in LOCAL_SUFFIXES:
        raise DataError(
            f"{p}: unsupported file type '{p.suffix or '(none)'}'; allowed: "
            + ", ".join(LOCAL_SUFFIXES)
        )
    return p


def iter_local_rows(path: Path) -> Iterator[RawRow]:
    """Rows of a local file by suffix (see :data:`LOCAL_SUFFIXES`)."""
    if path.suffix == ".jsonl":
        yield from iter_jsonl(path)
    elif path.suffix == ".json":
        yield from iter_json(path)
    elif path.suffix == ".parquet":
        yield from iter_parquet(path)
    else:  # resolve_local_path already checked; keep the error for direct callers
        raise DataError(f"{path}: unsupported file type '{path.suffix}'")


def json_line_error(line: str, exc: json.JSONDecodeError) -> RowError:
    """The :class:`RowError` for a JSON Lines line that does not parse.

    A line whose parse ran out of text (an unterminated string, or the error at
    the line's very end) was cut off mid-record. When it is also the file's last
    line (no newline after it) the file itself was cut short -- an interrupted
    download or copy -- and the message says so, because the fix is to fetch the
    file again rather than to edit one row.
    """
    detail = f"invalid JSON at column {exc.colno}: {exc.msg}"
    body = line.rstrip("\r\n")
    cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(body.rstrip())
    if cut and not line.endswith("\n"):
        return RowError(
            "<json>",
            f"the last line is cut off mid-record ({detail})",
            fix="the file looks truncated (an interrupted download or copy?): fetch it again, "
            "or delete the incomplete last line",
        )
    if cut:
        return RowError("<json>", f"the line is cut off mid-record ({detail})",
                        fix="complete or delete the line (JSON Lines holds one whole object per line)")
    return RowError("<json>", detail, fix="correct the JSON on this line (JSON Lines holds one object per line)")


def iter_jsonl(path: Path) -> Iterator[RawRow]:
    """JSON Lines, read line by line so each row keeps its 1-based line number.

    Blank lines are not rows and are passed over. A line that is not valid JSON
    or not a JSON object is yielded as a :class:`RowError`.
    """
    try:
        fh = path.open("rb")  # bytes, decoded line by line: a bad byte is reported on its own line, as a row error
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or exc}") from exc
    with fh:
        for lineno, raw in enumerate(fh, 1):
            loc = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield loc, RowError("<utf-8>", f"not UTF-8 text: byte {raw[exc.start]:#04x} at column {exc.start + 1} "
                                    f"({exc.reason})", fix="save the file as UTF-8, or correct or delete this line")
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield loc, json_line_error(line, exc)
                continue
            if not isinstance(value, dict):
                yield loc, RowError(
                    "<row>", f"expected a JSON object, got {type(value).__name__} {shorten(value)}"
                )
                continue
            yield loc, value


def iter_json(path: Path) -> Iterator[RawRow]:
    """A ``.json`` file: an array of objects, an object ``{"data": [...]}``, or JSON Lines.

    Array elements are decoded one at a time so each keeps the line on which it
    starts. Invalid JSON inside an array cannot be resynchronised, so it is a
    :class:`DataError` naming line and column (never skipped).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(f"{path}:{line}: not UTF-8 text: byte {data[exc.start]:#04x} at column {col} ({exc.reason}); "
                        "save the file as UTF-8") from exc
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return
    if text[start] == "{":
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg == "Extra data":  # one object per line: JSON Lines named .json
                yield from iter_jsonl(path)
                return
            raise DataError(f"{path}:{exc.lineno}: invalid JSON at column {exc.colno}: {exc.msg}") from exc
        if isinstance(whole.get("data"), list):
            array_start = _find_data_array(text, path)
            yield from _iter_array(text, array_start, path)
        else:  # a single row
            yield f"{path}:{_line_of(text, start)}", whole
        return
    if text[start] != "[":
        raise DataError(
            f"{path}:{_line_of(text, start)}: expected a JSON array of objects, an object with a "
            f"'data' array, or JSON Lines; found {shorten(text[start:start + 20])}"
        )
    yield from _iter_array(text, start, path)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _find_data_array(text: str, path: Path) -> int:
    """Position of the '[' opening the top-level "data" member of an object."""
    decoder = json.JSONDecoder()
    i = text.index("{") + 1
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        key, i = decoder.raw_decode(text, i)
        while text[i] in " \t\r\n:":
            i += 1
        if key == "data":
            return i
        _, i = decoder.raw_decode(text, i)


def _iter_array(text: str, start: int, path: Path) -> Iterator[RawRow]:
    decoder = json.JSONDecoder()
    i = start + 1
    n = len(text)
    index = 0
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] == "]":
            return
        if i >= n:
            raise DataError(f"{path}:{_line_of(text, n)}: the JSON array is not closed with ']'")
        line = _line_of(text, i)
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: invalid JSON at column {exc.colno}: {exc.msg}") from exc
        index += 1
        loc = f"{path}:{line}"
        if isinstance(value, dict):
            yield loc, value
        else:
            yield loc, RowError(
                "<row>", f"array element {index} is {type(value).__name__} {shorten(value)}, expected an object"
            )
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            raise DataError(f"{path}:{_line_of(text, n)}: the JSON array is not closed with ']'")
        if text[i] == ",":
            i += 1
        elif text[i] == "]":
            return
        else:
            raise DataError(
                f"{path}:{_line_of(text, i)}: expected ',' or ']' after array element {index}"
            )


def iter_parquet(path: Path) -> Iterator[RawRow]:
    """Rows of a parquet file (1-based row numbers), read with pyarrow (the engine of ``datasets``).

    Reading the table directly avoids the ``datasets`` cache, which would copy
    every local file into ``~/.cache`` on first use.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow ships with datasets
        raise DataError(f"{path}: reading parquet needs pyarrow (installed with 'datasets')") from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError subclasses
        raise DataError(f"{path}: not a readable parquet file: {exc}") from exc
    for index, row in enumerate(table.to_pylist(), start=1):
        yield f"{path} row {index}", row


def iter_hub_rows(name: str, configs: Sequence[str | None], split: str) -> Iterator[RawRow]:
    """Rows of a hub dataset through ``datasets.load_dataset`` (one pass per config).

    Raises:
        DataError: the dataset cannot be loaded (no network, unknown name or
            split); the message says how to use a local file instead.
    """

    offline_if_unreachable(f"dataset {name!r}")  # before datasets is imported: it reads the offline flag then
    import datasets

    for config in configs:
        label = f"hub:{name}" + (f"[{config}]" if config else "") + f"/{split}"
        try:
            ds = datasets.load_dataset(name, config, split=split)
        except Exception as exc:
            raise DataError(
                f"{label}: cannot load from the Hugging Face hub ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); download the data once and point "
                f"data.path (mathrl train) or --path (mathrl data) at a local .jsonl/.json/.parquet file "
                f"(see data/README.md)"
            ) from exc
        for index, row in enumerate(ds, start=1):
            yield f"{label} row {index}", dict(row)
