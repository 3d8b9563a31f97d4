"""Reward stage: answer extraction, equivalence, a process pool with hard timeouts, and reward
functions.

Public API::

    from mathrl.reward import Grade, GradeOptions, grade, grade_batch, compute_rewards
    options = GradeOptions(timeout=5.0, rel_tol=0.0, workers=None)  # or GradeOptions.from_config(cfg)
    grade(response, gold, options, truncated=False) -> Grade
    grade_batch(responses, golds, options, truncated=None, durations=None) -> list[Grade]

(``timeout=``, ``workers=``, ``rel_tol=`` in place of ``options`` are a shorthand for those options.)

Modules: ``options`` (:class:`GradeOptions`), ``extract`` (final-answer policy), ``normalize``
(cleaning + structure), ``equiv`` (equivalence rules), ``grader`` (in-process grading), ``pool``
(worker processes, timeouts), ``rewards`` (grade -> scalar), ``cli`` (``mathrl verify``). The hostile-output
generator used to fuzz this package lives in :mod:`mathrl.testing.hostile`.
"""

from mathrl.reward.api import grade, grade_batch
from mathrl.reward.grader import REASONS, Grade, grade_local
from mathrl.reward.options import GradeOptions, GradeOptionsError
from mathrl.reward.pool import shutdown_pool
from mathrl.reward.rewards import REWARDS, compute_rewards, get_reward, register_reward

__all__ = [
    "Grade",
    "GradeOptions",
    "GradeOptionsError",
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
