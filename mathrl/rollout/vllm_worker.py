"""The vLLM worker process: runs `VLLMCore` in an interpreter where ``import vllm`` works and serves
the trainer's `VLLMRolloutEngine` over a socket.

Started by the engine as ``<vllm_python> -m mathrl.rollout.vllm_worker --fd N`` with one end of a
``socket.socketpair()`` inherited as file descriptor N. It exits when the other end closes.

Protocol (``multiprocessing.connection.Connection`` framing on that socket; both ends are this
package, so pickled plain Python values are used for control messages):

* request ``{"op": name, ...}`` -> reply ``{"ok": True, "result": ...}`` or
  ``{"ok": False, "error": "...", "traceback": "..."}``.
* ops: ``init`` (model_path, dtype, seed, enable_prefix_caching, engine_kwargs, engine_options, dist),
  ``generate`` (prompt_ids, n, sampling: one dict, or one per prompt), ``raw_generate_timed``
  (benchmark baseline), ``score``, ``load_weights``, ``reset_prefix_cache``, ``sleep`` (level),
  ``wake_up`` (tags), ``info``, ``close``.
* ``load_weights`` is followed by a stream: for each tensor, a header
  ``{"name", "dtype", "shape", "nbytes"}`` then its raw bytes (``send_bytes``, received straight
  into a preallocated tensor), and finally ``None`` (or ``{"abort": reason}`` when the trainer's
  iterator failed). The worker feeds the tensors to vLLM one at a
  time while they arrive, so neither side holds a second copy of the model; nothing touches disk.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Iterator

import torch
from mathrl.rollout.vllm_core import VLLMCore

_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                torch.int32, torch.int8, torch.uint8, torch.bool)}


def recv_tensors(conn: Connection) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from the stream `send_tensors` writes, until its ``None`` end mark."""
    while True:
        head = conn.recv()
        if head is None:
            return
        if "abort" in head:
            raise RuntimeError(f"the trainer aborted the weight stream: {head['abort']}")
        dtype = _DTYPES[head["dtype"]]
        t = torch.empty(tuple(head["shape"]), dtype=dtype)
        if head["nbytes"]:
            n = conn.recv_bytes_into(t.view(-1).view(torch.uint8).numpy())
            if n != head["nbytes"]:
                raise RuntimeError(f"tensor {head['name']}: got {n} bytes, expected {head['nbytes']}")
        yield head["name"], t


def send_tensors(conn: Connection, named_tensors) -> int:
    """Write ``(name, tensor)`` pairs as headers + raw bytes, then the ``None`` end mark."""
    count = 0
    it = iter(named_tensors)
    while True:
        try:  # errors of the caller's iterator or tensors: tell the worker, then raise
            item = next(it, None)
            if item is None:
                break
            name, t = item
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            if str(t.dtype) not in _DTYPES:
                raise TypeError(f"update_weights: {name} has dtype {t.dtype}; supported: {sorted(_DTYPES)}")
        except Exception as exc:
            conn.send({"abort": f"{type(exc).__name__}: {exc}"})
            raise
        nbytes = t.numel() * t.element_size()
        conn.send({"name": name, "dtype": str(t.dtype), "shape": list(t.shape), "nbytes": nbytes})
        if nbytes:
            conn.send_bytes(t.view(-1).view(torch.uint8).numpy())
        count += 1
    conn.send(None)
    return count


def serve(conn: Connection) -> None:
    core = None
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            break
        op = req.get("op")
        try:
            if op == "init":

                core = VLLMCore(req["model_path"], dtype=req["dtype"], seed=req["seed"],
                                enable_prefix_caching=req["enable_prefix_caching"],
                                engine_kwargs=req["engine_kwargs"], engine_options=req.get("engine_options"),
                                dist=req.get("dist"))
                result = core.info()
            elif core is None:
                raise RuntimeError(f"op {op!r} before init")
            elif op == "generate":
                emit = (lambda i, grp: conn.send({"partial": (i, grp)})) if req.get("stream") else None
                result = {"groups": core.generate(req["prompt_ids"], req["n"], req["sampling"], emit=emit),
                          "engine_s": core.last_engine_s}
            elif op == "raw_generate_timed":
                result = core.raw_generate_timed(req["prompt_ids"], req["n"], req["sampling"])
            elif op == "score":
                result = core.score(req["prompt_ids"], req["response_ids"], req["temperature"])
            elif op == "load_weights":
                stream = recv_tensors(conn)
                try:
                    result = core.load_weights(stream)
                finally:
                    for _ in stream:  # drain on error so the protocol stays in step
                        pass
            elif op == "reset_prefix_cache":
                result = core.reset_prefix_cache()
            elif op == "sleep":
                result = core.sleep(req.get("level", 1))
            elif op == "wake_up":
                result = core.wake_up(req.get("tags"))
            elif op == "info":
                result = core.info()
            elif op == "close":
                core.close()
                conn.send({"ok": True, "result": None})
                break
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send({"ok": True, "result": result})
        except Exception as exc:  # reported to the trainer, which raises it
            conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fd", type=int, required=True, help="inherited socket file descriptor")
    args = ap.parse_args(argv)
    conn = Connection(args.fd)
    try:
        serve(conn)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
