"""Registry of problem sources and their field mappings: the one data registry.

Each :class:`SourceSpec` says where a dataset lives on the Hugging Face hub,
which fields hold the question and the gold answer, and how to turn one raw row
into ``(question, gold, meta)``. Mappers are pure functions of the row; they
raise :class:`RowError` naming the field when the row cannot be mapped.

A spec also says how the source is evaluated (``eval_split``, ``local_file``,
``eval_description``): :func:`mathrl.eval.benchmarks.benchmarks` derives from
:data:`SOURCES` (:data:`mathrl.registry.SOURCES`, filled here), one benchmark per source with an eval split, so registering a
source here makes it a benchmark too. Three kinds of source share the registry:

* datasets read from the hub or a local file through ``map_row``;
* generated sources (``generate``, e.g. ``synthetic``), which read no file;
* generic file sources (``map_fields``, e.g. ``jsonl``), which read a user's
  file with field names given by the caller (``fields=``, ``data.fields``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mathrl.data.errors import DataError, RowError, shorten
from mathrl.data.mappers import (Mapped, RowMapper, answer_field, map_aime, map_amc, map_asdiv, map_gsm8k, map_math,
                                 map_minerva, map_svamp, text_field)
from mathrl.data.problem import Problem
from mathrl.registry import FIELD_CHECKS, SOURCES
from mathrl.data.synthetic import load_synthetic

# generate(split, **options) -> problems, for generated sources (options: SourceSpec.options).
Generator = Callable[..., list[Problem]]
# map_fields(fields) -> row mapper, for generic file sources (fields: role -> the file's field name).
FieldMapperFactory = Callable[[Mapping[str, str]], RowMapper]

# ``local_file`` default: the benchmark file under a data folder, formatted with the spec's name and eval split.
DEFAULT_LOCAL_FILE = "{name}/{split}.jsonl"

# The seven subject configs of EleutherAI/hendrycks_math (the full MATH set).
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


@dataclass(frozen=True)
class SourceSpec:
    """One dataset: hub location, field mapping and documentation.

    Attributes:
        name: the source name users type (``gsm8k``, ``math500``, ...).
        description: one line for ``mathrl data sources`` and the dataset card.
        fields: the raw fields the mapper reads.
        question_rule / gold_rule: how question and gold are built (documentation).
        license: licence of the data.
        hub_name: ``datasets.load_dataset`` name, or ``None`` when not on the hub.
        hub_configs: configs loaded and concatenated (``(None,)`` for the default).
        hub_splits: mathrl split name -> hub split name, for hubs whose only
            split has another name (e.g. AIME 2024 ships as ``train``). Splits
            not listed are passed through unchanged.
        map_row: the row mapper (``None`` for a generated source).
        eval_split: the split the source's benchmark evaluates; ``None``: the
            source is not a benchmark (e.g. the generic ``jsonl`` reader).
        local_file: the benchmark's file under a data folder
            (``mathrl eval --data-dir``), formatted with ``name`` and ``split``
            (default ``<name>/<eval_split>.jsonl``); ``None``: no file (hub or
            generated only).
        eval_description: the benchmark's one-line description (default: ``description``).
        default_split: the split ``load_problems`` reads when none is given
            (``test``; ``train`` for ``synthetic``).
        generate: for a generated source, ``generate(split, **options)`` returning
            the problems; such a source reads no file and has no hub location.
        options: the keyword options ``load_problems`` accepts for this source
            (``n``, ``level``, ``seed`` for synthetic; ``fields`` for ``jsonl``).
        map_fields: for a generic file source, builds the row mapper from the
            caller's field names (``fields={"question": ..., "answer": ...}``);
            ``map_row`` is the mapper for the default names.
    """

    name: str
    description: str
    fields: tuple[str, ...]
    question_rule: str
    gold_rule: str
    license: str
    hub_name: str | None
    map_row: RowMapper | None
    hub_configs: tuple[str | None, ...] = (None,)
    hub_splits: Mapping[str, str] = field(default_factory=dict)
    eval_split: str | None = "test"
    local_file: str | None = DEFAULT_LOCAL_FILE
    eval_description: str | None = None
    default_split: str = "test"
    generate: Generator | None = None
    options: tuple[str, ...] = ()
    map_fields: FieldMapperFactory | None = None

    @property
    def is_benchmark(self) -> bool:
        """Whether the source has an eval split (and so a benchmark of the same name)."""
        return self.eval_split is not None

    @property
    def benchmark_file(self) -> str | None:
        """The benchmark's file relative to a data folder (``gsm8k/test.jsonl``), or ``None``."""
        if self.local_file is None or self.eval_split is None:
            return None
        return self.local_file.format(name=self.name, split=self.eval_split)

    @property
    def benchmark_description(self) -> str:
        return self.eval_description if self.eval_description is not None else self.description

    @property
    def is_generated(self) -> bool:
        return self.generate is not None

    @property
    def is_generic(self) -> bool:
        """A generic file reader (field names from the caller), not a named dataset."""
        return self.map_fields is not None


