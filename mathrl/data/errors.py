"""Errors and bad-row records of the data stage."""

from __future__ import annotations

from dataclasses import dataclass


class DataError(ValueError):
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
    """

    location: str
    field: str
    reason: str

    def message(self) -> str:
        """One-line human message, e.g. ``a.jsonl:3: field 'answer': no '####' marker``."""
        return f"{self.location}: field '{self.field}': {self.reason}"


class RowError(Exception):
    """Raised by a row mapper; the loader adds the location and turns it into a BadRow."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field '{field}': {reason}")
        self.field = field
        self.reason = reason


def shorten(value: object, limit: int = 80) -> str:
    """``repr`` of ``value`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
