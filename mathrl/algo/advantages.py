"""Advantage estimators and the masked statistics they share.

Every function here is pure: tensors and masks in, tensors out; no model, engine or
config object. Shapes: ``N`` responses, ``T`` response tokens; ``mask`` is a 0/1
float or bool ``[N, T]`` tensor marking real response tokens; ``group_index`` is a
``[N]`` integer tensor (equal values = responses to the same prompt).

Padding contract: values at positions where ``mask`` is 0 never change any output.
Token-level outputs are exactly 0 at padding positions.

Estimators (registered with :func:`register_estimator` in :data:`mathrl.registry.ESTIMATORS`, which maps
the config name to its :class:`EstimatorSpec`; config validation, ``mathrl train --help`` and the trainer
read it, so adding an estimator means adding one decorated function here):

=====================  ===========  ==========================================================
name                   level        source
=====================  ===========  ==========================================================
grpo                   sequence     DeepSeekMath, Shao et al. 2024 (arXiv:2402.03300)
dr_grpo                sequence     Dr. GRPO, Liu et al. 2025 (arXiv:2503.20783)
rloo                   sequence     RLOO, Ahmadian et al. 2024 (arXiv:2402.14740)
reinforce_pp           token        REINFORCE++, Hu 2025 (arXiv:2501.03262)
reinforce_pp_baseline  token        REINFORCE++-baseline (the same paper, later versions)
gae                    token        GAE, Schulman et al. 2016 (arXiv:1506.02438)
=====================  ===========  ==========================================================

Sequence-level estimators take ``(scores[N], group_index[N])`` and return ``[N]``;
turn them into per-token advantages with :func:`broadcast_to_tokens`. Token-level
estimators take per-token rewards ``[N, T]`` (build them with
:func:`token_level_rewards`, which also folds a KL penalty into the reward the PPO way).
The trainer calls them all through :func:`estimate_advantages`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar, Union

import torch
from torch import Tensor

from mathrl.algo.process import StepRewards, process_advantages
from mathrl.registry import ESTIMATORS, UnknownNameError

__all__ = [
    "ESTIMATORS",
    "EstimatorSpec",
    "register_estimator",
    "get_estimator_spec",
    "estimator_params",
    "estimate_advantages",
    "get_advantage_estimator",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "gae",
    "global_std",
    "StdNormalize",
    "token_level_rewards",
    "sequence_kl_scores",
    "broadcast_to_tokens",
]

F = TypeVar("F", bound=Callable[..., Any])

Reduce = Callable[[Tensor], Tensor]
"""A sum over data-parallel ranks (``all_reduce(SUM)`` that returns the summed tensor); ``None`` = this
process's data only. Passed to the whitening functions so that their statistics are those of the global
batch: with it, world size 2 gives the same advantages as world size 1 on the same global batch."""


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class EstimatorSpec:
    """One registered advantage estimator: the single source of truth for its config name, level,
    critic requirement, minimum group size and the ``cfg.algo`` fields it takes.

    Calling convention of ``fn`` by kind (what :func:`estimate_advantages` does):

    * ``level="sequence"``: ``fn(scores [N], group_index [N], **params) -> [N]``;
    * ``level="step"``: ``fn(steps, scores [N], group_index [N], mask [N, T], **params) -> [N, T]`` with
      ``steps`` the process rewards (:class:`mathrl.algo.process.StepRewards`, from a process reward model);
    * ``level="token"``, no critic: ``fn(token_rewards [N, T], mask, *, reduce, **params) -> [N, T]``;
    * ``level="token"``, ``needs_critic``: ``fn(token_rewards, values, mask, **params) -> (advantages,
      returns)``; the advantages are then whitened over the global batch when ``whiten``.

    ``global_stats``: a sequence-level ``fn`` also takes ``reduce`` (statistics over the global batch).
    ``group_baseline``: a token-level estimator's scores are centred on their group's mean first.
    ``loss_agg``: the loss aggregation of the estimator's paper, what ``algo.loss_agg: auto`` resolves to
    (None: the policy loss's).
    """

    name: str
    fn: Callable[..., Any]
    level: Literal["sequence", "token", "step"]
    needs_critic: bool
    min_group: int
    params: tuple[str, ...]
    whiten: bool
    doc: str
    global_stats: bool = False
    group_baseline: bool = False
    loss_agg: str | None = None


def register_estimator(name: str, *, level: Literal["sequence", "token", "step"], needs_critic: bool = False,
                       min_group: int = 1, params: tuple[str, ...] = (), whiten: bool = False,
                       doc: str | None = None, global_stats: bool = False, group_baseline: bool = False,
                       loss_agg: str | None = None) -> Callable[[F], F]:
    """Register the decorated function as the advantage estimator ``name`` (returned unchanged).

    ``level``: "sequence" (one advantage per response, broadcast to its tokens; a KL in the reward is
    folded into the score first), "token" (per-token rewards in; the KL goes into them, PPO style) or "step"
    (process rewards of each response's steps in, from the run's process reward model ``model.prm``; the KL
    stays in the loss).
    ``needs_critic``: the trainer loads a value model and passes ``values`` (token level only).
    ``min_group``: the smallest ``rollout.n`` it learns anything with (2 for a group baseline).
    ``params``: names of ``cfg.algo`` fields passed as keyword arguments (see :func:`estimator_params`).
    ``whiten``: whiten a critic estimator's advantages with global-batch statistics.
    ``doc``: one line for ``--help`` (default: the first line of the function's docstring).
    ``global_stats``, ``group_baseline``, ``loss_agg``: see :class:`EstimatorSpec`.
    """
    if level not in ("sequence", "token", "step"):
        raise ValueError(f"estimator {name!r}: level must be 'sequence', 'token' or 'step', got {level!r}")
    if needs_critic and level != "token":
        raise ValueError(f"estimator {name!r}: a critic estimator must be token level")
    if global_stats and level != "sequence" or group_baseline and (level != "token" or needs_critic):
        raise ValueError(f"estimator {name!r}: global_stats is for sequence-level estimators, group_baseline for "
                         "token-level ones without a critic")
    if min_group < 1:
        raise ValueError(f"estimator {name!r}: min_group must be >= 1, got {min_group}")
    if name == "auto" or name in ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} already registered (or reserved)")

    def deco(fn: F) -> F:
        line = doc if doc is not None else ((fn.__doc__ or "").strip().splitlines() or [""])[0]
        ESTIMATORS.register(name, EstimatorSpec(name=name, fn=fn, level=level, needs_critic=needs_critic,
                                                min_group=min_group, params=tuple(params), whiten=whiten,
                                                doc=line.strip(), global_stats=global_stats,
                                                group_baseline=group_baseline, loss_agg=loss_agg))
        return fn

    return deco


def get_estimator_spec(name: str) -> EstimatorSpec:
    """The :class:`EstimatorSpec` of ``name``; an unknown name raises
    :class:`~mathrl.registry.UnknownNameError` (a ``ValueError``) naming the allowed ones, sorted."""
    spec = ESTIMATORS.get(name, None)
    if spec is None:
        raise UnknownNameError(ESTIMATORS.kind, name, sorted(ESTIMATORS))
    return spec


def get_advantage_estimator(name: str) -> Callable[..., object]:
    """Look an estimator's function up by its config name; unknown names raise ``ValueError``."""
    return get_estimator_spec(name).fn


# --------------------------------------------------------------------------- helpers


def _check_mask(x: Tensor, mask: Tensor, what: str = "x") -> Tensor:
    """Return ``mask`` as a bool tensor after checking it matches ``x``'s shape."""
    if mask.shape != x.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} does not match {what} shape {tuple(x.shape)}"
        )
    if mask.dtype == torch.bool:
        return mask
    return mask != 0


