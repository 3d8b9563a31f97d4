"""Checkpoint folders on disk, whatever they hold: the atomic write (``.tmp-step_N`` renamed when complete,
files fsynced, ``MANIFEST.json`` with every file's size and SHA-256 written last, hashing shared by the
ranks), verification against the manifest, listing, and the trainer-state JSON. What a mathrl checkpoint
holds and how it is saved and restored is :mod:`mathrl.train.checkpoint`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from mathrl.errors import RunStopped

__all__ = ["CKPT_RE", "MANIFEST", "STATE", "CheckpointError", "begin", "ckpt_root", "commit", "file_owner",
           "hash_own_files", "incomplete_reason", "is_complete", "list_checkpoints", "read_state", "sha256_file",
           "step_dirname", "verify", "write_manifest"]


class CheckpointError(RunStopped, RuntimeError):
    """A checkpoint cannot be trusted or written; the message names the file and what to do."""


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


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_RANK_FILE = re.compile(r"(?:^|_)zero_pp_rank_(\d+)_|^(?:rollout_ahead|rng)_rank(\d+)\.pt$")


def file_owner(rel: str, world_size: int) -> int:
    """The rank that wrote (and hashes) a checkpoint file: DeepSpeed's per-rank shards
    (``*zero_pp_rank_<r>_*``), the batches sampled ahead (``rollout_ahead_rank<r>.pt``, asynchronous
    rollout) and the random generators' states (``rng_rank<r>.pt``) belong to rank r, everything else to
    rank 0 (which wrote it)."""
    m = _RANK_FILE.search(Path(rel).name)
    r = int(m.group(1) or m.group(2)) if m else 0
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
    return incomplete_reason(folder) is None


def incomplete_reason(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint (its manifest missing or unreadable, a listed file
    missing or of another size than listed), or None when it is complete."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (written last: the save did not finish, or the file was removed)"
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST} ({type(exc).__name__})"
    if not isinstance(manifest, dict):
        return f"unreadable {MANIFEST} (not a mapping)"
    for rel, size in manifest.get("files", {}).items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} is {p.stat().st_size} bytes, the manifest lists {size}"
    return None


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
    # the oldest go, never the one just written (a folder can hold checkpoints with higher step numbers, e.g.
    # after resuming from an earlier one by path)
    older = [p for _s, p in list_checkpoints(tmp.parent.parent) if p != final]
    for p in older[:max(0, len(older) - (keep_last - 1))] if keep_last > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return final


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / STATE).read_text())
