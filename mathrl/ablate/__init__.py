"""Ablation studies (DeepSeekMath section 5.2 style): RFT, online RFT, GRPO, PPO and their variants.

* :mod:`mathrl.ablate.study` -- the study YAML, grid expansion, per-run configs;
* :mod:`mathrl.ablate.methods` -- the methods on the trainer's engine (RFT via :mod:`mathrl.train.sft`);
* :mod:`mathrl.ablate.driver` -- run / resume a study, launcher commands;
* :mod:`mathrl.ablate.compare` -- seeds pooled, the declared contrasts (Holm) and the exploratory comparisons;
* :mod:`mathrl.ablate.report` -- the table and the plots;
* :mod:`mathrl.ablate.cli` -- ``mathrl ablate``.
"""

from mathrl.ablate.driver import run_study
from mathrl.ablate.methods import Task
from mathrl.ablate.study import VARIANTS, load_study

__all__ = ["VARIANTS", "Task", "load_study", "run_study"]
