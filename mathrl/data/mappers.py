"""Row mappers of the named datasets: ``row -> (question, gold, meta)``, pure functions that raise
:class:`~mathrl.data.errors.RowError` naming the field when a row cannot be mapped, and the field
helpers they are built from (also for a new source's mapper; see :mod:`mathrl.data.sources`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from mathrl.data.errors import RowError, shorten
from mathrl.data.gold import format_number, gsm8k_gold, last_boxed, strip_unit

Mapped = tuple[str, str, dict[str, Any]]
RowMapper = Callable[[Mapping[str, Any]], Mapped]


# ----------------------------------------------------------------------------- field helpers


def _present(row: Mapping[str, Any], name: str) -> bool:
    return name in row and row[name] is not None


def _missing(row: Mapping[str, Any], name: str) -> RowError:
    return RowError(name, f"missing (fields present: {sorted(row)})")


def text_field(row: Mapping[str, Any], *names: str) -> str:
    """The first of ``names`` present in ``row``, as non-empty text.

    Raises:
        RowError: none present (names the first), not a string, or blank.
    """
    for name in names:
        if _present(row, name):
            value = row[name]
            if not isinstance(value, str):
                raise RowError(name, f"expected text, got {type(value).__name__} {shorten(value)}")
            if not value.strip():
                raise RowError(name, "is empty")
            return value
    raise _missing(row, names[0])


def answer_field(row: Mapping[str, Any], name: str, *, canonical_text: bool = True) -> str:
    """A gold given directly as text or a number.

    Numbers go through :func:`format_number`; text does too when
    ``canonical_text`` (plain integers lose leading zeros and thousands commas),
    else it is only stripped (LaTeX answers such as ``1,2,3`` are lists, not
    thousands).
    """
    if not _present(row, name):
        raise _missing(row, name)
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError(name, f"expected a number or text, got {type(value).__name__} {shorten(value)}")
    try:
        gold = value.strip() if isinstance(value, str) and not canonical_text else format_number(value)
    except ValueError as exc:
        raise RowError(name, str(exc)) from exc
    if not gold:
        raise RowError(name, "empty gold answer")
    return gold


def boxed_gold(solution: str, name: str = "solution") -> str:
    """The last ``\\boxed{}`` of a solution as the gold, or a RowError saying why not."""
    gold = last_boxed(solution)
    if gold is None:
        raise RowError(
            name, f"no complete \\boxed{{...}} to take the gold answer from (ends with {shorten(solution[-60:])})"
        )
    if not gold:
        raise RowError(name, "the last \\boxed{} is empty")
    return gold


def _level(value: Any) -> tuple[int | None, Any]:
    """MATH level as an int: ``3`` or ``'Level 3'`` -> 3; ``'Level ?'`` -> None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(?:Level\s*)?(\d+)\s*", value)
        if m:
            return int(m.group(1)), value
    return None, value


def _orig_id(row: Mapping[str, Any], *names: str) -> dict[str, Any]:
    for name in names:
        if _present(row, name):
            return {"orig_id": row[name]}
    return {}


# ----------------------------------------------------------------------------- mappers


# A GSM8K gold: an integer or decimal, optionally signed (thousands commas are removed before).
_GSM8K_NUMBER_RE = re.compile(r"[+-]?(\d+(\.\d+)?|\.\d+)")
_GSM8K_FIX = "every GSM8K answer ends with the final number after '####', e.g. '... so 7 + 5 = 12.\\n#### 12'"


def map_gsm8k(row: Mapping[str, Any]) -> Mapped:
    """GSM8K: question = ``question``; gold = text after ``####`` in ``answer``, commas removed.

    The gold must be a number (integer or decimal, optionally signed): every one
    of GSM8K's 8792 golds is, and the verifier compares GSM8K answers as numbers,
    so a gold such as ``twelve`` is a broken row, not a hard problem.
    """
    question = text_field(row, "question")
    if _present(row, "answer") and isinstance(row["answer"], str) and not row["answer"].strip():
        raise RowError("answer", "is empty: no gold answer",
                       fix=f"fill in the worked answer or remove the row ({_GSM8K_FIX})")
    answer = text_field(row, "answer")
    try:
        gold = gsm8k_gold(answer)
    except ValueError as exc:
        raise RowError("answer", f"{exc} (ends with {shorten(answer[-60:])})", fix=_GSM8K_FIX) from exc
    if not _GSM8K_NUMBER_RE.fullmatch(gold):
        raise RowError("answer", f"the gold after '####' is {shorten(gold)}, not a number",
                       fix="write the final answer in digits after '####', e.g. '#### 12' (GSM8K golds are "
                       "integers or decimals; the verifier compares them as numbers)")
    return question, gold, {"solution": answer}


