"""The configuration's user-facing error (a leaf of :mod:`mathrl.config`)."""

from mathrl.errors import InputError

__all__ = ["ConfigError"]


class ConfigError(InputError, ValueError):
    """A configuration problem; ``str(err)`` is a single line meant for the user."""
