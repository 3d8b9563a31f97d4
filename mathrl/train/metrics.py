"""Metrics: every value to JSON Lines and TensorBoard, a short line to the console.

``metrics.jsonl`` holds one JSON object per training step (and ``"event"``
records for evaluations). On resume, records after the resumed step are dropped
so the log of a resumed run equals that of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from mathrl.procs import child_pids

CONSOLE_KEYS = [("reward/mean", "reward", "{:.3f}"), ("reward/accuracy", "acc", "{:.3f}"),
                ("kl/mean", "kl", "{:.4f}"), ("response/length_mean", "len", "{:.0f}"),
                ("time/step", "s/step", "{:.1f}")]


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsLogger:
    def __init__(self, output_dir: str | Path, *, enabled: bool = True, tensorboard: bool = True,
                 wandb: bool = False, wandb_project: str = "mathrl", config: dict | None = None,
                 resume_step: int | None = None, total_steps: int = 0, console: str = "rich",
                 log_every: int = 1):
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self.samples_path = Path(output_dir) / "rollouts.jsonl"
        self.log_every = log_every
        self.total = total_steps
        self.console = console
        self._tb = None
        self._wandb = None
        self._t0 = time.time()
        self._write_failed = False
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate(resume_step)
        self._fh = open(self.path, "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(output_dir) / "tb"), purge_step=(resume_step or 0) + 1)
            except ImportError:
                print("mathrl: tensorboard is not installed; skipping TensorBoard logs", file=sys.stderr)
        if wandb:
            try:
                import wandb as wb

                self._wandb = wb.init(project=wandb_project, config=config, resume="allow")
            except ImportError:
                print("mathrl: wandb is not installed; skipping Weights & Biases", file=sys.stderr)

    def _truncate(self, resume_step: int | None) -> None:
        truncate_log(self.path, resume_step)
        truncate_log(self.samples_path, resume_step)

    def log(self, step: int, metrics: dict[str, float], event: str | None = None) -> None:
        if not self.enabled:
            return
        rec = {"step": step, **({"event": event} if event else {}),
               **{k: _clean(v) for k, v in sorted(metrics.items())}}
        try:
            self._fh.write(json.dumps(rec) + "\n")
            self._fh.flush()
        except OSError as exc:  # a full disk must not end a run whose checkpoints may still fit elsewhere
            if not self._write_failed:
                print(f"mathrl: warning: could not append to {self.path} ({exc}); metrics of this and later steps "
                      "may be missing", file=sys.stderr, flush=True)
            self._write_failed = True
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k if not event else f"{event}/{k}", v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k if not event else f"{event}/{k}": v for k, v in metrics.items()}, step=step)
        if event is None and (step % self.log_every == 0 or step == self.total):
            parts = [f"step {step}/{self.total}"]
            for key, short, fmt in CONSOLE_KEYS:
                if key in metrics and isinstance(metrics[key], (int, float)):
                    parts.append(f"{short} {fmt.format(metrics[key])}")
            print(" | ".join(parts), flush=True)

    def log_samples(self, step: int, records: list[dict[str, Any]], show: bool = False) -> None:
        """Append a step's sampled completions to ``rollouts.jsonl``; with ``show``, print them as a table."""
        if not self.enabled or not records:
            return
        try:
            with open(self.samples_path, "a") as fh:
                fh.write("".join(json.dumps({"step": step, **{k: _clean(v) for k, v in r.items()}}) + "\n"
                                 for r in records))
        except OSError as exc:
            print(f"mathrl: warning: could not append to {self.samples_path} ({exc})", file=sys.stderr, flush=True)
        if show:
            print(samples_table(step, records), flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def truncate_log(path: Path, resume_step: int | None) -> None:
    """Make a JSON Lines log (one ``"step"`` per record) that of the resumed run: without a resume the
    old file goes; on resume the records after ``resume_step`` go (lines torn by a crash too), atomically."""
    if not path.exists():
        return
    if resume_step is None:
        path.unlink()
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash
        if rec.get("step", 0) <= resume_step:
            keep.append(line)
    tmp = path.with_name(path.name + ".tmp")  # a crash here must not lose the log
    tmp.write_text("".join(k + "\n" for k in keep))
    os.replace(tmp, path)


def _short(text: Any, width: int) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def samples_table(step: int, records: list[dict[str, Any]], width: int = 48) -> str:
    """A plain-text table of sampled completions (the end of the prompt, the response, the answers)."""
    head = ["prompt (end)", "response", "answer", "gold", "reward", "adv"]
    rows = [[_short(str(r.get("prompt", ""))[-width:], width // 2), _short(r.get("response", ""), width),
             _short(r.get("extracted"), 12), _short(r.get("gold"), 12), f"{r.get('reward', 0.0):.2f}",
             f"{r.get('advantage', 0.0):+.2f}"] for r in records]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [f"samples of step {step}:", line(head), "-+-".join("-" * w for w in widths)]
    return "\n".join(out + [line(r) for r in rows])


def process_stats() -> dict[str, float]:
    """This process's resident memory (MB), open file descriptors and live child processes
    (``sys/*`` metrics: a leak shows as growth over a long run)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    out["sys/rss_mb"] = int(line.split()[1]) / 1024
                    break
        out["sys/open_fds"] = float(len(os.listdir("/proc/self/fd")))
        out["sys/children"] = float(len(child_pids(zombies=True)))
    except OSError:  # not Linux: peak RSS only
        import resource

        out["sys/rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform ==
                                                                                 "darwin" else 1024)
    return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
