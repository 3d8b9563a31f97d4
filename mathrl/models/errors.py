"""Errors raised while resolving or loading models."""

from mathrl.errors import InputError


class ModelError(InputError, RuntimeError):
    """A model could not be found, converted or loaded; the message says how to fix it."""
