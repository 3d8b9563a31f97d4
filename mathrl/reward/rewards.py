"""Reward terms: grades (+ response info) -> scalar rewards (docs/architecture.md, the reward stage).

A term is a pure function ``term(ctx, **params) -> list[float]`` of one :class:`RewardContext`
(responses, grades, truncation flags, lengths, the length limit, gold answers), registered by name with
:func:`register_reward` in :data:`mathrl.registry.REWARDS`. :func:`compute_rewards` sums the weighted terms of a mapping
``{name: {"weight": w, **params}}``; the config's ``reward.terms`` is such a mapping, checked against this
registry when the config is loaded (:func:`check_reward_terms`), and :func:`reward_terms` turns a config
into it (including the shorthands ``reward.function``, ``reward.format_bonus`` and
``reward.overlong_penalty`` / ``reward.overlong_buffer``). Adding a term means adding one decorated
function here; ``mathrl train --help`` lists the registered ones.

A custom task (a reward that is not the verifier's grade) registers its reward the same way, with
``needs_grades=False``, and names it in ``reward.terms``: when no configured term needs grades the loop
does not run the verifier, and ``ctx.grades`` is ``None``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mathrl.latex import find_boxes
from mathrl.registry import FIELD_CHECKS, REWARDS
from mathrl.reward.grader import Grade

__all__ = ["REWARDS", "RewardContext", "RewardTerm", "RewardTermError", "register_reward", "get_reward",
           "reward_term_params", "check_reward_terms", "reward_terms", "needs_grades", "correctness_reward",
           "format_reward", "length_penalty", "compute_rewards"]


@dataclass(frozen=True)
class RewardContext:
    """Everything a reward term may read about a batch of ``N`` responses.

    ``truncated[i]``: response ``i`` was cut at the length limit; ``lengths[i]``: its length in tokens;
    ``max_length``: the limit (``rollout.max_tokens``); ``golds[i]``: its gold answer. Fields a term does
    not need may be ``None``; ``grades`` is ``None`` when no configured term needs the verifier."""

    responses: Sequence[str]
    grades: Sequence[Grade] | None
    truncated: Sequence[bool] | None = None
    lengths: Sequence[int] | None = None
    max_length: int | None = None
    golds: Sequence[str] | None = None


class RewardTermError(ValueError):
    """A bad ``reward.terms`` entry; ``key`` is the offending sub-key (``"format"``, ``"format.bonsu"``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class RewardTerm:
    """A registered term: ``term(ctx, **params) -> list[float]``. ``needs_grades``: it reads
    ``ctx.grades`` (so the verifier must run)."""

    def __init__(self, name: str, fn: Callable[..., list[float]], *, needs_grades: bool = True) -> None:
        self.name, self.fn, self.needs_grades = name, fn, needs_grades
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.doc = ((fn.__doc__ or "").strip().splitlines() or [""])[0].strip()
        sig = inspect.signature(fn)
        kinds = {p.kind for p in sig.parameters.values()}
        self.any_params = inspect.Parameter.VAR_KEYWORD in kinds
        self.params: tuple[str, ...] = tuple(
            p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY)
        try:
            self.hints: dict[str, Any] = typing.get_type_hints(fn)
        except Exception:  # unresolvable annotations: the values are not type-checked
            self.hints = {}

    def __call__(self, ctx: RewardContext, **params: Any) -> list[float]:
        if not isinstance(ctx, RewardContext):
            raise TypeError(f"reward term {self.name!r}: call it as term(ctx: RewardContext, **params), "
                            f"got {type(ctx).__name__}")
        if self.needs_grades and ctx.grades is None:
            raise ValueError(f"reward term {self.name!r} needs the verifier's grades (ctx.grades is None)")
        return self.fn(ctx, **params)

    def __repr__(self) -> str:
        return f"<reward term {self.name!r}>"


def register_reward(name: str, *, needs_grades: bool = True) -> Callable[[Callable[..., list[float]]], RewardTerm]:
    """Register ``fn(ctx: RewardContext, *, <params>) -> list[float]`` as the reward term ``name``.
    Its keyword-only parameters are the ones ``reward.terms.<name>`` accepts (besides ``weight``).
    ``needs_grades=False``: the term scores without the verifier (a custom task's own reward)."""
    if name == "weight":
        raise ValueError("'weight' is reserved")

    def deco(fn: Callable[..., list[float]]) -> RewardTerm:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} already registered")
        return REWARDS.register(name, RewardTerm(name, fn, needs_grades=needs_grades))

    return deco


