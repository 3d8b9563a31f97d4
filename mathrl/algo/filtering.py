"""Dynamic sampling (DAPO) and prompt filtering by the model's own pass rate: pure functions and a
small state object, no engine inside.

Why: with group-relative advantages a group whose G rewards are all equal (every answer right, or every
answer wrong) has advantage 0 everywhere; it adds no policy gradient but still counts in the token
normaliser, so it dilutes the step. For a weak model on real data most groups are all-wrong. DAPO
(Yu et al. 2025, sec. 3.2) keeps sampling until the batch has B groups with non-zero reward variance.

* :func:`informative_groups` marks the groups that carry a signal;
* :func:`select_informative` chooses which groups of the rounds sampled so far form the step's batch
  (first come, first kept: round 0's informative groups, then round 1's, ...), and fills a shortfall
  after the last allowed round with the earliest uninformative groups;
* :class:`PassRateFilter` remembers each prompt's pass rate the last ``K`` times it was sampled and
  skips prompts that were solved by every sample, or by none, each of those ``K`` times;
  :func:`draw_prompts` walks the data stream from a position and collects the prompts to sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["informative_groups", "select_informative", "Selection", "PassRateFilter", "draw_prompts",
           "group_pass_rates"]


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """``[B]`` bool: True for each group (``group_size`` consecutive scores) whose rewards are not all equal.

    Exact comparison with the group's first reward (no tolerance: rewards that differ by any amount give
    a non-zero group-relative advantage)."""
    if group_size < 1 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not form groups of {group_size}")
    g = scores.detach().reshape(-1, group_size)
    return (g != g[:, :1]).any(dim=1)


@dataclass
class Selection:
    """Which groups form the step: ``groups`` are (round, group index in that round) pairs in batch order."""

    groups: list[tuple[int, int]]
    informative: int          # how many of them are informative
    filled: int               # uninformative groups added because the rounds ran out
    surplus: int              # informative groups sampled but not used (more than needed)


def select_informative(masks: Sequence[Tensor], need: int, *, fill: bool) -> Selection:
    """Choose ``need`` groups from the rounds' informative masks (``masks[k]``: round k's ``[B_k]`` bool).

    Informative groups in sampling order (round, then group) come first. With ``fill`` (the last round has
    been sampled) a shortfall is made up with uninformative groups, also in sampling order; without it
    the selection may hold fewer than ``need`` groups (the caller samples another round)."""
    informative = [(k, i) for k, m in enumerate(masks) for i in range(m.numel()) if bool(m[i])]
    chosen = informative[:need]
    filled = 0
    if fill and len(chosen) < need:
        rest = [(k, i) for k, m in enumerate(masks) for i in range(m.numel()) if not bool(m[i])]
        extra = rest[: need - len(chosen)]
        filled = len(extra)
        chosen = chosen + extra
    n_inf = min(len(informative), need)
    return Selection(groups=chosen, informative=n_inf, filled=filled, surplus=len(informative) - n_inf)


@dataclass
class PassRateFilter:
    """The pass rates of the last ``window`` times each prompt was sampled; a prompt whose last ``window``
    pass rates are all 1 (always solved) or all 0 (never solved) is skipped. ``window = 0`` = off.

    Keyed by the prompt's index in the training set; the state (``state_dict``) goes into the checkpoint
    so a resumed run skips the same prompts. Every rank holds the same filter (the caller records the
    pass rates of all ranks' prompts)."""

    window: int = 0
    history: dict[int, list[float]] = field(default_factory=dict)

    def skip(self, index: int) -> bool:
        if self.window <= 0:
            return False
        h = self.history.get(index, [])
        return len(h) >= self.window and (all(x >= 1.0 for x in h) or all(x <= 0.0 for x in h))

    def record(self, index: int, pass_rate: float) -> None:
        if self.window <= 0:
            return
        h = self.history.setdefault(index, [])
        h.append(float(pass_rate))
        del h[: max(0, len(h) - self.window)]

    def skipped(self) -> int:
        """How many prompts would be skipped now."""
        return sum(self.skip(i) for i in self.history)

    def state_dict(self) -> dict:
        return {"window": self.window, "history": {str(k): v for k, v in self.history.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.history = {int(k): [float(x) for x in v] for k, v in d.get("history", {}).items()}


def draw_prompts(index_at: Callable[[int], int], start: int, count: int, skip: Callable[[int], bool],
                 limit: int) -> tuple[list[int], int]:
    """Walk the data stream from position ``start`` (``index_at(pos)`` = the problem index at ``pos``) and
    collect ``count`` problem indices that are not skipped; returns them and the next position.

    At most ``limit`` positions are walked past skipped prompts (one pass over the data): when the filter
    would skip everything, the remaining places are taken by the next positions regardless of the filter,
    so a step never waits forever."""
    out: list[int] = []
    pos = start
    walked_skips = 0
    while len(out) < count:
        idx = index_at(pos)
        pos += 1
        if walked_skips < limit and skip(idx):
            walked_skips += 1
            continue
        out.append(idx)
    return out, pos


def group_pass_rates(correct: Sequence[bool], group_size: int) -> list[float]:
    """The fraction of correct responses in each group."""
    t = torch.tensor([bool(c) for c in correct], dtype=torch.float64).reshape(-1, group_size)
    return [float(x) for x in t.mean(1)]
