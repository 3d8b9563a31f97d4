"""RL algorithm core: advantages, KL estimators and losses as pure tensor functions.

- :mod:`mathrl.algo.advantages`: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``, ``gae``
  (registry ``ESTIMATORS``: one ``EstimatorSpec`` per name), masked statistics, ``token_level_rewards`` and
  ``broadcast_to_tokens``.
- :mod:`mathrl.algo.kl`: ``estimate(logp, ref_logp, kind)`` for ``k1``/``k2``/``k3``
  (registry ``KL_ESTIMATORS``).
- :mod:`mathrl.algo.losses`: ``policy_loss``, ``value_loss``, ``agg_loss`` (registry
  ``LOSS_AGG_MODES``), ``global_normalizers``.
- :mod:`mathrl.algo.logprobs`: the chunked, memory-lean kernel ``logprobs_from_logits``,
  ``entropy_from_logits``, ``logprobs_and_entropy_from_logits``.

No model, engine or config object enters these functions; configs pick them by name.
"""

from __future__ import annotations

from mathrl.algo import advantages, kl, logprobs, losses
from mathrl.algo.advantages import ESTIMATORS, get_advantage_estimator
from mathrl.algo.kl import KL_ESTIMATORS
from mathrl.algo.losses import LOSS_AGG_MODES

__all__ = [
    "ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "advantages",
    "get_advantage_estimator",
    "kl",
    "logprobs",
    "losses",
]
