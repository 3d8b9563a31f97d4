"""The RL loop, DeepSpeed engines, checkpoint/resume and metrics (DESIGN.md, ``train/``)."""

from mathrl.train.loop import TrainingError, run

__all__ = ["TrainingError", "run"]
