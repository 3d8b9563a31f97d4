"""Errors and bad-row records of the data stage."""

from __future__ import annotations

from dataclasses import dataclass

from mathrl.errors import InputError


class DataError(InputError, ValueError):
    """A dataset cannot be read or a row cannot be mapped to a :class:`Problem`.

    The message always names where (file and line, or hub name and row), which
    field, and what was wrong, so a user can fix the file without a debugger.
    """


@dataclass(frozen=True)
class BadRow:
    """One row that could not be mapped to a :class:`Problem`.

    Attributes:
        location: ``path:line`` for JSON Lines, ``path:line`` of the element's
            first character for a JSON array, ``path row N`` for parquet,
            ``hub:name[config]/split row N`` for the hub (1-based).
        field: the field at fault (``<json>`` for a line that is not valid JSON,
            ``<row>`` for a value that is not an object).
        reason: what was wrong, with the offending value shortened.
        fix: what the user can do about it (``None``: the loader's generic advice).
    """

    location: str
    field: str
    reason: str
    fix: str | None = None

    def message(self) -> str:
        """One-line human message, e.g. ``a.jsonl:3: field 'answer': no '####' marker``."""
        return f"{self.location}: field '{self.field}': {self.reason}"


class RowError(Exception):
    """Raised by a row mapper; the loader adds the location and turns it into a BadRow.

    ``fix`` is an optional one-clause remedy (e.g. "write the gold in digits, as in '#### 12'")
    that the loader puts into the user's message instead of its generic advice.
    """

    def __init__(self, field: str, reason: str, fix: str | None = None) -> None:
        super().__init__(f"field '{field}': {reason}")
        self.field = field
        self.reason = reason
        self.fix = fix


def shorten(value: object, limit: int = 80) -> str:
    """``repr`` of ``value`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
