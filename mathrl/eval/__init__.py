"""Evaluation: pass@k / maj@k estimators, the benchmark runner, reports and plots.

* :mod:`mathrl.eval.metrics` -- pure estimators (unbiased pass@k, maj@k over
  equivalence classes, Wilson and bootstrap intervals);
* :mod:`mathrl.eval.runner` -- sample with a rollout engine, grade with the
  verifier, per-problem records, summaries;
* :mod:`mathrl.eval.benchmarks` -- benchmark registry, suites, the held-out set of a config;
* :mod:`mathrl.eval.report` / :mod:`mathrl.eval.compare` / :mod:`mathrl.eval.series` --
  JSON / markdown / PNG reports, run comparison, checkpoint series;
* :mod:`mathrl.eval.cli` -- ``mathrl eval``.
"""

from mathrl.eval.metrics import (
    bootstrap_ci, cluster_answers, maj_at_k, mean_pass_at_k, paired_bootstrap_diff, pass_at_k, wilson_interval,
)

__all__ = ["bootstrap_ci", "cluster_answers", "maj_at_k", "mean_pass_at_k", "paired_bootstrap_diff", "pass_at_k",
           "wilson_interval"]