def _check_2d(x: Tensor, what: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{what} must be a 2-D [N, T] tensor, got shape {tuple(x.shape)}")


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is non-zero.

    ``mean = sum(x * m) / sum(m)`` over all elements (``dim=None``, a 0-dim tensor) or
    along ``dim``. Padding values (even inf or NaN) are excluded with ``torch.where``,
    not multiplied by 0. An empty selection gives 0 (not NaN): a response without
    tokens contributes nothing.
    """
    m = _check_mask(x, mask)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    xs = torch.where(m, x, zero)
    count = m.sum() if dim is None else m.sum(dim)
    total = xs.sum() if dim is None else xs.sum(dim)
    return total / count.clamp(min=1).to(x.dtype)


def masked_var(x: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over the valid positions (all of them, one 0-dim result).

    ``var = sum(m * (x - mean)^2) / (n - 1)`` with ``n = sum(m)`` when ``unbiased``
    (Bessel's correction, like ``torch.var``'s default), ``/ n`` otherwise. With
    ``n <= 1`` (unbiased) or ``n == 0`` the variance is defined as 0.
    """
    m = _check_mask(x, mask)
    mean = masked_mean(x, m)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    sq = torch.where(m, (x - mean) ** 2, zero).sum()
    n = m.sum().to(x.dtype)
    denom = n - 1 if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1), zero)


