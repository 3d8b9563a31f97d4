"""Every registry of named parts, one type: :class:`Registry` (a leaf module: it imports nothing of mathrl but
:mod:`mathrl.errors`).

A registry maps a config name (``algo.advantage``, ``algo.policy_loss``, ``reward.terms``, ...) to the part
it names, in registration order, with optional metadata per entry. The entries are defined next to their
code, in the registry's *home* modules, with :meth:`Registry.register`; the registry objects themselves are
here, so that :mod:`mathrl.config` (a leaf too) can list and check names without importing upward: reading a
registry (:meth:`~Registry.names`, :meth:`~Registry.get`, ``in``, iteration) imports its homes first, lazily,
by name. The schema's ``choices=``, ``mathrl train --help``, the ablation driver and the stages all read
these objects, so a name list is written once: where the part is registered.

=======================  ======================  ==============================================
registry                 config                  home (where the entries are registered)
=======================  ======================  ==============================================
:data:`ESTIMATORS`       ``algo.advantage``      :mod:`mathrl.algo.advantages`
:data:`POLICY_LOSSES`    ``algo.policy_loss``    :mod:`mathrl.algo.losses`
:data:`LOSS_AGG_MODES`   ``algo.loss_agg``       :mod:`mathrl.algo.losses`
:data:`KL_ESTIMATORS`    ``algo.kl_estimator``   :mod:`mathrl.algo.kl`
:data:`REWARDS`          ``reward.terms``        :mod:`mathrl.reward.rewards`
:data:`SOURCES`          ``data.source``         :mod:`mathrl.data.sources`
:data:`TEMPLATES`        ``data.template``       :mod:`mathrl.data.templates`
:data:`ROLLOUT_BACKENDS` ``rollout.backend``     :mod:`mathrl.rollout.factory`
:data:`ABLATION_METHODS` a study's ``method``    :mod:`mathrl.ablate.methods`
:data:`FIELD_CHECKS`     ``option(check=...)``   the modules that own a structured field's rules
=======================  ======================  ==============================================
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from mathrl.errors import InputError

__all__ = ["Registry", "UnknownNameError", "ESTIMATORS", "POLICY_LOSSES", "LOSS_AGG_MODES", "KL_ESTIMATORS",
           "REWARDS", "SOURCES", "TEMPLATES", "ROLLOUT_BACKENDS", "ABLATION_METHODS", "FIELD_CHECKS",
           "REGISTRIES"]

T = TypeVar("T")
_MISSING: Any = object()


class UnknownNameError(InputError, KeyError, ValueError):
    """A name that is not registered. The message names the kind, the bad value, the allowed names and the
    closest one; it is a ``KeyError`` (a failed lookup) and a ``ValueError`` (a bad value) for callers that
    catch those."""

    def __init__(self, kind: str, name: Any, allowed: Sequence[str]) -> None:
        close = difflib.get_close_matches(str(name), list(allowed), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        super().__init__(f"unknown {kind} {name!r}; allowed: {', '.join(allowed)}{hint}")
        self.kind, self.name, self.allowed = kind, name, tuple(allowed)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Name -> entry of one kind (``kind``: "policy loss"), in registration order, with metadata per entry.

    ``home``: the module (or modules) that register the entries, imported on first read, so that a reader
    needs only this module. Registering never imports the home (the home is the one registering).
    ``plural``: the kind in the plural, for titles (default: ``kind + "s"``); ``key``: where a user names an
    entry (``algo.advantage``), for titles."""

    def __init__(self, kind: str, *, home: str | Sequence[str] = (), plural: str | None = None,
                 key: str | None = None) -> None:
        self.kind, self.key = kind, key
        self.plural = plural or f"{kind}s"
        self.homes: tuple[str, ...] = (home,) if isinstance(home, str) else tuple(home)
        self._entries: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        self._next = 0  # the homes before this index are imported

    def _load(self, name: str | None = None) -> None:
        """Import the homes not imported yet, in order; with ``name``, stop at the first home that has
        registered it (so a lookup imports no more than it needs)."""
        while self._next < len(self.homes):
            if name is not None and name in self._entries:
                return
            home = self.homes[self._next]
            self._next += 1  # first: a home that reads its own registry while importing finds it as is
            try:
                importlib.import_module(home)
            except BaseException:
                self._next -= 1
                raise

    def register(self, name: str, obj: T = _MISSING, /, **meta: Any) -> Any:
        """Register ``obj`` as ``name`` (returns ``obj``), or, without ``obj``, return a decorator that
        registers the decorated object. ``meta``: facts about the entry (``doc``: one line for ``--help``).
        A name registered twice is refused (``ValueError``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            self._meta[name] = dict(meta)
            return entry

        return add if obj is _MISSING else add(obj)

    def get(self, name: str, default: Any = _MISSING) -> T:
        """The entry ``name``; an unknown name raises :class:`UnknownNameError` (or returns ``default``
        when one is given)."""
        self._load(name)
        if name in self._entries:
            return self._entries[name]
        if default is not _MISSING:
            return default
        raise UnknownNameError(self.kind, name, self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def meta(self, name: str) -> dict[str, Any]:
        """The metadata ``name`` was registered with (a copy)."""
        self.get(name)
        return dict(self._meta[name])

    def doc(self, name: str) -> str:
        """One line about ``name``: its ``doc`` metadata, the entry's ``doc`` attribute, or the first line of
        the entry's docstring."""
        entry = self.get(name)
        text = self._meta[name].get("doc") or getattr(entry, "doc", None)
        if not text and callable(entry) and getattr(entry, "__doc__", None):
            text = entry.__doc__
        return ((text or "").strip().splitlines() or [""])[0].strip()

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        self._load()
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._entries.items())

    def values(self) -> list[T]:
        self._load()
        return list(self._entries.values())

    def keys(self) -> tuple[str, ...]:
        return self.names()

    def __setitem__(self, name: str, entry: T) -> None:
        """Put ``entry`` under ``name``, replacing one registered there (for a test that stands in for an
        entry, e.g. ``monkeypatch.setitem``); code registers with :meth:`register`."""
        self._load()
        self._meta.setdefault(name, {})
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        self.get(name)
        del self._entries[name], self._meta[name]

    def pop(self, name: str, default: Any = _MISSING) -> T:
        """Remove ``name`` and return its entry (a test removing what it registered); unknown names as
        :meth:`get`."""
        entry = self.get(name, default)
        if name in self._entries:
            del self._entries[name], self._meta[name]
        return entry

    def __contains__(self, name: object) -> bool:
        self._load(name if isinstance(name, str) else None)
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        homes = f", home={self.homes[0]!r}" if len(self.homes) == 1 else f", home={self.homes!r}"
        return f"Registry({self.kind!r}{homes if self.homes else ''})"