# ----------------------------------------------------------------------------- generic file source

# The roles a generic file source maps, and the field names used when the caller names none.
FIELD_ROLES = ("question", "answer")
DEFAULT_FIELDS: Mapping[str, str] = {"question": "question", "answer": "answer"}


@FIELD_CHECKS.register("data.fields")
def check_fields(fields: Mapping[str, str] | None) -> dict[str, str]:
    """The field names of a generic file source: ``fields`` over :data:`DEFAULT_FIELDS`.

    Raises:
        DataError: ``fields`` is not a mapping, names a role other than
            ``question``/``answer``, or gives a field name that is not a non-empty string.
    """
    if fields is None:
        return dict(DEFAULT_FIELDS)
    if not isinstance(fields, Mapping):
        raise DataError(f"fields must be a mapping such as {{question: problem, answer: final_answer}}, "
                        f"got {shorten(fields)}")
    unknown = sorted(str(k) for k in fields if k not in FIELD_ROLES)
    if unknown:
        raise DataError(f"fields: unknown role(s) {unknown}; allowed: {', '.join(FIELD_ROLES)} "
                        "(e.g. fields.question=problem fields.answer=final_answer)")
    for role, name in fields.items():
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"fields.{role} = {shorten(name)}: expected the name of a field in the file")
    return {**DEFAULT_FIELDS, **{k: v.strip() for k, v in fields.items()}}


def map_fields(fields: Mapping[str, str] | None = None) -> RowMapper:
    """A row mapper for a user's file: question = ``fields['question']``; gold = ``fields['answer']``.

    The answer is taken as the gold string as written (stripped; a JSON number
    is formatted, ``27.0`` -> ``27``), with no extraction. Every other field of
    the row is kept in ``meta``. A missing field is a :class:`RowError` naming it.
    """
    names = check_fields(fields)
    q_name, a_name = names["question"], names["answer"]

    def fix(role: str, name: str) -> str:
        return (f"give every row a '{name}' field, or name the field that holds the {role}: "
                f"data.fields.{role}=FIELD (mathrl data: --field {role}=FIELD)")

    def map_row(row: Mapping[str, Any]) -> Mapped:
        try:
            question = text_field(row, q_name)
        except RowError as exc:
            raise RowError(exc.field, exc.reason, fix=fix("question", q_name)) from None
        try:
            gold = answer_field(row, a_name, canonical_text=False)
        except RowError as exc:
            raise RowError(exc.field, exc.reason, fix=fix("answer", a_name)) from None
        meta = {k: v for k, v in row.items() if k not in (q_name, a_name)}
        return question, gold, meta

    return map_row


# ----------------------------------------------------------------------------- generated source


def generate_synthetic(split: str, **options: Any) -> list[Problem]:
    """The ``synthetic`` source: :func:`mathrl.data.synthetic.load_synthetic` (options ``n``, ``level``, ``seed``)."""

    return load_synthetic(split=split, **options)


# ----------------------------------------------------------------------------- registry

