"""The RL loop, DeepSpeed engines, checkpoint/resume and metrics (docs/architecture.md, ``train/``)."""

from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import run

__all__ = ["TrainingError", "run"]
