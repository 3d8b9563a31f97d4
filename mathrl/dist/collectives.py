"""The process group and the collectives every rank takes part in (gloo on CPU, NCCL on GPU).

Every collective of the trainer goes through :func:`all_reduce` and :func:`all_gather_objects` (the
tensors travel on :func:`device`, as NCCL needs), so no other module calls ``torch.distributed``
directly; without a process group they act as a world of one.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["DistInfo", "all_gather_objects", "all_ranks_ok", "all_reduce", "destroy_at_exit", "device", "free_port",
           "global_min", "global_sum", "init_distributed", "sum_over_ranks"]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a world of one, or a test's process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """All-reduce ``t`` over the world (``op`` = ``sum`` or ``max``) and return the result on ``t``'s device.

    The trainer's collectives go through here: the tensor travels on :func:`device` (NCCL refuses CPU
    tensors; gloo takes them), so callers can build their counts and flags wherever is convenient.
    Without an initialised process group it returns ``t`` unchanged (a world of one).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return t
    x = t.detach().to(device()).clone()
    dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return x.to(t.device)


def all_ranks_ok(flag: bool) -> bool:
    """True when ``flag`` is true on every rank (one all-reduce through :func:`all_reduce`)."""
    return float(all_reduce(torch.tensor([0.0 if flag else 1.0]))[0]) == 0.0


def global_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over the ranks (the ``reduce`` of the algo functions' global statistics)."""
    return all_reduce(t, "sum")


def sum_over_ranks(values: Sequence[float]) -> list[float]:
    """Each of ``values`` summed over the ranks, in float64 (host numbers: counts, losses of a step)."""
    return global_sum(torch.tensor([float(v) for v in values], dtype=torch.float64)).tolist()


def global_min(t: torch.Tensor) -> torch.Tensor:
    """Minimum of ``t`` over the ranks (a decision every rank must take the same way)."""
    return -all_reduce(-t, "max")


def all_gather_objects(obj: Any) -> list[Any]:
    """``[obj of rank 0, rank 1, ...]`` on every rank (picklable objects; ``[obj]`` in a world of one).

    torch's ``all_gather_object`` moves its byte tensors to the current CUDA device under NCCL itself.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _quiet_op_build_line(call):
    """``call()`` without DeepSpeed's ``DeepSpeed <op> built successfully`` line on stdout (printed at every
    start, also when the op was only loaded from its cache); everything else it prints passes through."""
    import contextlib
    import io
    import re
    import sys

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            return call()
    finally:
        kept = [line for line in buf.getvalue().splitlines(keepends=True)
                if not re.fullmatch(r"DeepSpeed \S+ built successfully\s*", line)]
        if kept:
            sys.stdout.write("".join(kept))
            sys.stdout.flush()


def destroy_at_exit() -> None:
    """Tear the process group down before the interpreter exits (registered by :func:`init_distributed`). Left to
    the C++ destructors at interpreter exit, a gloo group's threads can be destroyed while still joinable, which
    aborts the process (``terminate called without an active exception``, exit code -6) after a run that
    finished: torchrun then reports the job failed (seen in the fresh-clone CI of 1c8f80a, a two-rank test)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # exiting anyway: say so, never mask the run's own exit status
            print(f"mathrl: warning: tearing down the process group at exit: {exc}", file=sys.stderr, flush=True)


def init_distributed(timeout_minutes: float | None = None) -> DistInfo:
    """Initialise the process group once (gloo on CPU, nccl on GPU); it is destroyed at exit
    (:func:`destroy_at_exit`).

    Launched by ``deepspeed``/``torchrun`` the environment already names rank and
    world size; a plain ``mathrl train`` is a world of one on 127.0.0.1.
    """
    import deepspeed
    import torch.distributed as dist

    if "RANK" not in os.environ:
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1"})
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        kw = {}
        if timeout_minutes is not None:
            import datetime

            kw["timeout"] = datetime.timedelta(minutes=timeout_minutes)
        _quiet_op_build_line(lambda: deepspeed.init_distributed(dist_backend=backend, **kw))
        atexit.register(destroy_at_exit)
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(),
                    local_rank=int(os.environ.get("LOCAL_RANK", 0)))
