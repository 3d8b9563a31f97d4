"""The one Trainer and the RL step, forward layouts, the update, checkpoint/resume and metrics
(docs/architecture.md, ``train/``; the DeepSpeed engines and collectives are in :mod:`mathrl.dist`)."""

from mathrl.train.checkpoint import TrainingError
from mathrl.train.loop import RLMethod, run
from mathrl.train.trainer import Method, Trainer

__all__ = ["Method", "RLMethod", "Trainer", "TrainingError", "run"]
