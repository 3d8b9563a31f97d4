"""Process reward models (DeepSeekMath sec. 4.1.3, Math-Shepherd): automatic step labels from completions
(:mod:`mathrl.prm.labels`). The step rule, the labels' arithmetic and GRPO's process advantages are pure
functions in :mod:`mathrl.algo.process`."""
