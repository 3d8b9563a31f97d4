"""vLLM placement, engine settings, hub ids and the weight-loader choice: pure functions, no vLLM.

The GPU behaviour itself (external_launcher on several ranks, TP groups, sleep mode) needs GPUs; these
tests pin the decisions mathrl makes before handing over to vLLM."""

from __future__ import annotations

import pytest

from mathrl.rollout.vllm import merge_group_requests, vllm_model_source, worker_visible_devices
from mathrl.rollout.vllm_core import build_llm_kwargs, select_weight_loader, tp_groups

BASE = dict(model="m", tokenizer="m", dtype="bfloat16", seed=7, enable_prefix_caching=True,
            logprobs_mode="processed_logprobs", max_logprobs=1)


@pytest.mark.parametrize("world, tp", [(1, 1), (2, 1), (8, 1), (2, 2), (8, 2)])  # T divides the world size
def test_llm_kwargs_gpu(world, tp):
    for rank in range(world):
        kw, env = build_llm_kwargs("m", dtype="bfloat16", seed=7, tensor_parallel_size=tp, rank=rank,
                                   world_size=world, local_rank=rank % 8, on_cpu=False,
                                   gpu_memory_utilization=0.4)
        assert kw["gpu_memory_utilization"] == 0.4
        assert kw.get("tensor_parallel_size", 1) == tp
        assert "enable_chunked_prefill" not in kw
        if world == 1:
            assert "distributed_executor_backend" not in kw and env == {}  # vLLM's default executor
            assert kw["seed"] == 7
        else:  # TRL's colocate mode: each rank on cuda:LOCAL_RANK, same seed within a TP group
            assert kw["distributed_executor_backend"] == "external_launcher"
            assert env == {"RANK": str(rank), "LOCAL_RANK": str(rank % 8), "WORLD_SIZE": str(world)}
            assert kw["seed"] == 7 + rank // tp
        assert {k: kw[k] for k in BASE if k != "seed"} == {k: v for k, v in BASE.items() if k != "seed"}


def test_llm_kwargs_world_of_one_cpu_is_the_old_call():
    """The CPU path: exactly the arguments mathrl passed before the settings moved to the config."""
    kw, env = build_llm_kwargs("/m", dtype="float32", seed=0, on_cpu=True, gpu_memory_utilization=0.4)
    assert env == {}
    assert kw == dict(model="/m", tokenizer="/m", dtype="float32", seed=0, enable_prefix_caching=True,
                      logprobs_mode="processed_logprobs", max_logprobs=1, gpu_memory_utilization=0.4,
                      enable_chunked_prefill=False)
    # several CPU ranks, in-process: each its own engine under vLLM's external launcher, as on GPU
    # (a worker process passes a world of one); run by tests/rollout/test_vllm_colocated.py
    kw2, env2 = build_llm_kwargs("/m", dtype="float32", seed=0, on_cpu=True, gpu_memory_utilization=0.4,
                                 rank=1, world_size=2, local_rank=1)
    assert kw2 == {**kw, "distributed_executor_backend": "external_launcher", "seed": 1}
    assert env2 == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}


def test_llm_kwargs_settings_and_overrides():
    kw, _ = build_llm_kwargs("m", max_model_len=2048, enable_sleep_mode=True, enforce_eager=True,
                             engine_kwargs={"enforce_eager": False, "max_num_seqs": 64}, on_cpu=False)
    assert kw["max_model_len"] == 2048 and kw["enable_sleep_mode"] is True
    assert kw["enforce_eager"] is False and kw["max_num_seqs"] == 64  # engine_kwargs win
    kw, _ = build_llm_kwargs("m", on_cpu=False)
    assert not {"max_model_len", "enable_sleep_mode", "enforce_eager", "tensor_parallel_size"} & set(kw)


def test_llm_kwargs_max_num_batched_tokens():
    """Passed on GPU (TRL's 4096: vLLM's start-up profiling runs one step of that many tokens); left out on
    CPU, where chunked prefill is off and vLLM sizes the step to max_model_len; engine_kwargs still win."""
    kw, _ = build_llm_kwargs("m", max_num_batched_tokens=4096, max_model_len=1280, on_cpu=False)
    assert kw["max_num_batched_tokens"] == 4096 and kw["max_model_len"] == 1280
    kw, _ = build_llm_kwargs("m", max_num_batched_tokens=4096, max_model_len=1280, on_cpu=True)
    assert "max_num_batched_tokens" not in kw and kw["enable_chunked_prefill"] is False
    kw, _ = build_llm_kwargs("m", max_num_batched_tokens=None, on_cpu=False)
    assert "max_num_batched_tokens" not in kw
    kw, _ = build_llm_kwargs("m", max_num_batched_tokens=4096, engine_kwargs={"max_num_batched_tokens": 8192},
                             on_cpu=False)
    assert kw["max_num_batched_tokens"] == 8192


def test_max_model_len_defaults_to_what_the_run_needs():
    from mathrl.config import ConfigError
    from mathrl.train.memory import context_for

    needs = {"rollout.max_tokens": ("training", 180, 1024), "eval.max_tokens": ("held-out", 200, 512)}
    # unset: 180 + 1024 = 1204 (more than 200 + 512), rounded up to a multiple of 256
    assert context_for(None, needs, 32768) == 1280
    assert context_for(None, needs, 1220) == 1220    # never beyond the model's context when that holds it
    assert context_for(None, needs, None) == 1280
    assert context_for(None, {"eval.max_tokens": ("held-out", 256, 256)}, 32768) == 512  # exact multiple
    assert context_for(4096, needs, 32768) == 4096  # set: kept
    with pytest.raises(ConfigError, match=r"rollout.max_model_len = 1000: the longest training prompt \(180 "
                                          r"tokens\) plus rollout.max_tokens = 1024 new tokens is 1204 tokens.*"
                                          r"at least 1204"):
        context_for(1000, needs, 32768)


