"""Loading and validating the configuration tree (:mod:`mathrl.config.schema`).

Sources, applied in order: the dataclass defaults, a YAML recipe (``configs/*.yaml``), then
``key.sub=value`` overrides from the command line. Unknown keys, wrong types and out-of-range values
raise :class:`ConfigError` whose one-line message names the key, the value, where it came from (file
and line, or the command line) and what is allowed. Validation happens before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from mathrl.config import rules
from mathrl.config.errors import ConfigError
from mathrl.config.schema import Config

__all__ = ["ConfigError", "load_config", "set_value", "validate", "dump_yaml", "field_type_name", "section_classes"]


# --------------------------------------------------------------------------- typing helpers


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def section_classes() -> dict[str, type]:
    """Section name (``algo``) -> its dataclass (:class:`~mathrl.config.schema.AlgoConfig`), in order."""
    return {name: tp for name, tp in _hints(Config).items()}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        args = typing.get_args(tp)
        return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = type(None) in typing.get_args(tp)
        return " or ".join(_type_name(a) for a in args) + (" or null" if optional else "")
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"a list of {_type_name(inner)}"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def field_type_name(tp: Any, meta: dict) -> str:
    """What a field allows, in words: its ``choices`` (read now, from their registry) or its type."""
    choices = meta.get("choices")
    if choices is not None:
        return "one of " + ", ".join(repr(c) for c in choices())
    return _type_name(tp)


class _Bad(Exception):
    pass


def _coerce(value: Any, tp: Any, from_cli: bool) -> Any:
    """Convert ``value`` to ``tp`` or raise :class:`_Bad`. CLI strings are parsed leniently by type."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (from_cli and isinstance(value, str) and value.lower() in ("null", "none", "~")):
            if type(None) in args:
                return None
            raise _Bad
        inner = [a for a in args if a is not type(None)]
        for a in inner:
            try:
                return _coerce(value, a, from_cli)
            except _Bad:
                continue
        raise _Bad
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        raise _Bad
    if origin is list:
        (inner,) = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = yaml.safe_load(text)
                except yaml.YAMLError:
                    raise _Bad from None
            else:
                value = [v for v in (p.strip() for p in text.split(",")) if v] if text else []
        if not isinstance(value, list):
            raise _Bad
        return [_coerce(v, inner, from_cli) for v in value]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                raise _Bad from None
        if not isinstance(value, dict):
            raise _Bad
        if typing.get_origin(val_tp) is dict:  # an empty entry (`format:` in YAML) is an empty mapping
            value = {k: ({} if v is None else v) for k, v in value.items()}
        return {_coerce(k, key_tp, False): _coerce(v, val_tp, False) for k, v in value.items()}
    if tp is Any:  # a command-line value is read as YAML (model.lora.r=8 is the number 8)
        if from_cli and isinstance(value, str):
            try:
                return yaml.safe_load(value)
            except yaml.YAMLError:
                raise _Bad from None
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli and isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise _Bad
    if tp is int:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, int):
            return value
        if isinstance(value, str) and from_cli:
            try:
                return int(value.replace("_", ""))
            except ValueError:
                raise _Bad from None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Bad
    if tp is float:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, (int, float)):
            out = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-6" as a string; accept numeric strings
            try:
                out = float(value)
            except ValueError:
                raise _Bad from None
        else:
            raise _Bad
        if not math.isfinite(out):  # inf passes every bound and then breaks the run (issue 38 point 7)
            raise _Bad
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        if from_cli:
            return str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _Bad
    raise _Bad


