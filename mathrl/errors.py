"""The base classes of the errors mathrl reports to the user as one line, without a traceback (a leaf
module: every package may import it, it imports nothing of mathrl).

``mathrl`` (:func:`mathrl.cli.main`) prints ``mathrl <command>: <verb>: <message>`` for any of them and
exits with the class's ``exit_code``:

* :class:`InputError` (exit 2, "error"): the input is wrong (a config key, a data row, a model path, a
  file); nothing was changed, fix the input and run again. ``ConfigError``, ``DataError``,
  ``ModelError`` and the CLI's ``UserError`` derive from it.
* :class:`RunStopped` (exit 3, "stopped"): a run stopped on its own decision (a checkpoint that cannot be
  trusted or written, a run of NaN steps); its message says what happened and how to continue.
  ``CheckpointError`` and ``TrainingError`` derive from it.

A stage's own error class derives from one of the two (and may keep ``ValueError``/``RuntimeError`` as
a second base for callers that catch those), so the entry point catches by class, not by name.
"""

from __future__ import annotations


class MathrlError(Exception):
    """An error whose message is a complete, single-line report for the user."""

    exit_code: int = 1
    verb: str = "error"


class InputError(MathrlError):
    """Bad input, found before (or instead of) doing the work: exit status 2."""

    exit_code = 2
    verb = "error"


class RunStopped(MathrlError):
    """A run stopped by its own decision, with the reason and how to continue: exit status 3."""

    exit_code = 3
    verb = "stopped"
