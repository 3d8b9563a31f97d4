"""vLLM sleep level 2 (the default of rollout.sleep_level): the engine's side of it on CPU, with a fake
``vllm.LLM`` around a small torch model (vLLM-CPU has no sleep mode).

After a level-2 sleep the weight memory comes back with garbage in it. `VLLMCore` saves the model's
buffers before the sleep and puts them back at the wake (a weight sync carries parameters only), fills
every parameter with NaN at the wake, and after the next `load_weights` refuses a sync that left any
parameter unwritten. `VLLMRolloutEngine` marks the schedule's weights valid only after a completed sync,
and the schedule refuses to generate before that.

What only a GPU can show (for the GPU check): with real vLLM, level 2 then wake(weights) + a full sync
gives the same greedy tokens and logprobs as the engine before the sleep, and frees the weights' memory
(``torch.cuda.mem_get_info`` free bytes after ``sleep(2)`` minus before, about the model's size plus the
KV cache), where level 1 frees the same but copies the weights to and from CPU memory.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mathrl.rollout import colocate
from mathrl.rollout.colocate import SleepSchedule
from mathrl.rollout.vllm_core import VLLMCore

GARBAGE = 123.0


class TinyVLLMModel(torch.nn.Module):
    """Stands in for the model inside a vLLM worker: parameters the sync writes (by their Hugging Face
    names, through ``load_weights``) and a buffer no checkpoint carries (vLLM's rotary ``cos_sin_cache``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(11, 4)
        self.lm_head = torch.nn.Linear(4, 11)
        self.register_buffer("cos_sin_cache", torch.linspace(-1.0, 1.0, 8).reshape(2, 4), persistent=False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        done = set()
        with torch.no_grad():
            for name, t in weights:
                params[name].copy_(t)
                done.add(name)
        return done


class FakeLLM:
    """The ``vllm.LLM`` calls VLLMCore makes; ``sleep(2)`` leaves garbage in the weights and buffers, as a
    level-2 sleep's freed-and-remapped memory holds (level 1 keeps them)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
        self.model = model
        self.calls: list[str] = []

    def collective_rpc(self, fn, args=()):
        return [fn(self.worker, *args)]

    def sleep(self, level=1):
        self.calls.append(f"sleep({level})")
        if level == 2:
            with torch.no_grad():
                for t in [*self.model.parameters(), *self.model.buffers()]:
                    t.fill_(GARBAGE)

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({','.join(tags) if tags else 'all'})")

    def reset_prefix_cache(self):
        return True


def make_core() -> tuple[VLLMCore, TinyVLLMModel, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyVLLMModel()
    core = VLLMCore.__new__(VLLMCore)  # everything __init__ sets after building the engine, without vLLM
    core.llm, core.on_cpu, core._inproc = FakeLLM(model), False, True
    core.sleeping, core.weights_dropped, core.weights_poisoned, core.weight_loader = False, False, False, None
    trainer = {n: p.detach().clone() + 0.5 for n, p in model.named_parameters()}  # the trainer's new weights
    return core, model, trainer


def test_level2_full_sync_restores_everything():
    core, model, trainer = make_core()
    buf = model.cos_sin_cache.clone()
    core.sleep(2)
    core.wake_up(["weights"])
    assert torch.equal(model.cos_sin_cache, buf)  # the buffer is back at the wake
    assert all(torch.isnan(p).all() for p in model.parameters())  # nothing valid until the sync
    assert core.load_weights(iter(trainer.items())) == len(trainer)
    core.wake_up(["kv_cache"])
    for n, p in model.named_parameters():
        assert torch.equal(p, trainer[n]), n
    assert torch.equal(model.cos_sin_cache, buf)
    assert core.llm.calls == ["sleep(2)", "wake_up(weights)", "wake_up(kv_cache)"]
    assert not core.sleeping and not core.weights_poisoned


def test_level2_sync_that_misses_a_parameter_is_refused():
    core, model, trainer = make_core()
    core.sleep(2)
    core.wake_up(["weights"])
    partial = [(n, t) for n, t in trainer.items() if not n.startswith("lm_head")]
    with pytest.raises(RuntimeError, match=r"level-2 sleep .* 2 engine parameter\(s\) without weights, e.g. "
                                           r"lm_head.bias, lm_head.weight.*rollout.sleep_level=1"):
        core.load_weights(iter(partial))
    core.load_weights(iter(trainer.items()))  # a complete sync afterwards is accepted
    assert not core.weights_poisoned


def test_level1_keeps_the_weights_and_checks_nothing():
    core, model, trainer = make_core()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    core.sleep(1)
    core.wake_up(["weights"])
    for n, p in model.named_parameters():  # level 1: the engine's own weights came back from CPU memory
        assert torch.equal(p, before[n]), n
    core.load_weights(iter([("embed_tokens.weight", trainer["embed_tokens.weight"])]))  # partial: fine
    assert not core.weights_poisoned and torch.equal(model.lm_head.weight, before["lm_head.weight"])


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({','.join(tags) if tags else 'all'})")

    def load_weights(self, named_tensors):
        self.calls.append("load_weights")
        return len(list(named_tensors))


def test_engine_generates_after_a_level2_sleep_only_once_a_sync_completed():
    """VLLMRolloutEngine (the product class, its vLLM core faked): after a level-2 sleep, waking for a
    generation is refused until update_weights has completed; level 1 needs no sync."""
    from mathrl.rollout.vllm import VLLMRolloutEngine

    for level in (2, 1):
        engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)
        engine._closed, engine._core = False, FakeCore()
        engine.sleep_schedule = SleepSchedule(engine, level)
        colocate.after_generate(engine)
        if level == 2:
            with pytest.raises(RuntimeError, match="sleep_level=2.*no weight sync has loaded them"):
                colocate.ensure_awake(engine)
            colocate.before_sync(engine)
            with pytest.raises(RuntimeError, match="sleep_level=2"):  # woken but not yet synced
                colocate.before_generate(engine)
        assert engine.update_weights([("w", torch.zeros(2))]) == 1
        colocate.before_generate(engine)
        assert engine.sleep_schedule.state == colocate.AWAKE
        assert engine._core.calls == [f"sleep({level})", "wake_up(weights)", "load_weights", "wake_up(kv_cache)"]


def test_level2_is_the_default():
    from mathrl.config import load_config

    assert load_config(None, []).rollout.sleep_level == 2
    assert SleepSchedule(FakeCore()).level == 2