def _check_bounds(key: str, value: Any, meta: dict, where: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = [("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
              ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")]
    for name, ok, sym in checks:
        bound = meta.get(name)
        if bound is not None and not ok(value, bound):
            parts = [f"{s} {meta[n]}" for n, _, s in checks if meta.get(n) is not None]
            raise ConfigError(f"{key} = {value!r}{where}: out of range; allowed: {' and '.join(parts)}")


def _where(origin: str | None) -> str:
    return f" ({origin})" if origin else ""


def _suggest(name: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return f"did you mean '{prefix}{close[0]}'? " if close else ""


def _check_field(key: str, value: Any, meta: dict, where: str) -> None:
    """Run the field's ``check`` (see :func:`mathrl.config.schema.option`); its problem becomes a one-line
    :class:`ConfigError` naming the key (and the offending sub-key)."""
    check = meta.get("check")
    if check is None:
        return
    try:
        check(value)
    except ValueError as exc:
        sub = getattr(exc, "key", None)
        named = key if not sub or key.endswith("." + sub) else f"{key}.{sub}"
        raise ConfigError(f"{named}{where}: {exc}") from None


def _dict_types(tp: Any) -> tuple[Any, Any] | None:
    """``(key type, value type)`` of a ``dict[...]`` / ``Optional[dict[...]]`` field type, else ``None``."""
    if typing.get_origin(tp) in (typing.Union, getattr(types, "UnionType", typing.Union)):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else tp
    if typing.get_origin(tp) is dict:
        return typing.get_args(tp)  # type: ignore[return-value]
    return None


def set_value(cfg: Config, key: str, value: Any, *, origin: str | None = None, from_cli: bool = False) -> None:
    """Set ``key`` (dotted, e.g. ``algo.kl_coef``) on ``cfg`` after type and range checks.

    A mapping field also takes one entry at a time: ``data.fields.question=problem`` sets the key
    ``question`` of ``data.fields`` and keeps its other entries."""
    where = _where(origin)
    parts = key.split(".")
    sections = section_classes()
    if parts[0] not in sections:
        raise ConfigError(f"unknown key '{key}'{where}; {_suggest(parts[0], list(sections))}"
                          f"sections: {', '.join(sections)}")
    section_cls = sections[parts[0]]
    hints = _hints(section_cls)
    entry = None
    if len(parts) == 3 and parts[1] in hints and _dict_types(hints[parts[1]]) is not None:
        entry = parts[2]  # section.field.key: one entry of a mapping field (data.fields.question=problem)
    elif len(parts) != 2:
        raise ConfigError(f"key '{key}'{where} must have the form section.field, e.g. algo.kl_coef")
    section_name, name = parts[0], parts[1]
    if name not in hints:
        raise ConfigError(f"unknown key '{key}'{where}; {_suggest(name, list(hints), section_name + '.')}"
                          f"fields of '{section_name}': {', '.join(hints)}")
    fld = {f.name: f for f in dataclasses.fields(section_cls)}[name]
    meta = dict(fld.metadata)
    if entry is not None:
        _, val_tp = _dict_types(hints[name])  # type: ignore[misc]
        try:
            item = _coerce(value, val_tp, from_cli)
        except _Bad:
            raise ConfigError(f"{key} = {value!r}{where}: wrong type or value; allowed: "
                              f"{field_type_name(val_tp, {})}") from None
        current = getattr(getattr(cfg, section_name), name)
        value, from_cli = {**(current or {}), entry: item}, False
    try:
        coerced = _coerce(value, hints[name], from_cli)
        choices = meta.get("choices")
        if choices is not None and coerced not in choices():
            raise _Bad
    except _Bad:
        raise ConfigError(f"{key} = {value!r}{where}: wrong type or value; allowed: "
                          f"{field_type_name(hints[name], meta)}") from None
    _check_field(key, coerced, meta, where)
    _check_bounds(key, coerced, meta, where)
    if isinstance(coerced, list):
        for item in coerced:
            _check_bounds(key, item, dict(fld.metadata), where)
    setattr(getattr(cfg, section_name), name, coerced)


# --------------------------------------------------------------------------- YAML with line numbers


def flatten_yaml(path: Path) -> list[tuple[str, Any, int]]:
    """Read a YAML recipe into (dotted key, value, line) triples, keeping line numbers for errors."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, ...)")
    out: list[tuple[str, Any, int]] = []
    seen: dict[str, int] = {}

    def once(key: str, line: int) -> None:  # YAML keeps the last of two equal keys without a word
        if key in seen:
            raise ConfigError(f"{path}:{line}: '{key}' appears twice (first at line {seen[key]}); keep one of them")
        seen[key] = line

    for knode, vnode in root.value:
        section = knode.value
        line = knode.start_mark.line + 1
        once(section, line)
        if isinstance(vnode, yaml.MappingNode):
            for fk, fv in vnode.value:
                key, fline = f"{section}.{fk.value}", fk.start_mark.line + 1
                once(key, fline)
                try:
                    value = yaml.safe_load(yaml.serialize(fv))
                except yaml.YAMLError as exc:  # a tag (!!python/object/..., !foo): nothing is constructed
                    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
                    raise ConfigError(f"{path}:{fline}: {key}: {what}; a recipe holds plain values only (numbers, "
                                      "strings, lists, mappings), no YAML tags") from None
                out.append((key, value, fline))
        elif isinstance(vnode, yaml.ScalarNode) and vnode.value in ("", "~", "null"):
            continue
        else:
            raise ConfigError(f"{path}:{line}: section '{section}' must be a mapping of fields")
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and ``key=value`` overrides."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        for key, value, line in flatten_yaml(path):
            set_value(cfg, key, value, origin=f"{path}:{line}")
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} (command line) must look like key.sub=value, "
                              "e.g. algo.kl_coef=0.04")
        key, value = item.split("=", 1)
        set_value(cfg, key.strip(), value, origin="command line", from_cli=True)
    validate(cfg)
    return cfg


def _field_meta(section: str, name: str) -> dict:
    return dict({f.name: f for f in dataclasses.fields(section_classes()[section])}[name].metadata)


def validate(cfg: Config) -> None:
    """The checks that need more than one field at a time: ``reward.terms`` against its registry, then every
    cross-field rule of :func:`mathrl.config.rules.refuse`."""
    _check_field("reward.terms", cfg.reward.terms, _field_meta("reward", "terms"), "")
    rules.refuse(cfg)


def dump_yaml(cfg: Config) -> str:
    """The configuration as YAML (a run folder's ``config.yaml``: :func:`mathrl.train.setup.record_config`)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
