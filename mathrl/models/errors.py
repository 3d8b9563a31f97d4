"""Errors raised while resolving or loading models."""


class ModelError(RuntimeError):
    """A model could not be found, converted or loaded; the message says how to fix it."""