for _spec in (
    SourceSpec(
        name="gsm8k",
        description="GSM8K grade-school word problems (7473 train / 1319 test)",
        fields=("question", "answer"),
        question_rule="question",
        gold_rule="text after the last '####' of answer, thousands commas removed",
        license="MIT",
        hub_name="openai/gsm8k",
        hub_configs=("main",),
        map_row=map_gsm8k,
        eval_description="GSM8K test, 1319 grade-school word problems",
    ),
    SourceSpec(
        name="math",
        description="Hendrycks MATH competition problems, all seven subjects (7500 train / 5000 test)",
        fields=("problem", "solution", "level", "type", "answer (optional)"),
        question_rule="problem",
        gold_rule="answer field if present, else the last \\boxed{} of solution (nested braces kept)",
        license="MIT",
        hub_name="EleutherAI/hendrycks_math",
        hub_configs=MATH_SUBJECTS,
        map_row=map_math,
        eval_description="full Hendrycks MATH test (5000), when present",
    ),
    SourceSpec(
        name="math500",
        description="MATH-500, the 500-problem test subset of MATH used by 'Let's Verify Step by Step'",
        fields=("problem", "solution", "answer", "subject", "level"),
        question_rule="problem",
        gold_rule="answer (LaTeX), else the last \\boxed{} of solution",
        license="MIT",
        hub_name="HuggingFaceH4/MATH-500",
        map_row=map_math,
        eval_description="MATH-500 (subset of the MATH test set), with subject and level",
    ),
    SourceSpec(
        name="minerva_math",
        description="Minerva OCW undergraduate STEM problems (272), as in Qwen2.5-Math's evaluation",
        fields=("problem", "solution", "type", "idx"),
        question_rule="problem",
        gold_rule="last \\boxed{} of solution",
        license="see the Minerva paper's OCW problem release (MIT OpenCourseWare, CC BY-NC-SA)",
        hub_name="knoveleng/Minerva-Math",
        hub_splits={"test": "train"},
        map_row=map_minerva,
        eval_description="Minerva OCW problems (272)",
    ),
    SourceSpec(
        name="aime24",
        description="AIME 2024 I and II (30 problems, integer answers 0-999)",
        fields=("id", "problem", "solution", "answer", "url"),
        question_rule="problem",
        gold_rule="answer as an integer (leading zeros dropped)",
        license="problems (c) MAA, collected from the AoPS wiki; research use",
        hub_name="HuggingFaceH4/aime_2024",
        hub_splits={"test": "train"},
        map_row=map_aime,
        eval_description="AIME 2024 (30)",
    ),
    SourceSpec(
        name="amc23",
        description="AMC 2023 (40 problems with numeric answers), as in Qwen2.5-Math's evaluation",
        fields=("id", "problem", "answer", "url"),
        question_rule="problem (else question)",
        gold_rule="answer; integer-valued floats lose '.0' (27.0 -> 27)",
        license="problems (c) MAA, collected from the AoPS wiki; research use",
        hub_name="zwhe99/amc23",
        map_row=map_amc,
        eval_description="AMC 2023 (40)",
    ),
    SourceSpec(
        name="svamp",
        description="SVAMP one-step arithmetic word problems with varied structure (1000)",
        fields=("Body", "Question", "Answer", "Equation", "Type", "ID"),
        question_rule="Body + ' ' + Question (a period added when Body lacks end punctuation)",
        gold_rule="Answer; integer-valued floats lose '.0'",
        license="MIT",
        hub_name="ChilleD/SVAMP",
        map_row=map_svamp,
        eval_description="SVAMP (1000)",
    ),
    SourceSpec(
        name="asdiv",
        description="ASDiv diverse primary-school word problems (2215 in Qwen2.5-Math's evaluation)",
        fields=("body", "question", "answer", "solution_type", "formula"),
        question_rule="body + ' ' + question",
        gold_rule="answer without its trailing '(unit)': '9 (apples)' -> '9'",
        license="CC BY-NC 4.0",
        hub_name="EleutherAI/asdiv",
        hub_splits={"test": "validation"},
        map_row=map_asdiv,
        eval_description="ASDiv (2215)",
    ),
    SourceSpec(
        name="synthetic",
        description="generated arithmetic word problems (--level, --seed, --size)",
        fields=(),
        question_rule="a generated story encoding a chain of arithmetic steps",
        gold_rule="the value of the chain, an integer",
        license="generated by mathrl",
        hub_name=None,
        map_row=None,
        local_file=None,
        eval_description="the embedded synthetic arithmetic task, held-out draw",
        default_split="train",
        generate=generate_synthetic,
        options=("n", "level", "seed"),
    ),
    SourceSpec(
        name="jsonl",
        description="your own .jsonl/.json/.parquet file; field names from data.fields (mathrl data: --field)",
        fields=FIELD_ROLES,
        question_rule="the field named by fields.question (default 'question')",
        gold_rule="the field named by fields.answer (default 'answer'), taken as written",
        license="that of your file",
        hub_name=None,
        map_row=map_fields(),
        eval_split=None,
        local_file=None,
        options=("fields",),
        map_fields=map_fields,
    ),
):  # every source by name, in registration order (the order benchmarks and suggestions use)
    SOURCES.register(_spec.name, _spec, doc=_spec.description)