def get_reward(name: str) -> RewardTerm:
    """The registered term ``name``; an unknown name raises :class:`~mathrl.registry.UnknownNameError` (a
    ``KeyError``) naming the allowed ones."""
    return REWARDS.get(name)


def reward_term_params(name: str) -> tuple[str, ...]:
    """The parameter names reward term ``name`` accepts (besides ``weight``)."""
    return get_reward(name).params


@FIELD_CHECKS.register("reward.terms")
def check_reward_terms(terms: Any) -> None:
    """Check a ``reward.terms`` mapping against the registry: known term names, known parameters and a
    numeric weight. Raises :class:`RewardTermError` (a ``ValueError``) with a one-line message whose
    ``key`` names the offending entry."""
    if not isinstance(terms, Mapping):
        raise RewardTermError("", f"must be a mapping term -> {{weight, params}}, got {type(terms).__name__}")
    for name, params in terms.items():
        if name not in REWARDS:
            raise RewardTermError(str(name), f"unknown reward term; allowed: {', '.join(REWARDS)}")
        if params is None:
            continue
        if not isinstance(params, Mapping):
            raise RewardTermError(str(name), f"must be a mapping of weight and parameters, got {params!r}")
        term = REWARDS[name]
        for key, value in params.items():
            if key == "weight":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise RewardTermError(f"{name}.weight", f"weight {value!r} is not a number")
            elif not term.any_params and key not in term.params:
                raise RewardTermError(f"{name}.{key}", f"unknown parameter of reward term '{name}'; allowed: "
                                      f"{', '.join(('weight', *term.params))}")
            elif not _fits(value, term.hints.get(key, Any)):
                raise RewardTermError(f"{name}.{key}", f"{value!r} is not {_type_words(term.hints[key])}")


