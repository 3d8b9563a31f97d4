"""Every ``auto`` setting decided in one place, from the config and the machine.

=====================  =====================================================================================
setting                ``auto`` means
=====================  =====================================================================================
``model.dtype``        bfloat16 on a GPU, float32 on a CPU (bf16 matmuls are several times slower on AVX2 CPUs)
``model.autocast``     bfloat16 on a GPU or a CPU with native bf16 dot products (avx512_bf16, AMX), else off
``rollout.dtype``      ``model.dtype`` as resolved above
``algo.advantage``     grpo for ``algo.name=grpo``, gae for ppo (:attr:`Config.advantage`)
``algo.kl_in``         the reward for a token-level estimator, else the loss (:attr:`Config.kl_in`)
``algo.kl_estimator``  k1 with the KL in the reward, k3 in the loss (:attr:`Config.kl_estimator`)
``algo.clip_low``      the policy loss's paper value: ppo 0.2, gspo 3e-4, cispo 1.0 (:attr:`Config.clip_low`)
``algo.clip_high``     ppo 0.2, gspo 4e-4, cispo 0.28 (:attr:`Config.clip_high`)
``algo.loss_agg``      seq-mean-token-sum-norm for dr_grpo, seq-mean-token-mean for gspo, else token-mean
                       (:attr:`Config.loss_agg`)
=====================  =====================================================================================

``rollout.backend: auto`` (vLLM where it can be started, else hf) needs to try the vLLM interpreter, so the
rollout factory decides it (:func:`mathrl.rollout.factory.resolve_backend`), once per engine built.

The machine's facts come from :meth:`Machine.here`; :func:`resolve` gives every decision at once, and the
trainer prints the decided values at start-up. Nothing else in mathrl decides an ``auto``: the DeepSpeed engines
(:func:`mathrl.dist.engines.resolve_dtype`), autocast (:mod:`mathrl.models.precision`) and the rollout
engine's options (:mod:`mathrl.rollout.options`) call the functions here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mathrl.config.schema import Config

__all__ = ["Machine", "Resolved", "autocast", "cpu_has_native_bf16", "model_dtype", "resolve", "rollout_dtype"]


@dataclass(frozen=True)
class Machine:
    """The facts the ``auto`` settings depend on."""

    cuda: bool          # a CUDA device is usable by this process
    native_bf16: bool   # this CPU has native bf16 dot products (oneDNN's check: avx512_bf16, AMX)

    @staticmethod
    def here() -> Machine:
        """This process's machine (both probes are cheap; torch caches the CUDA one)."""
        import torch

        return Machine(cuda=torch.cuda.is_available(), native_bf16=cpu_has_native_bf16())


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has native bf16 dot products (oneDNN's check: avx512_bf16, AMX)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def model_dtype(name: str, machine: Machine | None = None) -> str:
    """``model.dtype`` (``auto``: bfloat16 on a GPU, float32 on a CPU)."""
    if name != "auto":
        return name
    return "bfloat16" if (machine or Machine.here()).cuda else "float32"


def autocast(name: str, machine: Machine | None = None) -> str:
    """``model.autocast`` (``auto``: bfloat16 on a GPU or on a CPU with native bf16 dot products, else ``off``;
    on an AVX2-only CPU the bf16 update was measured several times slower than float32)."""
    if name != "auto":
        return name
    m = machine or Machine.here()
    return "bfloat16" if m.cuda or m.native_bf16 else "off"


def rollout_dtype(cfg: Config, machine: Machine | None = None) -> str:
    """The rollout engine's dtype: ``rollout.dtype``, else the model's (:func:`model_dtype`)."""
    if cfg.rollout.dtype != "auto":
        return cfg.rollout.dtype
    return model_dtype(cfg.model.dtype, machine)


@dataclass(frozen=True)
class Resolved:
    """Every ``auto`` of a config, decided (the values a run uses)."""

    model_dtype: str
    autocast: str
    rollout_dtype: str
    advantage: str
    kl_in: str
    kl_estimator: str
    machine: Machine
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token-mean"

    def changed(self, cfg: Config) -> dict[str, str | float]:
        """``key -> value`` for the settings that were ``auto`` in ``cfg`` (what a run should say it decided)."""
        asked = {"model.dtype": (cfg.model.dtype, self.model_dtype),
                 "model.autocast": (cfg.model.autocast, self.autocast),
                 "rollout.dtype": (cfg.rollout.dtype, self.rollout_dtype),
                 "algo.advantage": (cfg.algo.advantage, self.advantage),
                 "algo.kl_in": (cfg.algo.kl_in, self.kl_in),
                 "algo.kl_estimator": (cfg.algo.kl_estimator, self.kl_estimator),
                 "algo.clip_low": (cfg.algo.clip_low, self.clip_low),
                 "algo.clip_high": (cfg.algo.clip_high, self.clip_high),
                 "algo.loss_agg": (cfg.algo.loss_agg, self.loss_agg)}
        return {k: v for k, (a, v) in asked.items() if a == "auto"}

    def to_dict(self) -> dict:
        return asdict(self)


def resolve(cfg: Config, machine: Machine | None = None) -> Resolved:
    """Every ``auto`` of ``cfg`` on ``machine`` (default: this one)."""
    m = machine or Machine.here()
    return Resolved(model_dtype=model_dtype(cfg.model.dtype, m), autocast=autocast(cfg.model.autocast, m),
                    rollout_dtype=rollout_dtype(cfg, m), advantage=cfg.advantage, kl_in=cfg.kl_in,
                    kl_estimator=cfg.kl_estimator, machine=m, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                    loss_agg=cfg.loss_agg)
