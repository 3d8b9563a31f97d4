"""``mathrl train --help``: every config field (its key, allowed values, default and meaning), then the entries
of every registry a field reads (:mod:`mathrl.registry`), so no name list is written out here."""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from typing import Any

import yaml

from mathrl.config.loader import field_type_name, section_classes
from mathrl.registry import ABLATION_METHODS, ESTIMATORS, REGISTRIES, REWARDS, Registry

__all__ = ["describe_fields", "help_text", "registry_help"]


def _fmt_default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
    else:
        v = None
    return "null" if v is None else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def describe_fields() -> list[tuple[str, str, str, str]]:
    """(key, type, default, doc) for every field, in declaration order."""
    rows = []
    for section, cls in section_classes().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            rows.append((f"{section}.{f.name}", field_type_name(hints[f.name], dict(f.metadata)), _fmt_default(f),
                         f.metadata["doc"]))
    return rows


def help_text(width: int = 100) -> str:
    lines = ["Configuration fields (set in a YAML recipe or as key=value on the command line):", ""]
    current = None
    for key, tp, default, doc in describe_fields():
        section = key.split(".")[0]
        if section != current:
            lines.append(f"[{section}]")
            current = section
        lines.append(f"  {key} = {default}    ({tp})")
        lines.extend(textwrap.wrap(doc, width=width, initial_indent="      ", subsequent_indent="      "))
    for reg in REGISTRIES:
        if reg is not ABLATION_METHODS:  # a study's method, not a config field: listed by ``mathrl ablate --help``
            lines.extend(["", *registry_help(reg, width)])
    return "\n".join(lines)


def _facts(reg: Registry[Any], name: str) -> str:
    entry = reg.get(name)
    if reg is ESTIMATORS:
        facts = [f"{entry.level} level", f"rollout.n >= {entry.min_group}"]
        if entry.needs_critic:
            facts.append("critic")
        if entry.params:
            facts.append("reads " + ", ".join(f"algo.{p}" for p in entry.params))
        return f"    ({'; '.join(facts)})"
    if reg is REWARDS:
        return f"    (params: weight{''.join(', ' + p for p in entry.params)})"
    return ""


def registry_help(reg: Registry[Any], width: int = 100) -> list[str]:
    """The lines that list ``reg``'s entries for ``--help``: a title naming the kind, where a user names an entry
    and where the entries are registered, then each name (with its facts: an estimator's level, group size,
    critic and ``algo.*`` parameters; a reward term's parameters) and its doc line."""
    homes = ", ".join(h.replace(".", "/") + ".py" for h in reg.homes)
    where = f"{reg.key}; " if reg.key else ""
    lines = [f"{reg.plural[0].upper()}{reg.plural[1:]} ({where}registered in {homes}):"]
    for name in reg.names():
        lines.append(f"  {name}{_facts(reg, name)}")
        lines.extend(textwrap.wrap(reg.doc(name), width=width, initial_indent="      ", subsequent_indent="      "))
    return lines