def _fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` matches a term parameter's annotation (float, int, bool, str, X | None; others
    are not checked)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp in (bool, str):
        return isinstance(value, tp)
    return True


def _type_words(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_words(a) for a in typing.get_args(tp))
    return {float: "a number", int: "an integer", bool: "true/false", str: "a string",
            type(None): "null"}.get(tp, str(tp))


def reward_terms(cfg: Any) -> dict[str, dict]:
    """The reward terms of a config: ``cfg.reward.terms`` when set, else the mapping built from the
    shorthands: correctness always; format with ``bonus = reward.format_bonus`` when
    ``reward.function = correctness_format``; length with ``coef = reward.overlong_penalty``,
    ``buffer = reward.overlong_buffer`` when the penalty is > 0 (DAPO's soft overlong punishment)."""
    rc = cfg.reward
    if rc.terms is not None:
        return {name: dict(params or {}) for name, params in rc.terms.items()}
    terms: dict[str, dict] = {"correctness": {}}
    if rc.function == "correctness_format":
        terms["format"] = {"bonus": rc.format_bonus}
    if rc.overlong_penalty > 0:
        terms["length"] = {"coef": rc.overlong_penalty, "buffer": rc.overlong_buffer}
    return terms


# --------------------------------------------------------------------------- the terms


@register_reward("correctness")
def correctness_reward(ctx: RewardContext, *, correct: float = 1.0, wrong: float = 0.0) -> list[float]:
    """r_i = correct if grade_i.correct else wrong (defaults 1 / 0; timeouts and errors count as wrong).

    The verifiable reward of DeepSeekMath/GRPO (Shao et al., 2024)."""
    return [correct if g.correct else wrong for g in ctx.grades]


_BOX_AT_END = 600  # a box counts as the final answer when it starts in the last 600 chars


@register_reward("format")
def format_reward(ctx: RewardContext, *, bonus: float = 0.1) -> list[float]:
    """r_i = bonus when response i ends with a complete \\boxed{} answer and was not cut at the limit.

    The box must start within the last 600 characters; otherwise (or when truncated) r_i = 0."""
    truncated = ctx.truncated
    out = []
    for k, resp in enumerate(ctx.responses):
        cut = bool(truncated[k]) if truncated is not None else False
        boxes = find_boxes(resp[-(_BOX_AT_END + 4000):]) if isinstance(resp, str) else []
        tail = resp[-(_BOX_AT_END + 4000):] if isinstance(resp, str) else ""
        ok = bool(boxes) and boxes[-1][0] >= len(tail) - _BOX_AT_END and not cut
        out.append(bonus if ok else 0.0)
    return out


@register_reward("length")
def length_penalty(ctx: RewardContext, *, coef: float = 0.5, buffer: int | None = None) -> list[float]:
    """Soft over-length penalty (DAPO, Yu et al., 2025, Eq. 13), up to -coef near the length limit.

    With L = ctx.max_length and buffer B (default L // 4), for a response of length n:
    r = 0 if n <= L - B;  r = -coef * (n - (L - B)) / B  if L - B < n <= L;  r = -coef if n > L
    or the response was truncated.
    """
    max_length, lengths, truncated = ctx.max_length, ctx.lengths, ctx.truncated
    if lengths is None or max_length is None:
        raise ValueError("the length reward needs the response lengths and max_length")
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    b = buffer if buffer is not None else max(1, max_length // 4)
    if not 0 < b <= max_length:
        raise ValueError(f"buffer must be in (0, max_length], got {b}")
    out = []
    for k, n in enumerate(lengths):
        cut = bool(truncated[k]) if truncated is not None else False
        if cut or n > max_length:
            out.append(-coef)
        elif n <= max_length - b:
            out.append(0.0)
        else:
            out.append(-coef * (n - (max_length - b)) / b)
    return out


# --------------------------------------------------------------------------- composition


def needs_grades(terms: Mapping[str, Mapping | None] | Sequence[str]) -> bool:
    """Whether any of ``terms`` reads the verifier's grades (else the loop skips the verifier)."""
    return any(get_reward(name).needs_grades for name in terms)


def compute_rewards(terms: Mapping[str, Mapping | None] | Sequence[str], ctx: RewardContext) -> list[float]:
    """Weighted sum of the named reward terms: ``sum_k weight_k * term_k(ctx, **params_k)``.

    ``terms`` maps name -> ``{"weight": w (default 1.0), **params}`` (or is a list of names with default
    parameters). Example: ``compute_rewards({"correctness": {}, "format": {"bonus": 0.1}}, ctx)``.
    """
    if not isinstance(ctx, RewardContext):
        raise TypeError(f"compute_rewards(terms, ctx): ctx must be a RewardContext, got {type(ctx).__name__}")
    if ctx.grades is not None and len(ctx.responses) != len(ctx.grades):
        raise ValueError(f"{len(ctx.grades)} grades but {len(ctx.responses)} responses")
    if not isinstance(terms, Mapping):
        terms = {name: {} for name in terms}
    total = [0.0] * len(ctx.responses)
    for name, params in terms.items():
        kw = dict(params or {})
        weight = kw.pop("weight", 1.0)
        vals = get_reward(name)(ctx, **kw)
        if len(vals) != len(total):
            raise ValueError(f"reward term {name!r} returned {len(vals)} values for {len(total)} responses")
        total = [a + weight * b for a, b in zip(total, vals)]
    return total
