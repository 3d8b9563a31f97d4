"""DeepSpeed behind a small interface: engine construction, LR schedules, engine checkpoints, weight copies
(the process group and collectives: :mod:`mathrl.dist.collectives`).

The trainer never touches DeepSpeed's config dictionaries directly: it asks for
an engine for a module with a learning rate, and this module fills the
``"auto"`` values of the chosen ``ds_configs/*.json`` from the mathrl config.

Gradient accumulation is *caller-owned* (``managed_gradient_accumulation:
false``): the trainer runs as many backward passes as its token-budgeted
micro-batches need, then one ``step()``. DeepSpeed averages gradients over
ranks, so the trainer scales its (globally normalised) micro-batch losses by the
world size; see :func:`mathrl.algo.losses.global_normalizers`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mathrl.config import auto
from mathrl.dist.collectives import device
from mathrl.dist.ds_json import ds_config, inference_ds_config, offloads_optimizer, optimizer_block
from mathrl.dist.checkpoint_io import CheckpointError


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``model.dtype`` (``auto`` decided by :func:`mathrl.config.auto.model_dtype`)."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[auto.model_dtype(name)]


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier of the base LR at optimizer step ``s`` (linear warm-up, then the schedule)."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine

    return f


def build_engine(module: torch.nn.Module, *, lr: float, weight_decay: float, schedule: str, warmup: int,
                 total_steps: int, stage: int, offload: str, grad_clip: float, dtype: torch.dtype,
                 world_size: int, config_path: str | None = None, betas=(0.9, 0.999)):
    """A DeepSpeed engine with AdamW and a LambdaLR schedule (``lr_lambda``).

    Without offload the optimizer is torch's AdamW passed as DeepSpeed's client optimizer
    (DeepSpeed's fused/CPU Adam JIT-compiles for minutes on first use and is not faster on a
    CPU-only run). With ZeRO-Offload (``deepspeed.offload=optimizer|all``, or an
    ``offload_optimizer`` block in the user's JSON) DeepSpeed builds the optimizer itself from an
    ``"optimizer"`` block (:func:`optimizer_block`) -- it refuses a client optimizer there -- and
    the schedule is handed over as a factory so it wraps DeepSpeed's optimizer. Either way the
    same AdamW hyper-parameters and the same schedule apply, and the schedule's state travels in
    DeepSpeed's checkpoint.
    """
    import deepspeed

    params = [p for p in module.parameters() if p.requires_grad]
    config = ds_config(stage, offload, micro_batch=1, world_size=world_size, grad_clip=grad_clip,
                       dtype=dtype, config_path=config_path)
    lam = lr_lambda(schedule, warmup, total_steps)
    if offloads_optimizer(config) or "optimizer" in config:
        config["optimizer"] = optimizer_block(config, lr=lr, weight_decay=weight_decay, betas=betas)
        engine, _, _, _ = deepspeed.initialize(
            model=module, model_parameters=params, config=config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lam))
    else:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=config)
    engine.checkpoint_engine = SafeCheckpointEngine(engine.checkpoint_engine)
    return engine


def load_engine_checkpoint(engine, folder: str, **kwargs) -> None:
    """``engine.load_checkpoint`` plus :func:`replay_cpu_adam_steps` (exact resume under ZeRO-Offload)."""
    engine.load_checkpoint(folder, tag="state", **kwargs)
    replay_cpu_adam_steps(engine)


def replay_cpu_adam_steps(engine) -> int:
    """Bring DeepSpeedCPUAdam's C++ bias-correction state to where an uninterrupted run has it.

    The C++ optimizer keeps ``beta^t`` as a float32 running product (multiplied by beta once per
    step) and recomputes it with ``pow(beta, t)`` only when the step count jumps, as it does on the
    first step after a checkpoint load. The two differ in the last bits, so a resumed ZeRO-Offload
    run drifted from the uninterrupted one by ~2e-7 (tests/train/test_offload.py). Replaying steps
    1..t on empty tensors rebuilds the same running product; nothing else in the optimizer changes.
    Returns the number of steps replayed (0 without DeepSpeedCPUAdam).
    """
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError:  # pragma: no cover - DeepSpeed is a dependency
        return 0
    opt = getattr(engine.optimizer, "optimizer", None)
    if not isinstance(opt, DeepSpeedCPUAdam):
        return 0
    steps = [int(st["step"]) for st in opt.state.values() if "step" in st]
    if not steps:
        return 0
    group = opt.param_groups[0]
    beta1, beta2 = group["betas"]
    empty = torch.empty(0, dtype=torch.float32)
    for t in range(1, max(steps) + 1):
        opt.ds_opt_adam.adam_update(opt.opt_id, t, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                                    group["bias_correction"], empty, empty.clone(), empty.clone(), empty.clone())
    return max(steps)


# the only non-tensor classes DeepSpeed 0.19 puts into its ZeRO checkpoints (found with
# torch.serialization.get_unsafe_globals_in_checkpoint on stage 1/2/3 checkpoints)
_DS_SAFE_GLOBALS = (
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
)


class SafeCheckpointEngine:
    """DeepSpeed's checkpoint engine with loading that cannot execute code from the file.

    DeepSpeed 0.19 reads its ``.pt`` state with ``torch.load(weights_only=False)``: a tampered
    file could run arbitrary code on resume. This wrapper loads with ``weights_only=True`` and
    allows exactly the few DeepSpeed classes its checkpoints hold; anything else is refused with
    a :class:`~mathrl.train.errors.CheckpointError` naming the file. Saving and every other
    method are the wrapped engine's.
    """

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def load(self, path: str, map_location=None):
        import importlib
        import pickle


        allowed = [getattr(importlib.import_module(m), n) for m, n in _DS_SAFE_GLOBALS
                   if hasattr(importlib.import_module(m), n)]
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{path}: refused to load: it needs Python objects a DeepSpeed checkpoint does not "
                                  f"hold ({first[:200]}). The file was modified or comes from an untrusted source."
                                  ) from None


class zero3_init:
    """Context for loading a Hugging Face model under DeepSpeed ZeRO-3: ``from_pretrained`` then runs
    inside ``deepspeed.zero.Init``, so each rank materialises only its shard of the weights (a 7B model
    is never built whole on every rank), as OpenRLHF does with ``HfDeepSpeedConfig``. Outside ZeRO-3
    (``config`` None or another stage) it does nothing. The global flag transformers reads is cleared on
    exit, so models built later (e.g. a rollout engine's own copy) load whole again.

    ``zero3_init.taken`` counts the loads that went through the sharded path (tests check it)."""

    taken = 0

    def __init__(self, config: dict[str, Any] | None):
        self.on = bool(config) and config.get("zero_optimization", {}).get("stage") == 3
        self.config = config
        self._hf = None

    def __enter__(self):
        if self.on:
            from transformers.integrations import HfDeepSpeedConfig

            self._hf = HfDeepSpeedConfig(self.config)  # transformers keeps a weak reference while it lives
            zero3_init.taken += 1
        return self

    def __exit__(self, *exc) -> None:
        if self.on:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            self._hf = None


def build_inference_engine(module: torch.nn.Module, *, stage: int, dtype: torch.dtype, world_size: int):
    """A frozen model (the reference policy). Sharded with ZeRO-3 when the policy is; else a plain module."""
    module.requires_grad_(False)
    module.eval()
    if stage != 3:
        return module.to(device())
    import deepspeed

    engine, *_ = deepspeed.initialize(model=module, config=inference_ds_config(dtype, world_size))
    engine.eval()
    return engine


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, named_tensors) -> int:
    """Copy ``(name, full_tensor)`` pairs into ``dst`` (a plain module or a ZeRO-3 engine); returns the count.

    Names are Hugging Face parameter names (no ``module.`` prefix). A ZeRO-3 parameter is gathered,
    overwritten on rank 0 and re-partitioned (``modifier_rank=0``), one parameter at a time. Every name
    of ``dst`` must be given exactly once (a missing or extra name is an error, not a silent skip).
    """
    target = getattr(dst, "module", dst)
    params = dict(target.named_parameters())
    seen = 0
    for name, tensor in named_tensors:
        if name not in params:
            raise KeyError(f"parameter {name!r} is not in the target model")
        p = params[name]
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                p.data.copy_(tensor.to(p.dtype))
        else:
            p.data.copy_(tensor.to(device=p.device, dtype=p.dtype))
        seen += 1
    if seen != len(params):
        raise KeyError(f"{len(params) - seen} parameters of the target model were not given")
    return seen


def discard_gradients(engine) -> None:
    """Drop every gradient accumulated since the last optimizer step (a skipped NaN/inf step).

    ``engine.zero_grad()`` alone is not enough: ZeRO keeps the gradients it already reduced in its
    own partition buffers, and they would be added to the next step's gradient (caught by
    tests/train/test_reliability.py). This clears them the way DeepSpeed's own overflow handling
    does for each stage.
    """
    opt = engine.optimizer
    stage = engine.zero_optimization_stage()
    if opt is None:
        return
    if stage in (1, 2):
        opt.zero_grad(set_to_none=True)
        if hasattr(opt, "_release_preflattened_grad_buffers"):
            opt._release_preflattened_grad_buffers()
        if getattr(opt, "cpu_offload", False):
            opt.reset_cpu_buffers()
            # ZeRO-Offload keeps the gradients of earlier micro-batches in CPU buffers and adds the
            # next backward to them while micro_step_id > 0; only step() resets it. Without this the
            # skipped step's NaN came back in the next step (tests/train/test_reliability.py, offload).
            for buf in (getattr(opt, "accumulated_grads_in_cpu", None) or {}).values():
                buf.zero_()
            if hasattr(opt, "_offload_accumulated_param_ids"):
                opt._offload_accumulated_param_ids = set()
        if hasattr(opt, "micro_step_id"):
            from deepspeed.runtime.zero.stage_1_and_2 import INITIAL_MICRO_STEP_ID

            opt.micro_step_id = INITIAL_MICRO_STEP_ID  # the state step() leaves: the next backward copies
        for k in list(getattr(opt, "averaged_gradients", {}) or {}):
            opt.averaged_gradients[k] = None
            if hasattr(opt, "all_grad_tensors"):
                opt.all_grad_tensors[k] = None
    elif stage == 3:
        opt.zero_grad(set_to_none=True)
        if getattr(opt, "offload_optimizer", False):
            opt.reset_cpu_buffers()
        else:
            opt.averaged_gradients = {}
    else:
        engine.zero_grad()