def map_math(row: Mapping[str, Any]) -> Mapped:
    """Hendrycks MATH / MATH-500: question = ``problem``; gold = ``answer`` or last ``\\boxed{}`` of ``solution``."""
    question = text_field(row, "problem")
    solution = row.get("solution") if isinstance(row.get("solution"), str) else None
    raw_answer = row.get("answer")
    if raw_answer is not None and not (isinstance(raw_answer, str) and not raw_answer.strip()):
        gold = answer_field(row, "answer", canonical_text=False)
    elif solution is not None:
        gold = boxed_gold(solution)
    else:
        raise RowError("answer", "missing or empty, and there is no 'solution' to take the last \\boxed{} from")
    meta: dict[str, Any] = {}
    subject = row.get("subject") or row.get("type")
    if subject is not None:
        meta["subject"] = subject
    if "level" in row:
        level, raw = _level(row["level"])
        meta["level"] = level
        if level is None or raw != level:
            meta["level_raw"] = raw
    if solution is not None:
        meta["solution"] = solution
    if _present(row, "unique_id"):
        meta["unique_id"] = row["unique_id"]
    return question, gold, meta


def map_minerva(row: Mapping[str, Any]) -> Mapped:
    """Minerva OCW: question = ``problem``; gold = last ``\\boxed{}`` of ``solution`` (else ``answer``)."""
    question = text_field(row, "problem", "question")
    if _present(row, "solution"):
        solution = text_field(row, "solution")
        gold = boxed_gold(solution)
        meta: dict[str, Any] = {"solution": solution}
    else:
        if not _present(row, "answer"):
            raise RowError("solution", f"missing, and no 'answer' either (fields present: {sorted(row)})")
        gold = answer_field(row, "answer")
        meta = {}
    if _present(row, "type"):
        meta["subject"] = row["type"]
    meta.update(_orig_id(row, "idx", "id"))
    return question, gold, meta


def map_aime(row: Mapping[str, Any]) -> Mapped:
    """AIME 2024: question = ``problem``; gold = ``answer`` (leading zeros dropped: ``025`` -> ``25``)."""
    question = text_field(row, "problem", "question")
    gold = answer_field(row, "answer")
    meta: dict[str, Any] = {}
    if isinstance(row.get("answer"), str) and row["answer"].strip() != gold:
        meta["answer_raw"] = row["answer"]
    for key in ("solution", "url", "year"):
        if _present(row, key):
            meta[key] = row[key]
    meta.update(_orig_id(row, "id"))
    return question, gold, meta


def map_amc(row: Mapping[str, Any]) -> Mapped:
    """AMC 2023: question = ``problem`` (or ``question``); gold = ``answer`` (``27.0`` -> ``27``)."""
    question = text_field(row, "problem", "question")
    gold = answer_field(row, "answer")
    meta: dict[str, Any] = {}
    if _present(row, "url"):
        meta["url"] = row["url"]
    meta.update(_orig_id(row, "id"))
    return question, gold, meta


def _join_body_question(body: str, question: str) -> str:
    """``body`` and ``question`` as one text. A body that ends mid-sentence with ``,``, ``;`` or ``:`` runs on
    into the question (ASDiv: "If she adds 3 more pounds to fill her bucket," + "how many pounds does she
    have?"); a body that ends a sentence (``.``, ``?``, ``!``, also inside closing quotes or brackets) is
    kept as it is; any other body gets a period (SVAMP's bodies often end without one)."""
    body = body.strip()
    if body and body[-1] not in ",;:" and body.rstrip("\"')]”’")[-1:] not in (".", "?", "!"):
        body += "."
    return f"{body} {question.strip()}".strip()


def map_svamp(row: Mapping[str, Any]) -> Mapped:
    """SVAMP: question = ``Body`` + " " + ``Question``; gold = ``Answer`` (``145.0`` -> ``145``)."""
    question = _join_body_question(text_field(row, "Body"), text_field(row, "Question"))
    gold = answer_field(row, "Answer")
    meta: dict[str, Any] = {}
    if _present(row, "Equation"):
        meta["equation"] = row["Equation"]
    if _present(row, "Type"):
        meta["type"] = row["Type"]
    meta.update(_orig_id(row, "ID", "idx"))
    return question, gold, meta


def map_asdiv(row: Mapping[str, Any]) -> Mapped:
    """ASDiv: question = ``body`` + " " + ``question``; gold = ``answer`` without its unit.

    ``'9 (apples)'`` -> ``9``. A few answers are not numbers (``'3:30 p.m.'``,
    ``'5:6'``, ``'Yes'``); they are kept as written, the unit removed, and the
    reward stage compares them.
    """
    question = _join_body_question(text_field(row, "body"), text_field(row, "question"))
    raw = row.get("answer")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        gold, unit = format_number(raw), None
    else:
        text = text_field(row, "answer")
        if re.fullmatch(r"\s*\([^()]*[A-Za-z][^()]*\)\s*", text):
            raise RowError("answer", f"only a unit, no value before it: {shorten(raw)}")
        value, unit = strip_unit(text)
        gold = format_number(value)
    meta: dict[str, Any] = {"answer_raw": raw}
    if unit is not None:
        meta["unit"] = unit
    for key in ("solution_type", "formula"):
        if _present(row, key):
            meta[key] = row[key]
    meta.update(_orig_id(row, "idx", "id"))
    return question, gold, meta


