"""Progress bars for phases that take more than a few seconds (evaluation, ablation runs, benchmarks).

A bar with an ETA is drawn on an interactive terminal only: when stderr is a TTY and ``$CI`` is not
set. Logs, pipes and CI stay quiet. ``MATHRL_PROGRESS=1`` forces bars on, ``MATHRL_PROGRESS=0`` off.
"""

from __future__ import annotations

import os
import sys


def bars_enabled() -> bool:
    """Whether :class:`Progress` draws (see the module docstring)."""
    forced = os.environ.get("MATHRL_PROGRESS", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    if os.environ.get("CI"):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


class Progress:
    """``with Progress(total, "eval gsm8k", unit="problem") as bar: ... bar.update(k)``; a no-op when
    bars are off, so callers never branch on it."""

    def __init__(self, total: int | None, desc: str, *, unit: str = "it", enabled: bool | None = None):
        self.enabled = bars_enabled() if enabled is None else enabled
        self._bar = None
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False,
                             smoothing=0.1)

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set_postfix(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
