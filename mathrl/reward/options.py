"""The verifier's options: :class:`GradeOptions`, the one object that :func:`mathrl.reward.grade_batch`,
:class:`mathrl.reward.api.GradeStream`, the worker pool and its worker processes take, and that the trainer
and ``mathrl eval`` build from a config (:meth:`GradeOptions.from_config`), so no caller picks the
``reward.*`` fields itself and every value is checked once, here.

Below the pool, the comparison code (:mod:`mathrl.reward.equiv`, :mod:`mathrl.reward.symbolic`) is handed
``rel_tol`` as an explicit argument down to where numbers are compared; nothing in the package keeps it
in module or context state.
"""

from __future__ import annotations

from dataclasses import dataclass

from mathrl.errors import InputError

__all__ = ["GradeOptions", "GradeOptionsError"]


class GradeOptionsError(InputError, ValueError):
    """A grading option out of range; ``option`` is its name as the caller wrote it (``rel_tol``, or
    ``reward.rel_tol`` for one read from a config by :meth:`GradeOptions.from_config`)."""

    def __init__(self, option: str, allowed: str, value: object) -> None:
        super().__init__(f"{option} must be {allowed}, got {value!r}")
        self.option, self.allowed, self.value = option, allowed, value


def _number(value: object) -> float | None:
    """``value`` as a float, or None when it is no number."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class GradeOptions:
    """How responses are graded.

    timeout: hard limit in seconds for one response in a worker (killed, graded ``timeout``; > 0).
    rel_tol: relative tolerance for numeric answers, ``|a - g| <= rel_tol * max(|a|, |g|)``; 0, the
             default, compares numbers exactly (0.333 is not 1/3); in [0, 1).
    workers: the shared worker pool's size (None: keep the pool there is, or usable CPUs, at most 16).

    Checked (and ``timeout``/``rel_tol`` made floats) when built; a bad value raises
    :class:`GradeOptionsError`, a ``ValueError``.
    """

    timeout: float = 5.0
    rel_tol: float = 0.0
    workers: int | None = None

    def __post_init__(self) -> None:
        timeout = _number(self.timeout)
        if timeout is None or not timeout > 0:
            raise GradeOptionsError("timeout", "a positive number of seconds", self.timeout)
        rel_tol = _number(self.rel_tol)
        if rel_tol is None or not 0.0 <= rel_tol < 1.0:
            raise GradeOptionsError("rel_tol", "a number in [0, 1)", self.rel_tol)
        workers = self.workers
        if workers is not None:
            try:
                workers = int(workers)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                workers = 0
            if workers < 1:
                raise GradeOptionsError("workers", ">= 1", self.workers)
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "rel_tol", rel_tol)
        object.__setattr__(self, "workers", workers)

    @classmethod
    def from_config(cls, cfg) -> GradeOptions:
        """The options of a :class:`mathrl.config.Config`: ``reward.timeout``, ``reward.rel_tol`` and
        ``reward.workers``. A bad value raises :class:`GradeOptionsError` naming the config key
        (``reward.rel_tol must be a number in [0, 1), got 1.5``)."""
        r = cfg.reward
        try:
            return cls(timeout=r.timeout, rel_tol=r.rel_tol, workers=r.workers)
        except GradeOptionsError as e:
            raise GradeOptionsError(f"reward.{e.option}", e.allowed, e.value) from None

    @classmethod
    def resolve(cls, options: GradeOptions | None = None, *, timeout: float | None = None,
                workers: int | None = None, rel_tol: float | None = None) -> GradeOptions:
        """``options``, or the options that the keyword shorthand of :func:`mathrl.reward.grade_batch` spells
        (``timeout=``, ``workers=``, ``rel_tol=``; the defaults for those not given). Giving both is a
        ``TypeError`` (which one would hold is not obvious)."""
        shorthand = {k: v for k, v in (("timeout", timeout), ("workers", workers), ("rel_tol", rel_tol))
                     if v is not None}
        if options is None:
            return cls(**shorthand)
        if not isinstance(options, GradeOptions):
            raise TypeError(f"options must be a GradeOptions, got {type(options).__name__}")
        if shorthand:
            raise TypeError(f"give GradeOptions or {', '.join(f'{k}=' for k in shorthand)}, not both")
        return options
