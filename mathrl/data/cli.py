"""``mathrl data``: look at a source before training on it.

    mathrl data sources
    mathrl data show SOURCE [--path P] [--split S] [--n 3] [--template NAME [--tokenizer T]]
    mathrl data stats SOURCE [--path P] [--split S]

``synthetic`` takes ``--level``, ``--seed`` and ``--size`` instead of a path;
``jsonl`` reads any file, with ``--field question=NAME --field answer=NAME``
naming its fields (defaults ``question`` and ``answer``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mathrl.data.errors import DataError
from mathrl.data.gold import gold_kind
from mathrl.data.loader import LoadResult, load_source, source_names
from mathrl.data.sources import SOURCES
from mathrl.data.synthetic import DEFAULT_LEVEL, LEVELS
from mathrl.data.templates import TEMPLATES, get_template

_META_TEXT_LIMIT = 200


def build_parser(prog: str = "mathrl data") -> argparse.ArgumentParser:
    """The ``mathrl data`` argument parser (sub-commands ``sources``, ``show``, ``stats``)."""
    parser = argparse.ArgumentParser(prog=prog, description="Inspect math problem sources.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{sources,show,stats}")
    sub.add_parser("sources", help="list the sources, their hub names, gold rules, templates and synthetic levels")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("source", help=f"one of: {', '.join(source_names())}")
        p.add_argument("--path", help="local .jsonl/.json/.parquet file or a folder with <split>.<ext>; "
                       "default: the Hugging Face hub")
        p.add_argument("--split", help="split (default: test; for a file its stem; synthetic: train)")
        p.add_argument("--skip-bad-rows", action="store_true", help="skip and count rows that cannot be mapped")
        p.add_argument("--level", type=int, help=f"synthetic: difficulty level {min(LEVELS)}-{max(LEVELS)} "
                       f"(default {DEFAULT_LEVEL})")
        p.add_argument("--seed", type=int, help="synthetic: seed (default 0)")
        p.add_argument("--size", type=int, help="synthetic: number of problems to generate")
        p.add_argument("--field", action="append", metavar="ROLE=NAME",
                       help="jsonl: the file's field for a role (question, answer), e.g. --field "
                       "question=problem --field answer=final_answer (= data.fields.ROLE=NAME)")

    show = sub.add_parser("show", help="print the first problems (id, question, gold, meta)")
    common(show)
    show.add_argument("--n", type=int, default=3, help="how many problems to print (default 3)")
    show.add_argument("--template", choices=sorted(TEMPLATES), help="also print the rendered prompt")
    show.add_argument("--tokenizer", help="for chat templates: a local tokenizer folder, or a .gguf file")
    stats = sub.add_parser("stats", help="row count, bad rows, gold kinds, subjects and levels")
    common(stats)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mathrl data`` with ``argv`` (without the leading ``data``); returns the exit code."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "sources":
            _print_sources()
            return 0
        if args.command == "show":
            return _show(args)
        return _stats(args)
    except DataError as exc:
        print(f"mathrl data: error: {exc}", file=sys.stderr)
        return 2


# command-line flag -> the option of a generated source (SourceSpec.options)
_GENERATOR_FLAGS = {"size": "n", "level": "level", "seed": "seed"}


def _options(args: argparse.Namespace, default_size: int) -> dict[str, Any]:
    spec = SOURCES.get(args.source, None)
    opts: dict[str, Any] = {}
    given = {k: getattr(args, k) for k in _GENERATOR_FLAGS if getattr(args, k) is not None}
    if spec is not None and spec.is_generated:
        opts = {"n": given.pop("size", default_size)} if "n" in spec.options else {}
        opts.update({_GENERATOR_FLAGS[k]: v for k, v in given.items()})
    elif given:
        generated = [s.name for s in SOURCES.values() if s.is_generated]
        raise DataError(f"--{', --'.join(given)} only apply to the "
                        f"{', '.join(repr(g) for g in generated)} source")
    if args.field:
        if spec is None or "fields" not in spec.options:
            generic = [s.name for s in SOURCES.values() if "fields" in s.options]
            raise DataError(f"--field only applies to the {', '.join(repr(g) for g in generic)} source")
        fields: dict[str, str] = {}
        for item in args.field:
            role, eq, name = item.partition("=")
            if not eq:
                raise DataError(f"--field {item!r}: expected ROLE=NAME, e.g. --field question=problem")
            fields[role.strip()] = name.strip()
        opts["fields"] = fields
    return opts


def _load(args: argparse.Namespace, limit: int | None, default_size: int) -> LoadResult:
    return load_source(
        args.source,
        args.path,
        args.split,
        limit=limit,
        skip_bad_rows=args.skip_bad_rows,
        **_options(args, default_size),
    )


def _short(value: Any) -> str:
    text = str(value)
    if len(text) > _META_TEXT_LIMIT:
        text = text[:_META_TEXT_LIMIT] + f"... ({len(text)} chars)"
    return text.replace("\n", "\\n")


def _show(args: argparse.Namespace) -> int:
    if args.n < 0:
        raise DataError(f"--n must be >= 0, got {args.n}")
    template = get_template(args.template) if args.template else None
    tokenizer = _load_tokenizer(args.tokenizer) if template is not None and template.chat else None
    result = _load(args, args.n, args.n)
    print(f"# {result.source} / {result.split} from {result.origin}: showing {len(result.problems)}")
    for p in result.problems:
        print(f"\nid:       {p.id}")
        print(f"question: {p.question}")
        print(f"gold:     {p.gold}")
        for key, value in p.meta.items():
            print(f"  {key}: {_short(value)}")
        if template is not None:
            print(f"--- prompt ({template.name}) ---\n{template.render(p, tokenizer)}\n--- end prompt ---")
    _print_bad(result)
    return 0


def _load_tokenizer(spec: str | None):
    if spec is None:
        raise DataError("chat templates need --tokenizer (a local tokenizer folder or a .gguf file)")
    from transformers import AutoTokenizer

    path = Path(spec)
    try:
        if path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise DataError(f"--tokenizer {spec}: cannot load a tokenizer: {exc}") from exc


def _print_bad(result: LoadResult, show: int = 5) -> None:
    if not result.bad_rows:
        return
    print(f"\nbad rows skipped: {len(result.bad_rows)} of {result.rows_read}")
    for bad in result.bad_rows[:show]:
        print(f"  {bad.message()}")
    if len(result.bad_rows) > show:
        print(f"  ... and {len(result.bad_rows) - show} more")


def _stats(args: argparse.Namespace) -> int:
    spec = SOURCES.get(args.source, None)
    if not (spec is not None and spec.is_generated) and not args.skip_bad_rows:
        args.skip_bad_rows = True  # stats counts bad rows instead of stopping at the first
    result = _load(args, None, 1000)
    problems = result.problems
    print(f"source:    {result.source}")
    print(f"split:     {result.split}")
    print(f"origin:    {result.origin}")
    print(f"rows read: {result.rows_read}")
    print(f"problems:  {len(problems)}")
    print(f"bad rows:  {len(result.bad_rows)}")
    kinds = Counter(gold_kind(p.gold) for p in problems)
    print("gold kinds: " + (", ".join(f"{k} {v}" for k, v in kinds.most_common()) or "-"))
    if problems:
        lengths = [len(p.question) for p in problems]
        print(
            f"question chars: min {min(lengths)}, median {int(statistics.median(lengths))}, max {max(lengths)}"
        )
    for key in ("subject", "level", "unit"):
        values = Counter(str(p.meta[key]) for p in problems if key in p.meta)
        if values:
            top = ", ".join(f"{k} {v}" for k, v in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[:12])
            more = f" (+{len(values) - 12} more)" if len(values) > 12 else ""
            print(f"{key}: {top}{more}")
    examples = {}
    for p in problems:
        examples.setdefault(gold_kind(p.gold), p.gold)
    if examples:
        print("gold examples: " + "; ".join(f"{k}: {_short(v)}" for k, v in examples.items()))
    _print_bad(result)
    return 0


def _print_sources() -> None:
    print("sources:")
    for name in source_names():
        spec = SOURCES[name]
        print(f"  {name:13s} {spec.description}")
        if spec.is_generated:
            continue
        where = f"hub: {spec.hub_name}" if not spec.is_generic else "file: data.path (--path)"
        print(f"  {'':13s} {where}; question: {spec.question_rule}; gold: {spec.gold_rule}")
    print("synthetic levels:")
    for lv in LEVELS.values():
        print(f"  {lv.level:2d}  {lv.description}")
    print("prompt templates: " + ", ".join(sorted(TEMPLATES)))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