# --------------------------------------------------------------------------- the registries

ESTIMATORS: Registry[Any] = Registry("advantage estimator", key="algo.advantage", home="mathrl.algo.advantages")
"""``algo.advantage`` -> :class:`mathrl.algo.advantages.EstimatorSpec` (see ``register_estimator`` there)."""

POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", key="algo.policy_loss",
                                                       home="mathrl.algo.losses", plural="policy losses")
"""``algo.policy_loss`` -> loss function (all share :func:`mathrl.algo.losses.policy_loss`'s signature)."""

LOSS_AGG_MODES: Registry[Callable[..., Any]] = Registry("loss aggregation mode", key="algo.loss_agg",
                                                        home="mathrl.algo.losses")
"""``algo.loss_agg`` -> reducer of a per-token loss matrix (:func:`mathrl.algo.losses.agg_loss`)."""

KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("KL estimator", key="algo.kl_estimator", home="mathrl.algo.kl")
"""``algo.kl_estimator`` -> ``fn(logp, ref_logp) -> per-token KL`` (:func:`mathrl.algo.kl.estimate`)."""

REWARDS: Registry[Any] = Registry("reward term", key="reward.terms", home="mathrl.reward.rewards")
"""``reward.terms`` keys -> :class:`mathrl.reward.rewards.RewardTerm` (see ``register_reward`` there)."""

SOURCES: Registry[Any] = Registry("data source", key="data.source", home="mathrl.data.sources")
"""``data.source`` -> :class:`mathrl.data.sources.SourceSpec`."""

TEMPLATES: Registry[Any] = Registry("prompt template", key="data.template", home="mathrl.data.templates")
"""``data.template`` -> :class:`mathrl.data.templates.PromptTemplate`."""

ROLLOUT_BACKENDS: Registry[Callable[..., Any]] = Registry("rollout backend", key="rollout.backend",
                                                          home="mathrl.rollout.factory")
"""``rollout.backend`` (besides ``auto``) -> ``build(model_path, **options) -> RolloutEngine``."""

ABLATION_METHODS: Registry[Callable[..., Any]] = Registry("ablation method", key="a study run's method",
                                                          home="mathrl.ablate.methods")
"""A study run's ``method`` -> ``make(rft_opts) -> Method`` of the trainer; metadata ``presets`` (the config
overrides the method implies) and ``sft`` (it fine-tunes on filtered samples)."""

FIELD_CHECKS: Registry[Callable[[Any], None]] = Registry(
    "config field check", home=("mathrl.reward.rewards", "mathrl.data.sources", "mathrl.models.lora"))
"""Config key -> ``check(value)`` raising ``ValueError`` for a bad value of a structured field (``model.lora``,
``reward.terms``, ``data.fields``), registered by the module that owns the field's rules and read by the
schema's ``option(check=...)``."""

REGISTRIES: tuple[Registry[Any], ...] = (ESTIMATORS, POLICY_LOSSES, LOSS_AGG_MODES, KL_ESTIMATORS, REWARDS, SOURCES,
                                         TEMPLATES, ROLLOUT_BACKENDS, ABLATION_METHODS)
"""The registries of named parts (:data:`FIELD_CHECKS` aside), for ``--help`` and the tests."""
