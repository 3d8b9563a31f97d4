"""The trainer's two user-facing errors (a leaf module: everything in ``mathrl.train`` may import it)."""

from mathrl.errors import RunStopped


class CheckpointError(RunStopped, RuntimeError):
    """A checkpoint cannot be trusted or written; the message names the file and what to do."""


class TrainingError(RunStopped, RuntimeError):
    """The run stopped for a reason the user must act on (message says what and where)."""
