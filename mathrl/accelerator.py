"""Which accelerator DeepSpeed builds for: ``DS_ACCELERATOR`` set before DeepSpeed is imported, from the
device files and ``CUDA_VISIBLE_DEVICES`` (never by initialising CUDA in the launching process). Used by
every entry point (``mathrl``, ``python -m mathrl.ablate.cli``)."""

from __future__ import annotations

import os
import re
import sys
from typing import Iterable, Mapping, MutableMapping

_NVIDIA_GPU_FILE = re.compile(r"^/dev/nvidia[0-9]+$")  # not nvidiactl, nvidia-uvm, nvidia-modeset, nvidia-caps


def ds_accelerator_choice(env: Mapping[str, str], device_files: Iterable[str]) -> tuple[str | None, str | None]:
    """What to put in ``DS_ACCELERATOR`` before DeepSpeed is imported, and a note for the console.

    DeepSpeed picks its accelerator once per process: ``DS_ACCELERATOR`` when set, else CUDA when
    ``torch.cuda.is_available()`` (the test :func:`mathrl.dist.collectives.device` makes too), else the CPU
    with a warning that it could not find a GPU. mathrl sets ``cpu`` only where no CUDA device can be
    visible, to spare that warning on a CPU machine: no ``/dev/nvidia<N>`` file (a container given only
    GPU 3 has ``/dev/nvidia3`` and no ``/dev/nvidia0``), no ``/dev/dxg`` (WSL2), and no
    ``CUDA_VISIBLE_DEVICES`` naming a device; or where GPUs exist but ``CUDA_VISIBLE_DEVICES`` is empty
    or ``-1`` (then the note says the GPUs are hidden). A ``DS_ACCELERATOR`` the user set is never
    changed. Anything else is left to DeepSpeed's own detection, which agrees with ``device()``.
    Checking files does not initialise CUDA in this (parent) process.

    Returns ``(value, note)``: ``value`` is ``"cpu"`` or ``None`` (leave it unset), ``note`` a line for
    stderr or ``None``.
    """
    if "DS_ACCELERATOR" in env:
        return None, None
    files = sorted(set(device_files))
    gpus = [f for f in files if _NVIDIA_GPU_FILE.match(f)]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and visible.strip() in ("", "-1")
    if gpus and hidden:
        return "cpu", (f"mathrl: CUDA GPUs are present ({', '.join(gpus)}) but CUDA_VISIBLE_DEVICES={visible!r} "
                       "hides them all: running on the CPU (unset CUDA_VISIBLE_DEVICES or name a device, e.g. "
                       "CUDA_VISIBLE_DEVICES=0, to use a GPU)")
    if gpus or "/dev/dxg" in files or (visible and not hidden):
        return None, None
    return "cpu", None


def device_files() -> list[str]:
    """The ``/dev`` entries :func:`ds_accelerator_choice` reads (``/dev/nvidia*``, ``/dev/dxg``)."""
    import glob

    return glob.glob("/dev/nvidia*") + glob.glob("/dev/dxg")


def set_ds_accelerator(env: MutableMapping[str, str] | None = None) -> str | None:
    """Apply :func:`ds_accelerator_choice` to ``env`` (default ``os.environ``); print its note once, on
    the first rank. Returns the value set, or ``None``."""
    env = os.environ if env is None else env
    value, note = ds_accelerator_choice(env, device_files())
    if value is not None:
        env["DS_ACCELERATOR"] = value
    if note and env.get("RANK", env.get("LOCAL_RANK", "0")) == "0":
        print(note, file=sys.stderr, flush=True)
    return value
