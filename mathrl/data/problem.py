"""The `Problem` record: every dataset row is mapped to one of these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One math problem.

    Attributes:
        id: stable identifier, unique within its source (e.g. ``gsm8k/test/17``).
        question: the problem text shown to the model.
        gold: the reference final answer as a string (GSM8K: the number after
            ``####`` with thousands separators removed; MATH: the ``answer``
            field or the last ``\\boxed{}`` of the solution, as LaTeX).
        source: the dataset name (``gsm8k``, ``math500``, ``synthetic``, ...).
        meta: extra fields such as ``subject``, ``level``, ``solution``.
    """

    id: str
    question: str
    gold: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict)
