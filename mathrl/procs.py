"""Process helpers shared by the package, the scripts and the tests (Linux ``/proc``; stdlib only).

* :data:`DIST_ENV_VARS` and :func:`without_dist_env`: the variables that name a process group
  (``torch.distributed``'s env:// rendezvous). A child process meant to be a world of its own must
  not inherit them, or it would join (and hang on) its parent's rendezvous.
* :func:`child_processes`, :func:`child_pids`: one scan of ``/proc/<n>/stat`` for the processes
  whose parent is a given pid (default: this process).
* :func:`proc_state`, :func:`cmdline`, :func:`status_kb`: one field of one process, with a neutral
  value (None, ``b""``, 0) when the process is gone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["DIST_ENV_VARS", "without_dist_env", "child_processes", "child_pids", "proc_state", "cmdline",
           "status_kb"]

#: The environment variables of a process group (rank, world, rendezvous address).
DIST_ENV_VARS: tuple[str, ...] = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                  "MASTER_PORT")


def without_dist_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: ``os.environ``) without :data:`DIST_ENV_VARS`, in the same order."""
    if env is None:
        env = os.environ
    return {k: v for k, v in env.items() if k not in DIST_ENV_VARS}


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: [state, ppid, ...]. Raises OSError
    when the process is gone."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2 :].split()


def proc_state(pid: int | str) -> str | None:
    """The state letter of ``pid`` (``"R"``, ``"S"``, ``"Z"``, ...); None when it is gone."""
    try:
        return _stat_fields(pid)[0]
    except (OSError, ValueError, IndexError):
        return None


def child_processes(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, state) of every child of ``pid`` (default: this process), zombies included, in
    ``/proc`` order. Raises OSError where there is no ``/proc`` (not Linux)."""
    parent = str(os.getpid() if pid is None else pid)
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = _stat_fields(d)
            if fields[1] == parent:
                out.append((int(d), fields[0]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def child_pids(pid: int | None = None, *, zombies: bool = False) -> list[int]:
    """Pids of the children of ``pid`` (default: this process); zombies only when ``zombies``."""
    return [p for p, state in child_processes(pid) if zombies or state != "Z"]


def cmdline(pid: int | str) -> bytes:
    """``/proc/<pid>/cmdline`` (NUL-separated arguments); ``b""`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def status_kb(pid: int | str, key: str) -> int:
    """A ``/proc/<pid>/status`` field in kB (``VmRSS``, ``VmHWM``, ``VmSize``, ...); 0 when the
    process (or the field) is gone. ``pid`` may be ``"self"``."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