def test_config_refuses_a_max_model_len_without_room_for_the_prompt():
    from mathrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"rollout.max_model_len = 256 leaves no room for a prompt before "
                                          r"rollout.max_tokens = 256 new tokens"):
        load_config(None, ["rollout.max_model_len=256", "rollout.max_tokens=256"])
    with pytest.raises(ConfigError, match=r"eval.max_tokens = 1024"):
        load_config(None, ["rollout.max_model_len=1000", "eval.max_tokens=1024"])
    assert load_config(None, ["rollout.max_model_len=1024"]).rollout.max_model_len == 1024
    cfg = load_config(None, [])
    assert cfg.rollout.max_model_len is None and cfg.rollout.max_num_batched_tokens == 4096


def test_llm_kwargs_refuse_bad_layouts():
    with pytest.raises(ValueError, match="must divide the world size"):
        build_llm_kwargs("m", tensor_parallel_size=2, world_size=3, rank=0, on_cpu=False)
    with pytest.raises(ValueError, match="needs GPUs"):
        build_llm_kwargs("m", tensor_parallel_size=2, world_size=2, on_cpu=True)


def test_tp_groups_and_prompt_split():
    assert tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tp_groups(8, 1) == [[r] for r in range(8)]
    assert tp_groups(2, 2) == [[0, 1]]
    # a TP group submits all its ranks' prompts (group-rank order), each with its own rank's sampling;
    # every rank keeps the slice of its own prompts
    ids, per_prompt, slices = merge_group_requests([([[1], [2]], {"seed": 10}), ([[3], [4], [5]], {"seed": 11})])
    assert ids == [[1], [2], [3], [4], [5]]
    assert [s["seed"] for s in per_prompt] == [10, 10, 11, 11, 11]
    assert [ids[s] for s in slices] == [[[1], [2]], [[3], [4], [5]]]


def test_worker_visible_devices():
    assert worker_visible_devices(3, None) == "3"
    assert worker_visible_devices(1, "4,5,6,7") == "5"
    with pytest.raises(ValueError, match="has 2 GPUs"):
        worker_visible_devices(2, "0,1")


def test_hub_ids_are_accepted(tmp_path):
    """A hub id goes to vLLM unchanged (vLLM downloads it); no network here: only the decision."""
    from mathrl.models import resolve_model_path

    for spec in ("Qwen/Qwen2.5-Math-1.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"):
        assert vllm_model_source(spec, resolve_model_path(spec)) == ("hub", spec)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert vllm_model_source(str(folder), resolve_model_path(str(folder))) == ("local", str(folder.resolve()))
    with pytest.raises(ValueError, match="local model folder or a hub id"):
        vllm_model_source("a/b/c", "a/b/c")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        vllm_model_source(str(empty), str(empty))


class _Model:
    def __init__(self):
        self.loaded = None

    def load_weights(self, weights):
        self.loaded = list(weights)


class _Runner:
    def __init__(self):
        self.model = _Model()


class _NewWorker:  # vLLM 0.32: layerwise reload from an iterator
    def __init__(self):
        self.model_runner = _Runner()
        self.reloaded = None

    def reload_weights(self, weights_iterator=None, is_checkpoint_format=True):
        self.reloaded = list(weights_iterator)


class _ReloadRunner(_Runner):
    def __init__(self):
        super().__init__()
        self.reloaded = None

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        self.reloaded = list(weights_iterator)


class _OldReloadRunner(_Runner):
    def reload_weights(self):
        raise AssertionError("must not be called: it would reload the original checkpoint")


class _ForwardingWorker:  # vLLM 0.32's Worker: reload_weights(*args, **kwargs) -> model_runner.reload_weights
    def __init__(self, runner):
        self.model_runner = runner

    def reload_weights(self, *args, **kwargs):
        self.model_runner.reload_weights(*args, **kwargs)


class _OldReloadWorker:  # around vLLM 0.14: reload_weights(self) re-reads the checkpoint from disk
    def __init__(self):
        self.model_runner = _Runner()

    def reload_weights(self):
        raise AssertionError("must not be called: it would reload the original checkpoint")


class _NoReloadWorker:
    def __init__(self):
        self.model_runner = _Runner()


class _Wrapper:  # vLLM's WorkerWrapperBase holds the worker in .worker
    def __init__(self, worker):
        self.worker = worker


def test_select_weight_loader():
    w = [("a", 1), ("b", 2)]
    new = _NewWorker()
    kind, load = select_weight_loader(_Wrapper(new))
    assert kind == "reload_weights"
    load(iter(w))
    assert new.reloaded == w and new.model_runner.model.loaded is None
    fwd = _ForwardingWorker(_ReloadRunner())
    kind, load = select_weight_loader(_Wrapper(fwd))
    assert kind == "reload_weights"
    load(iter(w))
    assert fwd.model_runner.reloaded == w and fwd.model_runner.model.loaded is None
    for worker in (_OldReloadWorker(), _NoReloadWorker(), _ForwardingWorker(_OldReloadRunner())):
        kind, load = select_weight_loader(worker)
        assert kind == "load_weights"
        load(iter(w))
        assert worker.model_runner.model.loaded == w
    with pytest.raises(RuntimeError, match="no way to load weights"):
        select_weight_loader(object())
