"""The engine `mathrl eval` builds (issue 37, point 3): the hf backend runs on the trainer's device
(`mathrl.dist.collectives.device`), not on the CPU of a GPU machine, and `backend: auto` says once when it
falls back to hf because vLLM is missing."""

from __future__ import annotations

import pytest
import torch

import mathrl.eval.evaluate as ev
import mathrl.dist.collectives as collectives
from mathrl.config import load_config


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, embedded_model_path):
    from mathrl.models import load_tokenizer
    from mathrl.testing.tiny import save_tiny_model

    d = tmp_path_factory.mktemp("tiny") / "model"
    save_tiny_model(d, load_tokenizer(str(embedded_model_path)), seed=0)
    return d


def _cfg(*extra):
    return load_config(None, ["rollout.backend=hf", *extra])


def test_hf_engine_is_on_the_trainer_device(tiny_dir):
    engine = ev.make_eval_engine(_cfg(), str(tiny_dir), log=lambda m: None)
    try:
        assert engine.device == collectives.device()
    finally:
        engine.close()


def test_hf_engine_follows_device(tiny_dir, monkeypatch):
    """A GPU stand-in without CUDA: device() answering the meta device (the model moves there like to a
    GPU); the engine's weights must land on it, as they must land on cuda:N on a GPU machine."""
    monkeypatch.setattr(collectives, "device", lambda: torch.device("meta"))
    engine = ev.make_eval_engine(_cfg(), str(tiny_dir), log=lambda m: None)
    try:
        assert engine.device == torch.device("meta")
        assert {p.device.type for p in engine.model.parameters()} == {"meta"}
    finally:
        engine.close()


def test_auto_without_vllm_says_so_once(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(ev, "_SAID", set())
    said: list[str] = []
    cfg = _cfg("rollout.backend=auto", f"rollout.vllm_python={tmp_path / 'no-venv' / 'bin' / 'python'}")
    for _ in range(2):  # a checkpoint series builds one engine per checkpoint
        engine = ev.make_eval_engine(cfg, str(tiny_dir), log=said.append)
        assert type(engine).__name__ == "HFRolloutEngine" and engine.device == collectives.device()
        engine.close()
    assert len(said) == 1, said
    note = said[0]
    assert "rollout.backend=auto" in note and "hf" in note and "does not exist" in note  # the reason
    assert "pip install -e '.[gpu]'" in note and "rollout.backend=hf" in note           # the fixes
    # choosing hf explicitly says nothing
    monkeypatch.setattr(ev, "_SAID", set())
    ev.make_eval_engine(_cfg(), str(tiny_dir), log=said.append).close()
    assert len(said) == 1



def test_eval_and_training_build_the_engine_from_the_same_rollout_settings(tiny_dir, monkeypatch):
    """Issue 39, point 5: `mathrl eval` reads rollout.kv_cache_gb, max_model_len, max_num_batched_tokens,
    enforce_eager, dtype and seed as the trainer does (it used to pass only the backend and the model's
    dtype). The engine constructor is recorded instead of starting vLLM."""
    import mathrl.rollout as rollout_pkg
    import mathrl.rollout.options as options

    built: list[dict] = []
    monkeypatch.setattr(rollout_pkg, "make_engine", lambda backend, path, **kw: built.append(dict(kw, backend=backend)))
    cfg = _cfg("rollout.backend=vllm", "rollout.kv_cache_gb=3.5", "rollout.max_model_len=1536",
               "rollout.max_num_batched_tokens=4096", "rollout.enforce_eager=true", "rollout.dtype=bfloat16",
               "rollout.seed=17", "train.seed=3")
    ev.make_eval_engine(cfg, str(tiny_dir), log=lambda m: None)
    got = built[-1]
    assert got["backend"] == "vllm" and got["dtype"] == "bfloat16" and got["seed"] == 17
    assert (got["cpu_kv_cache_gb"], got["max_model_len"], got["max_num_batched_tokens"], got["enforce_eager"]) == (
        3.5, 1536, 4096, True)
    assert "sleep_between_steps" not in got and "gpu_memory_utilization" not in got  # colocation: training only

    train = options.EngineOptions.from_config(cfg, purpose="train")
    evaluation = options.EngineOptions.from_config(cfg, purpose="eval")
    assert (train.backend, train.dtype, train.seed) == (evaluation.backend, evaluation.dtype, evaluation.seed)
    assert {k: train.options[k] for k in evaluation.options} == evaluation.options
    # without rollout.dtype and rollout.seed: the model's dtype (auto: float32 on a CPU) and train.seed
    plain = options.EngineOptions.from_config(_cfg("rollout.backend=vllm", "train.seed=3"), purpose="eval")
    assert (plain.dtype, plain.seed) == ("bfloat16" if torch.cuda.is_available() else "float32", 3)
