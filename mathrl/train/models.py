"""The trainer's models and engines: the policy, reference and critic as DeepSpeed engines, the
gradient guard, and the rollout engine with the weight sync between them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from mathrl.algo import advantages as adv_mod
from mathrl.config import Config, ConfigError
from mathrl.models.precision import enable_autocast
from mathrl.dist.collectives import DistInfo, device
from mathrl.dist.engines import build_engine, build_inference_engine, copy_weights, resolve_dtype, zero3_init
from mathrl.dist.ds_json import ds_config, inference_ds_config
from mathrl.train.forward import is_zero3
from mathrl.train.layouts import Layout, choose_layout, group_share, layout_request
from mathrl.models import load_causal_lm, load_tokenizer, resolve_model_path
from mathrl.models.loading import disable_dropout, set_attention
from mathrl.models.lora import AdapterOffReference, add_adapters, has_adapters, merged_parameters
from mathrl.models.precision import autocast_dtype, resolve_autocast
from mathrl.models.value_head import ValueModel
from mathrl.rollout import iter_full_parameters
from mathrl.rollout.colocate import ensure_awake, reload_weights_with
from mathrl.rollout.options import EngineOptions


class GradGuard:
    """Notices a NaN/inf gradient during backward, before any optimizer step.

    A hook on every trainable parameter adds the sum of the gradient flowing into it (before
    DeepSpeed reduces or partitions it) to a per-parameter running sum on the device: a sum is
    NaN/inf when any element is, and stays so when more is added. The hooks never wait for the
    device; :attr:`bad` checks all running sums at once (one host sync per optimizer step, not one per
    parameter and micro-batch) and names the first parameter whose gradient was NaN/inf.
    """

    def __init__(self, module: torch.nn.Module):
        self._sums: dict[str, torch.Tensor] = {}
        self._bad: str | None = None
        self._handles = [p.register_hook(self._hook(n)) for n, p in module.named_parameters() if p.requires_grad]

    def _hook(self, name: str):
        def check(grad: torch.Tensor) -> None:
            s = grad.detach().sum(dtype=torch.float32)
            prev = self._sums.get(name)
            self._sums[name] = s if prev is None else prev + s
        return check

    @property
    def bad(self) -> str | None:
        """The first parameter (in hook order) whose gradient held NaN/inf since :meth:`reset`, else None."""
        if self._bad is None and self._sums:
            names = list(self._sums)
            finite = torch.isfinite(torch.stack([self._sums[n] for n in names]))
            if not bool(finite.all()):  # the one host sync
                self._bad = names[int((~finite).nonzero()[0, 0])]
        return self._bad

    def reset(self) -> None:
        self._sums.clear()
        self._bad = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class Models:
    policy: Any                 # DeepSpeed engine
    ref: Any | None = None      # frozen module / ZeRO-3 engine
    critic: Any | None = None   # DeepSpeed engine
    prm: Any | None = None      # frozen process reward model (algo.advantage=grpo_ps): module / ZeRO-3 engine
    tokenizer: Any = None
    model_path: str = ""
    policy_guard: GradGuard | None = None
    critic_guard: GradGuard | None = None
    # each model's forward layout ("policy", "ref", "critic"), chosen once when the models are built
    layouts: dict[str, Layout] = field(default_factory=dict)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    import random

    random.seed(seed)


def optimizer_steps_per_rl_step(cfg: Config) -> int:
    """Optimizer steps in one RL step: one per mini-batch and PPO epoch (the LR schedule counts these)."""
    return cfg.updates_per_step


def build_models(cfg: Config, dist: DistInfo, total_steps: int, *, reference: bool | None = None) -> Models:
    """The policy engine (and reference, critic). ``total_steps`` is in RL steps; the LR schedule and
    its warm-up (``train.warmup_steps``, also RL steps) are sized in optimizer steps, since the scheduler
    advances once per optimizer step (:func:`optimizer_steps_per_rl_step` of them per RL step). ``reference``:
    load the reference model (default: when ``algo.kl_coef > 0``; the trainer asks its method)."""

    dtype = resolve_dtype(cfg.model.dtype)
    amp = compute_dtype(cfg, dtype, dist)
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tokenizer = load_tokenizer(path)
    seed_all(cfg.train.seed)
    stage3 = cfg.deepspeed.zero_stage == 3
    # ZeRO-3: load each model sharded (deepspeed.zero.Init), never whole on every rank
    policy_ds = ds_config(3, cfg.deepspeed.offload, micro_batch=1, world_size=dist.world_size,
                          grad_clip=cfg.train.max_grad_norm, dtype=dtype,
                          config_path=cfg.deepspeed.config_path) if stage3 else None
    with zero3_init(policy_ds):
        policy = load_causal_lm(path, dtype=dtype, gradient_checkpointing=cfg.model.gradient_checkpointing,
                                attn_implementation=cfg.model.attn_implementation)
    if cfg.model.disable_dropout:
        disable_dropout(policy)
    if cfg.model.lora is not None:  # after disable_dropout: model.lora.dropout is the adapters' own

        add_adapters(policy, cfg.model.lora)
    enable_autocast(policy, amp)
    t = cfg.train
    per = optimizer_steps_per_rl_step(cfg)
    common = dict(schedule=t.lr_schedule, warmup=t.warmup_steps * per, total_steps=total_steps * per,
                  stage=cfg.deepspeed.zero_stage, offload=cfg.deepspeed.offload, grad_clip=t.max_grad_norm,
                  dtype=dtype, world_size=dist.world_size, config_path=cfg.deepspeed.config_path)
    engine = build_engine(policy, lr=t.lr, weight_decay=t.weight_decay, **common)
    if cfg.model.lora is not None:
        _exclude_tied_frozen(engine)
    ref = None
    reference = cfg.algo.kl_coef > 0 if reference is None else reference
    if reference and cfg.model.lora is not None and not cfg.model.ref_model:

        ref = AdapterOffReference(engine.module)  # the base model: the policy with its adapters off
    elif reference:
        ref_path = resolve_model_path(cfg.model.ref_model, cfg.model.cache_dir) if cfg.model.ref_model else path
        with zero3_init(inference_ds_config(dtype, dist.world_size) if stage3 else None):
            ref_module = load_causal_lm(ref_path, dtype=dtype, attn_implementation=cfg.model.attn_implementation)
        disable_dropout(ref_module)  # a frozen reference runs in eval mode anyway; this also covers train()
        enable_autocast(ref_module, amp)
        ref = build_inference_engine(ref_module, stage=cfg.deepspeed.zero_stage,
                                     dtype=dtype, world_size=dist.world_size)
    critic = None
    if adv_mod.get_estimator_spec(cfg.advantage).needs_critic:
        cpath = resolve_model_path(cfg.model.critic_model, cfg.model.cache_dir) if cfg.model.critic_model else path
        with zero3_init(policy_ds):  # sharded like the policy under ZeRO-3
            critic_module = ValueModel.from_pretrained(cpath, dtype=dtype)
        set_attention(critic_module.backbone, cfg.model.attn_implementation)
        if cfg.model.disable_dropout:
            disable_dropout(critic_module)
        # the packed and shared-prompt paths call the backbone and the head directly
        enable_autocast(critic_module, amp, critic_module.backbone, critic_module.value_head)
        critic = build_engine(critic_module, lr=t.critic_lr, weight_decay=t.weight_decay, **common)
    prm = None
    if adv_mod.get_estimator_spec(cfg.advantage).level == "step":
        prm = load_prm(cfg, tokenizer, dtype, amp, dist)
    built = {"policy": engine, "ref": ref, "critic": critic}
    layouts = {role: choose_layout(m, layout_request(cfg), group_share(cfg))
               for role, m in built.items() if m is not None}
    return Models(policy=engine, ref=ref, critic=critic, prm=prm, tokenizer=tokenizer, model_path=path,
                  policy_guard=GradGuard(engine.module),
                  critic_guard=GradGuard(critic.module) if critic is not None else None, layouts=layouts)


def load_prm(cfg: Config, tokenizer, dtype: torch.dtype, amp: torch.dtype | None, dist: DistInfo):
    """The frozen process reward model of ``model.prm`` (a ``mathrl prm train`` folder), sharded under ZeRO-3 like
    the reference. It reads the policy's token ids, so its tokenizer must be the policy's: a different vocabulary
    raises a :class:`~mathrl.config.ConfigError` naming the first token that differs."""
    prm_tok = load_tokenizer(cfg.model.prm)
    mine, theirs = tokenizer.get_vocab(), prm_tok.get_vocab()
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:1]
        raise ConfigError(f"model.prm = {cfg.model.prm!r}: its tokenizer differs from the policy's ({len(theirs)} vs "
                          f"{len(mine)} tokens; first difference {diff}); the PRM reads the policy's token ids, so "
                          "train it (mathrl prm train --model) from a model with the policy's tokenizer")
    with zero3_init(inference_ds_config(dtype, dist.world_size) if cfg.deepspeed.zero_stage == 3 else None):
        module = ValueModel.from_pretrained(cfg.model.prm, dtype=dtype)
    set_attention(module.backbone, cfg.model.attn_implementation)
    disable_dropout(module)
    enable_autocast(module, amp, module.backbone, module.value_head)
    return build_inference_engine(module, stage=cfg.deepspeed.zero_stage, dtype=dtype, world_size=dist.world_size)


def compute_dtype(cfg: Config, dtype: torch.dtype, dist: DistInfo) -> torch.dtype | None:
    """The autocast dtype of ``model.autocast`` for parameters of ``dtype`` (None: plain forwards)."""
    from mathrl.models.precision import native_bf16  # here: looked up at call time, tests stand in for precision.native_bf16

    if dtype != torch.float32:
        return None  # bf16 parameters already run bf16 matmuls
    cuda, native = torch.cuda.is_available(), native_bf16()
    name = resolve_autocast(cfg.model.autocast, cuda=cuda, native=native)
    if cfg.model.autocast == "auto" and dist.rank == 0:
        where = "GPU" if cuda else f"CPU {'with' if native else 'without'} native bf16"
        print(f"mathrl: model.autocast=auto -> {name} ({where})", flush=True)
    amp = autocast_dtype(name)
    if amp == torch.bfloat16 and not cuda and not native and dist.rank == 0:
        print("mathrl: warning: model.autocast=bfloat16 on a CPU without native bf16 dot products (avx512_bf16 "
              "or AMX): bf16 matmuls are slower than float32 here; set model.autocast=off", flush=True)
    return amp


def _exclude_tied_frozen(engine) -> None:
    """DeepSpeed's ``exclude_frozen_parameters`` misses a frozen weight that is tied to another (the LM head
    of a model with tied embeddings: ``named_parameters`` lists it once, under the embedding's name), so a
    LoRA checkpoint would carry the whole vocabulary matrix. Drop every frozen name, tied ones included."""
    original = engine.module_state_dict

    def module_state_dict(*args, exclude_frozen_parameters: bool = False, **kwargs):
        sd = original(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if exclude_frozen_parameters:
            for name, p in engine.module.named_parameters(remove_duplicate=False):
                if not p.requires_grad:
                    sd.pop(name, None)
        return sd

    engine.module_state_dict = module_state_dict


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    if engine.zero_optimization_stage() == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    return engine.module.state_dict()


def iterative_reference(cfg: Config, models: Models) -> bool:
    return bool(cfg.algo.ref_update_every) and models.ref is not None


def reset_reference(models: Models) -> int:
    """Iterative RL: make the reference model a copy of the current policy (ZeRO-3: shard by shard)."""

    return copy_weights(models.ref, iter_full_parameters(models.policy.module))


def make_rollout(cfg: Config, models: Models):
    """The rollout engine. The hf backend shares the trainer's module when rollout is synchronous (no
    second copy of the weights, nothing to sync; under ZeRO-3 its parameters are gathered for each
    generation phase: :func:`generation_weights`); vLLM gets weights pushed."""

    opts = EngineOptions.from_config(cfg, purpose="train", device=device())
    # asynchronous rollout samples while the trainer updates: the hf engine needs its own copy then
    shared = models.policy.module if opts.backend == "hf" and not cfg.rollout.staleness else None
    engine = opts.build(models.model_path, tokenizer=models.tokenizer, model=shared)
    # rollout.sleep_level=2: a generation after a sleep with no sync since gets the trainer's weights pushed again

    reload_weights_with(engine, lambda: sync_weights(engine, models.policy))
    return engine


@contextlib.contextmanager
def generation_weights(rollout, engine):
    """The block in which ``rollout`` generates (a step's sampling, an evaluation). Where the hf engine
    shares a ZeRO-3 policy's module, the module's parameters are gathered whole on every rank for the
    block and DeepSpeed's per-layer gather hooks are off meanwhile (DeepSpeed's own
    ``unwrap_model_for_generation``, as TRL's ``unwrap_model_for_generation`` does), then partitioned
    again: the full weights exist only while generating, with no copy beside the shards and no sync.
    Every rank must enter the block together: ranks generate different numbers of times within it
    (evaluation chunks, dynamic-sampling rounds), which a gather per ``generate`` would deadlock on.
    Elsewhere it does nothing."""
    if getattr(rollout, "model", None) is not engine.module or not is_zero3(engine):
        yield
        return
    from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

    with unwrap_model_for_generation(engine):
        yield


def sync_weights(rollout, engine) -> int:
    """Push the trainer's current parameters into the rollout engine (ZeRO-3 shards gathered one at a time)."""


    if getattr(rollout, "model", None) is engine.module:
        return 0  # the hf engine shares the trainer's module: nothing to copy
    ensure_awake(rollout, weights_only=True)  # colocated schedule: weights back, KV cache still free
    if has_adapters(engine.module):  # LoRA: the engine has the base model's names; it gets W + scale * B A
        return rollout.update_weights(merged_parameters(engine.module))
    return rollout.update_weights(iter_full_parameters(engine.module))