def masked_whiten(
    x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8, reduce: Reduce | None = None
) -> Tensor:
    """Whiten ``x`` with statistics taken over the valid positions only.

    ``x' = (x - mean) / sqrt(var + eps)`` with the masked mean and the unbiased masked
    variance; with ``shift_mean=False`` the mean is added back
    (``x' = (x - mean) / sqrt(var + eps) + mean``: rescale without centring, as
    OpenRLHF/TRL do for returns). Output is 0 at padding positions.

    ``reduce`` (see :data:`Reduce`) makes the statistics global: the masked sum and count are
    summed over ranks first, then the sum of squared deviations from the global mean (two
    reductions, in float64 so that the result does not depend on how the batch is split).
    """
    m = _check_mask(x, mask)
    if reduce is None:
        mean = masked_mean(x, m)
        var = masked_var(x, m)
    else:
        zero64 = torch.zeros((), dtype=torch.float64, device=x.device)
        x64 = x.to(torch.float64)
        sums = reduce(torch.stack([torch.where(m, x64, zero64).sum(), m.sum().to(torch.float64)]))
        n = sums[1]
        mean64 = sums[0] / n.clamp(min=1)
        sq = reduce(torch.where(m, (x64 - mean64) ** 2, zero64).sum().reshape(1))[0]
        var64 = torch.where(n > 1, sq / (n - 1).clamp(min=1), zero64)
        mean, var = mean64.to(x.dtype), var64.to(x.dtype)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _group_stats(
    scores: Tensor, group_index: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-response group mean, group size, unbiased group std (0 for size 1) and whether
    the group is informative (more than one response and not all scores equal)."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be a 1-D [N] tensor, got shape {tuple(scores.shape)}")
    if group_index.shape != scores.shape:
        raise ValueError(
            f"group_index shape {tuple(group_index.shape)} does not match scores shape "
            f"{tuple(scores.shape)}"
        )
    if group_index.dtype.is_floating_point or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got dtype {group_index.dtype}")
    # Map arbitrary ids (e.g. prompt ids 17, 4, 17, ...) onto 0..G-1.
    _, inv = torch.unique(group_index, return_inverse=True)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
    s = scores.to(dtype)
    count = torch.zeros(g, dtype=dtype, device=s.device).index_add_(0, inv, torch.ones_like(s))
    total = torch.zeros(g, dtype=dtype, device=s.device).index_add_(0, inv, s)
    mean = total / count
    dev2 = torch.zeros(g, dtype=dtype, device=s.device).index_add_(0, inv, (s - mean[inv]) ** 2)
    var = torch.where(count > 1, dev2 / (count - 1).clamp(min=1), torch.zeros_like(dev2))
    # A group whose scores are all equal has no signal: mark it so that its advantages
    # are exactly 0 (sum/count can leave a rounding residue such as 1e-18).
    hi = torch.full((g,), -torch.inf, dtype=dtype, device=s.device).scatter_reduce(0, inv, s, "amax")
    lo = torch.full((g,), torch.inf, dtype=dtype, device=s.device).scatter_reduce(0, inv, s, "amin")
    informative = (count > 1) & (hi > lo)
    return mean[inv], count[inv], var[inv].sqrt(), informative[inv]


