"""The objectives one micro-batch backpropagates, as pure tensor functions: the RL policy objective (policy
loss, KL to the reference, entropy bonus, truncated importance weights) and the SFT loss. The value
objective is :func:`mathrl.algo.losses.value_loss` times ``algo.vf_coef``.

Every term carries the optimizer step's *global* normalisers (``norm_tokens``/``norm_seqs``, see
:mod:`mathrl.algo.losses`), so the trainer's micro-batch loop
(:func:`mathrl.train.update.accumulate_and_step`) only sums gradients.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from mathrl.algo import kl as kl_mod
from mathrl.algo.losses import POLICY_LOSSES, agg_loss

__all__ = ["PolicyObjective", "policy_objective", "sft_loss"]


class PolicyObjective(NamedTuple):
    """``loss`` (to backpropagate) = ``pg_loss`` + kl_coef * ``kl_loss`` - entropy_coef * entropy term;
    ``stats``: the policy loss's own statistics (clip fractions, ratios)."""

    loss: Tensor
    pg_loss: Tensor
    kl_loss: Tensor | None
    stats: dict[str, Tensor]


def policy_objective(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, loss: str = "ppo",
                     clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
                     weights: Tensor | None = None, ref_logp: Tensor | None = None, kl_coef: float = 0.0,
                     kl_estimator: str = "k3", entropy: Tensor | None = None, entropy_coef: float = 0.0,
                     agg: str = "token-mean", norm_tokens: float | Tensor | None = None,
                     norm_seqs: float | Tensor | None = None, norm_const: float | None = None) -> PolicyObjective:
    """The RL policy objective of one micro-batch ([N, T] tensors of response tokens)::

        L = policy_loss(logp, old_logp, advantages; clip, weights)        (POLICY_LOSSES[loss])
            + kl_coef * agg(KL_est(logp, ref_logp))                        (when ref_logp is given)
            - entropy_coef * agg(entropy)                                  (when entropy_coef > 0)

    ``weights``: per-token truncated importance weights (``algo.tis_cap``, :mod:`mathrl.algo.correction`),
    applied inside the policy loss. Every term is aggregated with ``agg`` and the same global normalisers.
    """
    norms = dict(agg=agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs, norm_const=norm_const)
    pg_loss, stats = POLICY_LOSSES[loss](logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                                         dual_clip=dual_clip, weights=weights, **norms)
    total = pg_loss
    kl_loss = None
    if ref_logp is not None:
        kl_loss = agg_loss(kl_mod.estimate(logp, ref_logp, kl_estimator), mask, **norms)
        total = total + kl_coef * kl_loss
    if entropy_coef > 0:
        if entropy is None:
            raise ValueError("policy_objective: entropy_coef > 0 needs the per-token entropy")
        total = total - entropy_coef * agg_loss(entropy, mask, **norms)
    return PolicyObjective(total, pg_loss, kl_loss, stats)


def sft_loss(logp: Tensor, mask: Tensor, *, norm_tokens: float | Tensor | None = None,
             agg: str = "token-mean", norm_seqs: float | Tensor | None = None,
             norm_const: float | None = None) -> Tensor:
    """Mean negative log-likelihood of the response tokens.

    ``logp`` [N, T]: log pi(o_t | q, o_<t) of each response token (prompt tokens are not in it);
    ``mask`` [N, T]: 1 on real response tokens, 0 on padding (and on rows that must not count).

    With ``agg = "token-mean"`` (default)::

        L = - sum_{i,t} m_{i,t} * logp_{i,t} / norm_tokens

    where ``norm_tokens`` is the global count of valid tokens of the optimizer step (default: this
    call's own ``sum(m)``, correct only for a single micro-batch). Other aggregation modes of
    :func:`mathrl.algo.losses.agg_loss` are accepted (``seq-mean-token-mean`` weighs every response
    equally, as in Yuan et al.'s per-example mean). Masked positions never contribute, even when
    their logprob is ``-inf``.
    """
    return agg_loss(-logp, mask, agg, norm_tokens=norm_tokens, norm_seqs=norm_seqs, norm_const=norm_const)
