"""Reading a user's JSON-lines file with errors that name the file and line (``mathrl prm`` label files,
``mathrl grade`` case files)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

__all__ = ["json_objects"]


def json_objects(path: str | Path, error: type[Exception], *, missing: str = "") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of ``path``; a missing file (``missing``: a hint to
    add), a line that is not JSON or not a JSON object raises ``error`` with ``<file>:<line>: <what>``."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{p}: no such file{f' ({missing})' if missing else ''}")
    with p.open(encoding="utf-8") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{p}:{ln}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise error(f"{p}:{ln}: expected a JSON object, got {type(obj).__name__}")
            yield ln, obj
