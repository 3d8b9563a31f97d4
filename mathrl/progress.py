"""Progress for phases that take more than a few seconds (evaluation, model conversion, ablation runs).

A bar with an ETA is drawn on an interactive terminal only: when stderr is a TTY and ``$CI`` is not
set. Elsewhere (a log file, a pipe, CI) a phase that has run for ``LINE_AFTER`` seconds prints a plain
line to stderr every ``LINE_EVERY`` seconds (``mathrl: [gsm8k] generating: 40/128 problem (31%), 1m02s,
~2m15s left``), so a log never goes silent for minutes. ``MATHRL_PROGRESS=1`` forces bars on,
``MATHRL_PROGRESS=0`` turns bars and lines off.
"""

from __future__ import annotations

import os
import sys
import time

LINE_AFTER = 10.0   # seconds before a phase's first progress line in a log
LINE_EVERY = 30.0   # seconds between progress lines


def _quiet() -> bool:
    return os.environ.get("MATHRL_PROGRESS", "").strip().lower() in ("0", "false", "no", "off")


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


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
        # plain lines where no bar is drawn: not on ranks > 0 (enabled=False) and not with MATHRL_PROGRESS=0
        self._lines = enabled is None and not self.enabled and not _quiet()
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self._t0 = time.monotonic()
        self._last = self._t0 - LINE_EVERY  # the first line as soon as LINE_AFTER has passed
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False,
                             smoothing=0.1)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._lines:
            now = time.monotonic()
            if now - self._t0 >= LINE_AFTER and now - self._last >= LINE_EVERY:
                self._last = now
                print(f"mathrl: {self.line(now - self._t0)}", file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        """The progress line after ``elapsed`` seconds (``done/total unit (pct), elapsed, ~left``)."""
        if self.total:
            pct = self.done / self.total
            left = f", ~{_clock(elapsed * (1 - pct) / pct)} left" if 0 < pct < 1 else ""
            return f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0%}), {_clock(elapsed)}{left}"
        return f"{self.desc}: {self.done} {self.unit}, {_clock(elapsed)}"

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


class SlowPhase:
    """``with SlowPhase("writing the checkpoint of step 12"): ...`` for a phase with no unit of progress to
    count: in a log a phase still running after ``LINE_AFTER`` seconds says so, again every ``LINE_EVERY``
    seconds, and says when it ended; a phase shorter than ``LINE_AFTER`` prints nothing. ``enabled=False``
    (ranks > 0) and ``MATHRL_PROGRESS=0`` keep it silent."""

    def __init__(self, desc: str, *, enabled: bool = True):
        self.desc = desc
        self.enabled = enabled and not _quiet()
        self.said = False
        self._t0 = 0.0
        self._stop = None
        self._thread = None

    def __enter__(self) -> "SlowPhase":
        import threading

        self._t0 = time.monotonic()
        if self.enabled:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._watch, name="mathrl-slow-phase", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        wait = LINE_AFTER
        while not self._stop.wait(wait):
            self.said = True
            print(f"mathrl: {self.desc}: {_clock(time.monotonic() - self._t0)} so far", file=sys.stderr, flush=True)
            wait = LINE_EVERY

    def __exit__(self, exc_type, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self.said:
            how = "done" if exc_type is None else "stopped"
            print(f"mathrl: {self.desc}: {how} after {_clock(time.monotonic() - self._t0)}", file=sys.stderr,
                  flush=True)
