"""Data stage: problem sources (hub name or local file), synthetic tasks, prompt templates.

Entry points:

* :func:`load_problems` / :func:`load_source` -- any source of the one registry
  :data:`SOURCES` (datasets from the hub or a local ``.jsonl``/``.json``/``.parquet``
  file, the generated ``synthetic`` task, and ``jsonl``: a user's file with field
  names from ``fields=``), as :class:`Problem` records; every source with an eval
  split is also a benchmark (:func:`mathrl.eval.benchmarks.benchmarks`);
* :func:`last_boxed`, :func:`gsm8k_gold` -- gold extraction;
* :mod:`mathrl.data.synthetic` -- the embedded default dataset;
* :mod:`mathrl.data.templates` -- chat / few-shot prompt rendering;
* :mod:`mathrl.data.cli` -- ``mathrl data show|stats|sources``.
"""

from mathrl.data.errors import BadRow, DataError
from mathrl.data.gold import format_number, gold_kind, gsm8k_gold, last_boxed, strip_unit
from mathrl.data.loader import LoadResult, get_source, load_problems, load_source, source_names
from mathrl.data.problem import Problem
from mathrl.data.sources import DEFAULT_FIELDS, SOURCES, SourceSpec, check_fields
from mathrl.data.templates import TEMPLATES, PromptTemplate, get_template, render_prompt

__all__ = [
    "BadRow",
    "DEFAULT_FIELDS",
    "DataError",
    "LoadResult",
    "Problem",
    "PromptTemplate",
    "SOURCES",
    "SourceSpec",
    "TEMPLATES",
    "check_fields",
    "format_number",
    "get_source",
    "get_template",
    "gold_kind",
    "gsm8k_gold",
    "last_boxed",
    "load_problems",
    "load_source",
    "render_prompt",
    "source_names",
    "strip_unit",
]
