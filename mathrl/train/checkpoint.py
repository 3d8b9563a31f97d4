"""Checkpoints: atomic, self-describing, resumable.

Layout of ``<output_dir>/checkpoints/step_000010/``::

    policy/              Hugging Face folder (config, safetensors, tokenizer): load with
                         transformers or vLLM, or pass as --model to mathrl eval
    critic/              PPO only: backbone + value head (mathrl.models.value_head)
    ds_policy/ ds_critic/ DeepSpeed engine state: fp32 weights, optimizer, LR scheduler
    ref/                 iterative RL only: the reset reference model (safetensors)
    trainer_state.json   step, data position, metric history pointer, config
    MANIFEST.json        written last: every file with its size and SHA-256

A checkpoint is written under ``.tmp-step_000010`` and renamed to its final name
only when complete (files fsynced, manifest written last), so a crash leaves
either the previous checkpoints or a complete new one; leftover temporary
folders are removed at the next start. Sampling seeds and data order are pure
functions of (seed, step), so weights + optimizer + scheduler + step restore a
run exactly.

Loading never executes code from the checkpoint: weights are safetensors, the trainer state is
JSON, and DeepSpeed's ``.pt`` files are read with ``torch.load(weights_only=True)`` (see
:class:`mathrl.train.engines.SafeCheckpointEngine`). Before a resume every file is checked
against the manifest's SHA-256 (:func:`verify`), so a modified or corrupted file is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

CKPT_RE = re.compile(r"^step_(\d{6,})$")
MANIFEST = "MANIFEST.json"
STATE = "trainer_state.json"


def ckpt_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def step_dirname(step: int) -> str:
    return f"step_{step:06d}"


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        dfd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be trusted or written; the message names the file and what to do."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_RANK_FILE = re.compile(r"(?:^|_)zero_pp_rank_(\d+)_")


def file_owner(rel: str, world_size: int) -> int:
    """The rank that wrote (and hashes) a checkpoint file: DeepSpeed's per-rank shards
    (``*zero_pp_rank_<r>_*``) belong to rank r, everything else to rank 0 (which wrote it)."""
    m = _RANK_FILE.search(Path(rel).name)
    r = int(m.group(1)) if m else 0
    return r if r < world_size else 0


def hash_own_files(folder: Path, rank: int, world_size: int) -> dict[str, tuple[int, str]]:
    """``{relative path: (size, SHA-256)}`` of the files of ``folder`` that :func:`file_owner` gives
    this rank, each fsynced first. Every rank hashes its own shards, so a 7B checkpoint is not hashed
    by rank 0 alone while the other ranks wait in a collective."""
    out: dict[str, tuple[int, str]] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name == MANIFEST:
            continue
        rel = str(p.relative_to(folder))
        if file_owner(rel, world_size) != rank:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        out[rel] = (p.stat().st_size, sha256_file(p))
    return out


def write_manifest(folder: Path, extra: dict[str, Any] | None = None,
                   known: dict[str, tuple[int, str]] | None = None) -> None:
    """Write ``MANIFEST.json`` (sizes and SHA-256 of every file); ``known`` holds hashes other ranks
    already computed (:func:`hash_own_files`), the rest are hashed here."""
    files, hashes = {}, {}
    known = known or {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = str(p.relative_to(folder))
            files[rel] = p.stat().st_size
            if rel in known and known[rel][0] == files[rel]:
                hashes[rel] = known[rel][1]
            else:
                hashes[rel] = sha256_file(p)
    manifest = {"files": files, "sha256": hashes, **(extra or {})}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)


def is_complete(folder: Path) -> bool:
    """A checkpoint is complete when its manifest exists and every listed file has its size."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    for rel, size in manifest.get("files", {}).items():
        p = folder / rel
        if not p.is_file() or p.stat().st_size != size:
            return False
    return True


def verify(folder: Path, rank: int = 0, world_size: int = 1) -> None:
    """Check every file of a checkpoint against its manifest (size and SHA-256); raise CheckpointError.

    Files that are not in the manifest are refused too (something was added after the checkpoint
    was written). With several ranks each rank hashes the files :func:`file_owner` gives it (every
    rank calls this and the verdicts are combined); rank 0 also checks the file list."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / MANIFEST}: unreadable manifest ({exc}); not a complete mathrl checkpoint") \
            from None
    hashes = manifest.get("sha256")
    if not isinstance(hashes, dict):
        raise CheckpointError(f"{folder / MANIFEST}: no SHA-256 list; the checkpoint cannot be verified (written by "
                              "an older mathrl?); refusing to load it")
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST}
    extra = sorted(present - set(hashes))
    if extra and rank == 0:
        raise CheckpointError(f"{folder}: file {extra[0]} is not in the checkpoint's manifest (added after it was "
                              "written); refusing to load the checkpoint")
    for rel, digest in hashes.items():
        if file_owner(rel, world_size) != rank:
            continue
        p = folder / rel
        if not p.is_file():
            raise CheckpointError(f"{p}: listed in the manifest but missing; refusing to load the checkpoint")
        if sha256_file(p) != digest:
            raise CheckpointError(f"{p}: contents differ from the manifest's SHA-256 (modified or corrupted after "
                                  "it was written); refusing to load the checkpoint. Resume from an earlier one "
                                  "with train.resume=<path> or delete this checkpoint")


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = ckpt_root(output_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = CKPT_RE.match(p.name)
        if m and p.is_dir() and is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


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


def begin(output_dir: str | os.PathLike, step: int) -> Path:
    tmp = ckpt_root(output_dir) / f".tmp-{step_dirname(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path, step: int, keep_last: int, extra: dict[str, Any] | None = None,
           known: dict[str, tuple[int, str]] | None = None) -> Path:
    """fsync, write the manifest last (``known``: hashes computed by the ranks), rename into place,
    then prune old checkpoints."""
    _fsync_tree(tmp)
    write_manifest(tmp, {"step": step, **(extra or {})}, known=known)
    final = tmp.parent / step_dirname(step)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    dfd = os.open(tmp.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    complete = list_checkpoints(tmp.parent.parent)
    for _s, p in complete[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return final


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / STATE).read_text())
