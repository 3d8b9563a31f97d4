"""The trainer's two user-facing errors (a leaf module: everything in ``mathrl.train`` may import it).
``CheckpointError`` is the checkpoint layer's (:mod:`mathrl.dist.checkpoint_io`)."""

from mathrl.dist.checkpoint_io import CheckpointError
from mathrl.errors import RunStopped

__all__ = ["CheckpointError", "TrainingError"]


class TrainingError(RunStopped, RuntimeError):
    """The run stopped for a reason the user must act on (message says what and where)."""
