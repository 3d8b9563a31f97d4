"""Dynamic sampling (DAPO) and prompt filtering by the model's own pass rate: pure functions and a
small state object, no engine inside.

Why: with group-relative advantages a group whose G rewards are all equal (every answer right, or every
answer wrong) has advantage 0 everywhere; it adds no policy gradient but still counts in the token
normaliser, so it dilutes the step. For a weak model on real data most groups are all-wrong. DAPO
(Yu et al. 2025, sec. 3.2) keeps sampling until the batch has B groups with non-zero reward variance.

* :func:`informative_groups` marks the groups that carry a signal;
* :func:`select_pooled` chooses which groups of the rounds sampled so far, on every rank, form the step's
  batch (first come, first kept: round 0's informative groups, then round 1's, ...; a shortfall after the
  last allowed round is filled with the earliest uninformative groups) and which rank trains on each, so that
  the informative groups are pooled over the whole batch, as in DAPO and verl;
* :class:`PassRateFilter` remembers each prompt's pass rate the last ``K`` times it was sampled and
  skips prompts that were solved by every sample, or by none, each of those ``K`` times;
  :func:`draw_prompts` walks the data stream from a position and collects the prompts to sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["informative_groups", "select_pooled", "Selection", "Group", "PassRateFilter", "draw_prompts",
           "group_pass_rates"]


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """``[B]`` bool: True for each group (``group_size`` consecutive scores) whose rewards are not all equal.

    Exact comparison with the group's first reward (no tolerance: rewards that differ by any amount give
    a non-zero group-relative advantage)."""
    if group_size < 1 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not form groups of {group_size}")
    g = scores.detach().reshape(-1, group_size)
    return (g != g[:, :1]).any(dim=1)


Group = tuple[int, int, int]
"""A sampled group: (rank that sampled it, sampling round, group index in that rank's round)."""


@dataclass
class Selection:
    """Which groups form the step, pooled over the ranks: ``assigned[r]`` are the groups rank ``r`` trains on,
    in batch order (each rank the same number); a group sampled by another rank moves to ``r``."""

    assigned: list[list[Group]]
    informative: int          # how many of the chosen groups are informative (all ranks)
    filled: int               # uninformative groups added because the rounds ran out
    surplus: int              # informative groups sampled but not used (more than the batch needs)

    @property
    def moved(self) -> list[Group]:
        """The chosen groups that another rank than the one that sampled them trains on."""
        return [g for r, gs in enumerate(self.assigned) for g in gs if g[0] != r]


def select_pooled(masks: Sequence[Sequence[Tensor]], per_rank: int) -> Selection:
    """Choose the step's ``per_rank * len(masks)`` groups from every rank's rounds (``masks[r][k]``: rank r's
    round-k ``[B_k]`` bool mask of informative groups, :func:`informative_groups`), pooling the informative
    groups over the whole batch as DAPO and verl do: the step trains on min(B, found) informative groups, and
    no rank pads with an uninformative group while another has an informative one to spare.

    Each rank keeps its own informative groups first (in sampling order: round, then group), up to
    ``per_rank``; a rank left short then receives the spare informative groups of the others (in sampling
    order: round, then rank, then group), lowest rank first; what is still missing once the rounds ran out is
    filled with the rank's own earliest uninformative groups. So groups move between ranks only where pooling
    needs it, and every rank trains on exactly ``per_rank`` groups. With one rank this is the per-rank rule:
    round 0's informative groups, then round 1's, ..., then the earliest uninformative ones."""
    world = len(masks)
    own = [[(r, k, i) for k, m in enumerate(masks[r]) for i in range(m.numel())] for r in range(world)]

    def useful(g: Group) -> bool:
        return bool(masks[g[0]][g[1]][g[2]])

    assigned: list[list[Group]] = [[g for g in own[r] if useful(g)][:per_rank] for r in range(world)]
    kept = {g for gs in assigned for g in gs}
    rounds = max((len(m) for m in masks), default=0)
    spare = [(r, k, i) for k in range(rounds) for r in range(world) if k < len(masks[r])
             for i in range(masks[r][k].numel()) if useful((r, k, i)) and (r, k, i) not in kept]
    surplus = len(spare)
    for r in range(world):
        take = max(0, per_rank - len(assigned[r]))
        assigned[r] += spare[:take]
        spare = spare[take:]
    surplus -= sum(len(gs) for gs in assigned) - len(kept)  # the spare groups that found a rank
    informative = sum(len(gs) for gs in assigned)
    for r in range(world):
        missing = per_rank - len(assigned[r])
        if missing:
            fill = [g for g in own[r] if not useful(g)][:missing]
            if len(fill) < missing:
                raise ValueError(f"select_pooled: rank {r} sampled {len(own[r])} groups, the step needs {per_rank}")
            assigned[r] += fill
    return Selection(assigned=assigned, informative=informative, filled=per_rank * world - informative,
                     surplus=surplus)


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
