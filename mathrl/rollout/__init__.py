"""Rollout stage: sample G responses per prompt with the policy's current weights.

`RolloutEngine` is the interface; `HFRolloutEngine` (transformers, in this process) and
`VLLMRolloutEngine` (vLLM in this process or in a worker interpreter) implement it;
`make_engine` picks one from the config's ``rollout.backend``. The records are `SamplingConfig`
and `RolloutBatch`. Only torch-level modules are imported here (the vLLM worker imports this
package in an interpreter with another transformers version); backends import lazily.
"""

from __future__ import annotations

from mathrl.rollout.base import PendingBatch, RolloutEngine
from mathrl.rollout.batch import RolloutBatch, Sample, SamplingConfig, collate
from mathrl.rollout.factory import ROLLOUT_BACKENDS, make_engine, resolve_backend
from mathrl.rollout.sync import iter_full_parameters

__all__ = [
    "ROLLOUT_BACKENDS", "PendingBatch", "RolloutBatch", "RolloutEngine", "Sample", "SamplingConfig", "collate", "iter_full_parameters",
    "make_engine", "resolve_backend", "HFRolloutEngine", "VLLMRolloutEngine",
]


def __getattr__(name: str):  # lazy backends
    if name == "HFRolloutEngine":
        from mathrl.rollout.hf import HFRolloutEngine  # here: backends import lazily (the vLLM worker imports mathrl.rollout under another transformers)

        return HFRolloutEngine
    if name == "VLLMRolloutEngine":
        from mathrl.rollout.vllm import VLLMRolloutEngine  # here: backends import lazily (the vLLM worker imports mathrl.rollout under another transformers)

        return VLLMRolloutEngine
    raise AttributeError(name)
