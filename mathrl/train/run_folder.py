"""The run folder: one run per ``train.output_dir``, and what resume does with it.

* :func:`holds_run`: what in a folder belongs to an earlier run (a fresh start there stops, or with
  ``train.overwrite`` moves it aside with :func:`move_aside`);
* :func:`find_resume`: the checkpoint ``train.resume`` names (``auto``: the newest complete one), and
  :func:`damaged_newer`: the incomplete checkpoints ``auto`` passes over (moved aside, never overwritten);
* :func:`clean_temporaries`: half-written checkpoint folders a crash left.

The checkpoint format itself (manifest, atomic commit, verification) is :mod:`mathrl.dist.checkpoint_io`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mathrl.dist.checkpoint_io import CKPT_RE, MANIFEST, ckpt_root, incomplete_reason, is_complete, list_checkpoints

__all__ = ["clean_temporaries", "damaged_newer", "find_resume", "holds_run", "move_aside"]


def find_resume(output_dir: str | os.PathLike, resume: str) -> Path | None:
    """The checkpoint to resume from: None for 'none'; the newest complete one for 'auto'; or a path."""
    if resume == "none":
        return None
    if resume == "auto":
        found = list_checkpoints(output_dir)
        return found[-1][1] if found else None
    p = Path(resume)
    if not is_complete(p):
        raise ValueError(f"train.resume={resume!r}: {p} is not a complete mathrl checkpoint (no valid {MANIFEST})")
    return p


def clean_temporaries(output_dir: str | os.PathLike) -> list[Path]:
    """Remove half-written checkpoint folders left by a crash."""
    root = ckpt_root(output_dir)
    removed = []
    if root.is_dir():
        for p in root.glob(".tmp-step_*"):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def damaged_newer(output_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """Checkpoint folders newer than the newest complete one that are not complete, with the reason
    (what ``--resume auto`` passes over), oldest first."""
    root = ckpt_root(output_dir)
    if not root.is_dir():
        return []
    complete = list_checkpoints(output_dir)
    newest = complete[-1][0] if complete else -1
    out = []
    for p in sorted(root.iterdir()):
        m = CKPT_RE.match(p.name)
        if m and p.is_dir() and int(m.group(1)) > newest:
            why = incomplete_reason(p)
            if why is not None:
                out.append((p, why))
    return out


def move_aside(path: Path, label: str) -> Path:
    """Rename ``path`` to ``<path>.<label>-<UTC time>`` beside it (never deleting anything); returns the new path."""
    import time as _time

    stamp = _time.strftime("%Y%m%d-%H%M%S", _time.gmtime())
    dest = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
    os.rename(path, dest)
    return dest


def holds_run(output_dir: str | os.PathLike) -> str | None:
    """What in ``output_dir`` belongs to an earlier run (checkpoints, logged metrics), as a short phrase;
    None when there is nothing to lose."""
    out = Path(output_dir)
    found = []
    root = ckpt_root(out)
    steps = sorted(p.name for p in root.iterdir() if CKPT_RE.match(p.name)) if root.is_dir() else []
    if steps:
        found.append(f"{len(steps)} checkpoint(s), newest {steps[-1]}")
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        with open(metrics, "rb") as fh:
            lines = sum(1 for line in fh if line.strip())
        found.append(f"{lines} line(s) of metrics.jsonl")
    return ", ".join(found) or None