# --------------------------------------------------------------------------- sequence level


StdNormalize = Union[bool, Literal["group", "batch"]]
"""``algo.std_normalize``: True / "group" (the group's std), "batch" (the global batch's), False (none)."""


@register_estimator("grpo", level="sequence", min_group=2, params=("std_normalize",), global_stats=True)
def grpo(
    scores: Tensor, group_index: Tensor, *, std_normalize: StdNormalize = True, eps: float = 1e-6,
    reduce: Reduce | None = None,
) -> Tensor:
    """Group-relative advantage of GRPO (DeepSeekMath, Shao et al. 2024, eq. 3 / sec. 4.1.2).

    For response ``i`` in group ``g`` with ``n_g`` responses::

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)     std_normalize = True or "group"
        A_i = (r_i - mean_g(r)) / (std_B(r) + eps)     std_normalize = "batch"
        A_i =  r_i - mean_g(r)                         std_normalize = False (Dr. GRPO)

    ``std_g`` is the *unbiased* standard deviation of the group (divisor ``n_g - 1``, torch's
    default, as in the DeepSeekMath/verl/TRL implementations); ``std_B`` that of every score of the
    batch (TRL's ``scale_rewards="batch"``; with ``reduce`` (:data:`Reduce`) the global batch over all
    ranks). A group of one response gets advantage 0 (there is nothing to compare with). A group whose
    scores are all equal gets exactly 0 in every variant. Adding a constant to every score of a group does
    not change its advantages. Returns ``[N]`` in the scores' floating dtype.
    """
    if std_normalize not in (True, False, "group", "batch"):
        raise ValueError(f"std_normalize must be true, false, 'group' or 'batch', got {std_normalize!r}")
    mean, _, std, informative = _group_stats(scores, group_index)
    adv = scores.to(mean.dtype) - mean
    if std_normalize == "batch":
        adv = adv / (global_std(scores.to(mean.dtype), reduce) + eps)
    elif std_normalize:
        adv = adv / (std + eps)
    return torch.where(informative, adv, torch.zeros_like(adv))


def global_std(x: Tensor, reduce: Reduce | None = None) -> Tensor:
    """The unbiased std of every element of ``x`` (``[N]``), over all ranks with ``reduce``: the sum and count
    summed first, then the squared deviations from the global mean (float64, so the value does not depend
    on how the batch is split). 0 for fewer than two elements. A 0-dim tensor in ``x``'s dtype."""
    x64 = x.detach().to(torch.float64).flatten()
    sums = torch.stack([x64.sum(), torch.tensor(float(x64.numel()), dtype=torch.float64, device=x.device)])
    if reduce is not None:
        sums = reduce(sums)
    n, mean = sums[1], sums[0] / sums[1].clamp(min=1)
    sq = ((x64 - mean) ** 2).sum().reshape(1)
    if reduce is not None:
        sq = reduce(sq)
    var = torch.where(n > 1, sq[0] / (n - 1).clamp(min=1), torch.zeros((), dtype=torch.float64, device=x.device))
    return var.sqrt().to(x.dtype)


