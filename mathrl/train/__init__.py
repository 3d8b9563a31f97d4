"""The RL loop, DeepSpeed engines, checkpoint/resume and metrics (docs/architecture.md, ``train/``)."""

from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import RLMethod, run
from mathrl.train.trainer import Method, Trainer

__all__ = ["Method", "RLMethod", "Trainer", "TrainingError", "run"]
