"""Reward functions: grades (+ response info) -> scalar rewards (DESIGN.md, loop step 3).

Each function is pure: ``fn(grades, responses, *, truncated=None, lengths=None, max_length=None,
**params) -> list[float]``. Compose them with :func:`compute_rewards`, which sums the named
terms. Registry names: ``correctness``, ``format``, ``length``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mathrl.reward.extract import find_boxed
from mathrl.reward.grader import Grade

__all__ = ["REWARDS", "register_reward", "get_reward", "correctness_reward", "format_reward",
           "length_penalty", "compute_rewards"]

RewardFn = Callable[..., list[float]]
REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def deco(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} already registered")
        REWARDS[name] = fn
        return fn

    return deco


def get_reward(name: str) -> RewardFn:
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; allowed: {sorted(REWARDS)}")
    return REWARDS[name]


@register_reward("correctness")
def correctness_reward(grades: Sequence[Grade], responses: Sequence[str] | None = None, *,
                       correct: float = 1.0, wrong: float = 0.0, **_: object) -> list[float]:
    """r_i = ``correct`` if grade_i.correct else ``wrong`` (defaults 1 / 0; timeouts and errors
    count as wrong). The verifiable reward of DeepSeekMath/GRPO (Shao et al., 2024)."""
    return [correct if g.correct else wrong for g in grades]


_BOX_AT_END = 600  # a box counts as the final answer when it starts in the last 600 chars


@register_reward("format")
def format_reward(grades: Sequence[Grade], responses: Sequence[str], *, bonus: float = 0.1,
                  truncated: Sequence[bool] | None = None, **_: object) -> list[float]:
    """r_i = ``bonus`` when response i ends with a complete ``\\boxed{}`` final answer (a box
    starting within the last 600 characters) and was not cut at the length limit, else 0."""
    out = []
    for k, resp in enumerate(responses):
        cut = bool(truncated[k]) if truncated is not None else False
        boxes = find_boxed(resp[-(_BOX_AT_END + 4000):]) if isinstance(resp, str) else []
        tail = resp[-(_BOX_AT_END + 4000):] if isinstance(resp, str) else ""
        ok = bool(boxes) and boxes[-1][0] >= len(tail) - _BOX_AT_END and not cut
        out.append(bonus if ok else 0.0)
    return out


@register_reward("length")
def length_penalty(grades: Sequence[Grade], responses: Sequence[str] | None = None, *,
                   lengths: Sequence[int], max_length: int, coef: float = 0.5,
                   buffer: int | None = None, truncated: Sequence[bool] | None = None,
                   **_: object) -> list[float]:
    """Soft over-length penalty (DAPO, Yu et al., 2025, Eq. 13).

    With L = max_length and buffer B (default L // 4), for a response of length n:
    r = 0 if n <= L - B;  r = -coef * (n - (L - B)) / B  if L - B < n <= L;  r = -coef if n > L
    or the response was truncated.
    """
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


def compute_rewards(terms: dict[str, dict] | Sequence[str], grades: Sequence[Grade],
                    responses: Sequence[str], **info: object) -> list[float]:
    """Sum of the named reward terms. ``terms`` maps name -> keyword parameters (or is a list of
    names with default parameters); ``info`` (truncated, lengths, max_length) is passed to all.

    Example: ``compute_rewards({"correctness": {}, "format": {"bonus": 0.1}}, grades, texts)``.
    """
    if not isinstance(terms, dict):
        terms = {name: {} for name in terms}
    total = [0.0] * len(grades)
    if len(responses) != len(grades):
        raise ValueError(f"{len(grades)} grades but {len(responses)} responses")
    for name, params in terms.items():
        vals = get_reward(name)(grades, responses, **{**info, **(params or {})})
        total = [a + b for a, b in zip(total, vals)]
    return total