@register_estimator("dr_grpo", level="sequence", min_group=2, loss_agg="seq-mean-token-sum-norm")
def dr_grpo(scores: Tensor, group_index: Tensor) -> Tensor:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training").

    ``A_i = r_i - mean_g(r)``: GRPO without the division by the group std, which
    Dr. GRPO identifies as a question-difficulty bias. Its other fix, dropping the
    ``1/|o_i|`` length normaliser, is the loss aggregation mode ``seq-mean-token-sum-norm``
    in :mod:`mathrl.algo.losses`, what ``algo.loss_agg: auto`` gives with this estimator.
    Groups of one get 0.
    """
    return grpo(scores, group_index, std_normalize=False)


@register_estimator("grpo_ps", level="step", min_group=2, params=("ps_outcome_weight",))
def grpo_ps(steps: StepRewards, scores: Tensor, group_index: Tensor, mask: Tensor, *,
            ps_outcome_weight: float = 0.0) -> Tensor:
    """GRPO with process supervision (DeepSeekMath sec. 4.1.3): a PRM's step rewards, group-normalised.

    ::

        r~_ij   = (r_ij - mean(R_g)) / std(R_g)      R_g = every step reward of the group
        A_{i,t} = sum_{j : end(i, j) >= t} r~_ij  +  w * A^OS_i

    (:func:`mathrl.algo.process.process_advantages`). ``w`` = ``ps_outcome_weight`` mixes in GRPO's outcome
    advantage ``A^OS`` of the verifier's scores (:func:`grpo`, group std) at the advantage level, as PRIME
    combines its implicit process and outcome returns; 0 (default) is the paper's process-only GRPO. With one
    step per response and step reward = score the process term equals GRPO's outcome advantage.
    """
    adv = process_advantages(steps.rewards, steps.ends, steps.mask, group_index, mask)
    if ps_outcome_weight:
        adv = adv + ps_outcome_weight * broadcast_to_tokens(grpo(scores, group_index), mask).to(adv.dtype)
    return adv


@register_estimator("rloo", level="sequence", min_group=2)
def rloo(scores: Tensor, group_index: Tensor) -> Tensor:
    """REINFORCE Leave-One-Out advantage (Ahmadian et al. 2024; Kool et al. 2019).

    Baseline for response ``i`` = mean score of the *other* ``n_g - 1`` responses of
    its group::

        A_i = r_i - (sum_g(r) - r_i) / (n_g - 1)  =  n_g / (n_g - 1) * (r_i - mean_g(r))

    A group of one gets 0. Returns ``[N]``.
    """
    mean, count, _, informative = _group_stats(scores, group_index)
    s = scores.to(mean.dtype)
    adv = count / (count - 1).clamp(min=1) * (s - mean)
    return torch.where(informative, adv, torch.zeros_like(adv))


# --------------------------------------------------------------------------- token level


@register_estimator("reinforce_pp", level="token", params=("gamma",))
def reinforce_pp(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0, reduce: Reduce | None = None
                 ) -> Tensor:
    """REINFORCE++ advantage (Hu 2025, arXiv:2501.03262, sec. 3).

    Discounted return-to-go over the valid tokens of each response, then whitened with
    the mean and (unbiased) std over all valid tokens of the batch::

        G_t = r_t + gamma * G_{t'}      (t' = next valid token after t; G = 0 past the last)
        A   = masked_whiten(G, mask)

    Padding tokens are skipped by the recursion (a hole in the mask does not break the
    return), their rewards are ignored and their advantage is 0. The KL penalty, if
    any, is expected to be already inside ``token_rewards`` (see
    :func:`token_level_rewards`). ``reduce`` makes the whitening statistics those of the
    global batch (:data:`Reduce`). Returns ``[N, T]``.
    """
    _check_2d(token_rewards, "token_rewards")
    m = _check_mask(token_rewards, mask, "token_rewards")
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        valid = m[:, t]
        running = torch.where(valid, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return masked_whiten(returns, m, reduce=reduce)


register_estimator(
    "reinforce_pp_baseline", level="token", min_group=2, params=("gamma",), group_baseline=True,
    doc="REINFORCE++-baseline (Hu et al. 2025): each score minus its group's mean, then REINFORCE++'s return and "
    "global whitening")(reinforce_pp)


@register_estimator("gae", level="token", needs_critic=True, params=("gamma", "lam"), whiten=True)
def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eq. 16) for PPO.

    Backward recursion over the valid tokens of each response::

        delta_t = r_t + gamma * V_{t'} - V_t
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t                     (the value target)

    where ``t'`` is the next *valid* token after ``t``, and ``V_{t'} = 0``,
    ``A_{t'} = 0`` after the last valid token (the episode ends there; the padded end
    of the tensor plays no role). Padding tokens are skipped, so values and rewards
    at padding never change the result; advantages and returns are 0 there. Not
    whitened: apply :func:`masked_whiten` to the advantages if the recipe asks for it.
    With ``gamma = lam = 1``: ``A_t = sum_{k >= t} r_k - V_t`` (reward-to-go minus
    value). Returns ``(advantages [N, T], returns [N, T])``.
    """
    _check_2d(token_rewards, "token_rewards")
    if values.shape != token_rewards.shape:
        raise ValueError(
            f"values shape {tuple(values.shape)} does not match token_rewards shape "
            f"{tuple(token_rewards.shape)}"
        )
    m = _check_mask(token_rewards, mask, "token_rewards")
    values = values.detach()
    adv = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    last_gae = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        valid = m[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        cur = delta + gamma * lam * last_gae
        last_gae = torch.where(valid, cur, last_gae)
        next_value = torch.where(valid, values[:, t], next_value)
        adv[:, t] = torch.where(valid, cur, torch.zeros_like(cur))
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    returns = torch.where(m, adv + values, zero)
    return adv, returns


# --------------------------------------------------------------------------- glue for the trainer


def token_level_rewards(
    scores: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0
) -> Tensor:
    """Per-token rewards with the outcome score at the last valid token (PPO style).

    ::

        r_t = -kl_coef * kl_t * m_t  +  score * [t == last valid token]

    This is how InstructGPT/PPO-RLHF (Ouyang et al. 2022, eq. 2) puts the KL penalty
    to the reference policy into the reward; ``kl`` is a per-token estimate
    (:func:`mathrl.algo.kl.estimate`), usually detached. With ``kl=None`` or
    ``kl_coef=0`` only the score remains. Raises ``ValueError`` when a response has no
    valid token (its score would be silently lost). Returns ``[N, T]``, 0 at padding.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be a 1-D [N] tensor, got shape {tuple(scores.shape)}")
    if mask.dim() != 2 or mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"mask must be [N, T] with N = {scores.shape[0]} (len(scores)), got {tuple(mask.shape)}"
        )
    m = mask if mask.dtype == torch.bool else mask != 0
    empty = (~m.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(
            f"responses {empty.tolist()[:10]} have no valid token in mask; their score "
            "cannot be placed (a response should keep at least its EOS token)"
        )
    dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
    rewards = torch.zeros(m.shape, dtype=dtype, device=scores.device)
    if kl is not None and kl_coef != 0.0:
        if kl.shape != m.shape:
            raise ValueError(f"kl shape {tuple(kl.shape)} does not match mask shape {tuple(m.shape)}")
        rewards = torch.where(m, -kl_coef * kl.to(dtype), rewards)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values
    rows = torch.arange(m.shape[0], device=m.device)
    rewards[rows, last] += scores.to(dtype)
    return rewards


def sequence_kl_scores(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """Fold a per-token KL penalty into sequence-level scores (RLOO, Ahmadian et al. 2024, sec. 3)::

        r_i' = r_i - kl_coef * sum_t kl_{i,t} * m_{i,t}

    For the group estimators (grpo, dr_grpo, rloo) with the KL in the reward: the penalty is part of
    each response's score *before* the group baseline, so a response that drifted further from the
    reference than its siblings gets a lower advantage. ``kl`` is a per-token estimate
    (:func:`mathrl.algo.kl.estimate`, usually k1 of the sampling policy), detached; padding is
    ignored. Returns ``[N]``.
    """
    if scores.dim() != 1 or kl.dim() != 2 or kl.shape[0] != scores.shape[0]:
        raise ValueError(f"expected scores [N] and kl [N, T], got {tuple(scores.shape)} and {tuple(kl.shape)}")
    m = _check_mask(kl, mask, "kl")
    dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
    total = torch.where(m, kl.detach().to(dtype), torch.zeros((), dtype=dtype, device=kl.device)).sum(1)
    return scores.to(dtype) - kl_coef * total


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor) -> Tensor:
    """Copy a per-response value (e.g. a GRPO advantage) to each of its valid tokens.

    ``A[i, t] = a_i * m[i, t]`` (0 at padding). Returns ``[N, T]`` in ``seq_values``' dtype.
    """
    if seq_values.dim() != 1 or mask.dim() != 2 or mask.shape[0] != seq_values.shape[0]:
        raise ValueError(
            f"expected seq_values [N] and mask [N, T], got {tuple(seq_values.shape)} and "
            f"{tuple(mask.shape)}"
        )
    m = mask if mask.dtype == torch.bool else mask != 0
    zero = torch.zeros((), dtype=seq_values.dtype, device=seq_values.device)
    return torch.where(m, seq_values[:, None], zero)




# --------------------------------------------------------------------------- the trainer's entry point


def estimator_params(name: str, algo_cfg: Any) -> dict[str, Any]:
    """The keyword parameters of estimator ``name`` read from ``algo_cfg`` (a ``cfg.algo`` section):
    ``{field: getattr(algo_cfg, field)}`` for each field the estimator declared in ``params``."""
    return {p: getattr(algo_cfg, p) for p in get_estimator_spec(name).params}


def estimate_advantages(name: str, scores: Tensor, group_index: Tensor, mask: Tensor, *,
                        params: Mapping[str, Any], kl_tokens: Tensor | None = None, kl_coef: float = 0.0,
                        values: Tensor | None = None, reduce: Reduce | None = None,
                        steps: StepRewards | None = None) -> tuple[Tensor, Tensor | None]:
    """Token-level advantages ``[N, T]`` (and the value targets for a critic estimator, else ``None``)
    of the registered estimator ``name``.

    ``params``: the estimator's keyword parameters (:func:`estimator_params`). ``kl_tokens`` (the
    per-token KL of the sampled responses, ``[N, T]``) with ``kl_coef != 0`` enters the reward: summed
    into each response's score before the group baseline for a sequence-level estimator
    (:func:`sequence_kl_scores`, RLOO-style), per token for a token-level one
    (:func:`token_level_rewards`, PPO-style). Sequence-level advantages are copied to every valid token
    (:func:`broadcast_to_tokens`). ``values [N, T]`` is required by a critic estimator. ``reduce``
    (:data:`Reduce`) makes the whitening statistics (REINFORCE++, GAE) those of the global batch. ``steps``
    (the process rewards) is required by a step-level estimator, which takes no KL in the reward.
    """
    spec = get_estimator_spec(name)
    if spec.level == "step":
        if steps is None:
            raise ValueError(f"advantage estimator {name!r} needs process rewards: pass steps (StepRewards)")
        if kl_tokens is not None and kl_coef:
            raise ValueError(f"advantage estimator {name!r} takes the KL in the loss, not in the reward")
        return spec.fn(steps, scores, group_index, mask, **params), None
    if spec.level == "sequence":
        if kl_tokens is not None and kl_coef:
            scores = sequence_kl_scores(scores, kl_tokens, mask, kl_coef)
        seq = spec.fn(scores, group_index, **params, **({"reduce": reduce} if spec.global_stats else {}))
        return broadcast_to_tokens(seq, mask), None
    if spec.group_baseline:  # REINFORCE++-baseline: the outcome score relative to its group's mean
        scores = scores - _group_stats(scores, group_index)[0]
    rewards = token_level_rewards(scores, mask, kl=kl_tokens, kl_coef=kl_coef)
    if not spec.needs_critic:
        return spec.fn(rewards, mask, reduce=reduce, **params), None
    if values is None:
        raise ValueError(f"advantage estimator {name!r} needs a critic: pass values [N, T]")
    advantages, returns = spec.fn(rewards, values, mask, **params)
    if spec.whiten:
        advantages = masked_whiten(advantages, mask, reduce=reduce)
    return advantages, returns
