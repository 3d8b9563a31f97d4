"""Reward stage: answer extraction, equivalence, a process pool with hard timeouts, and reward
functions.

Public API::

    from mathrl.reward import Grade, grade, grade_batch, compute_rewards
    grade(response, gold, timeout=5.0, truncated=False) -> Grade
    grade_batch(responses, golds, timeout=5.0, workers=None, truncated=None, durations=None) -> list[Grade]

Modules: ``extract`` (final-answer policy), ``normalize`` (cleaning + structure),
``equiv`` (equivalence rules), ``grader`` (in-process grading), ``pool`` (worker processes,
timeouts), ``rewards`` (grade -> scalar), ``cli`` (``mathrl verify``). The hostile-output
generator used to fuzz this package lives in :mod:`mathrl.testing.hostile`.
"""

from mathrl.reward.api import grade, grade_batch
from mathrl.reward.grader import REASONS, Grade, grade_local
from mathrl.reward.pool import shutdown_pool
from mathrl.reward.rewards import REWARDS, compute_rewards, get_reward, register_reward

__all__ = [
    "Grade",
    "REASONS",
    "grade",
    "grade_batch",
    "grade_local",
    "shutdown_pool",
    "REWARDS",
    "compute_rewards",
    "get_reward",
    "register_reward",
]
