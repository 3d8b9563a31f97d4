"""LoRA adapters for the policy (Hu et al. 2021), through peft.

``model.lora = {r, alpha, dropout, target_modules, merged_checkpoints}`` trains low-rank adapters
instead of the full weights:

* The adapters are injected into the policy module in place (``peft.inject_adapter_in_model``): the
  model keeps its class and its ``forward`` (the trainer's shared-prompt forward and the hf rollout
  engine call it as before); only ``lora_A`` / ``lora_B`` require gradients, so the optimizer (and
  its state) holds only them.
* The reference model is the same module with the adapters switched off
  (:class:`AdapterOffReference`): no second copy of the weights in memory.
* A rollout engine with its own weights (vLLM, or hf under ZeRO-3) gets the merged weights
  ``W + (alpha / r) * B @ A`` under the base model's names (:func:`merged_parameters`).
* Checkpoints hold the adapter in peft's format (``adapter/``: ``adapter_config.json`` and
  ``adapter_model.safetensors``, loadable with ``peft.PeftModel.from_pretrained``) and, with
  ``merged_checkpoints`` (the default), the merged model as a plain Hugging Face folder (``policy/``);
  the DeepSpeed state saves the trainable (adapter) parameters and their optimizer state only.
  ``mathrl eval --model <checkpoint>/adapter`` merges an adapter folder onto its base model once
  (:func:`merged_model_folder`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from mathrl.registry import FIELD_CHECKS

__all__ = ["LORA_DEFAULTS", "check_lora", "lora_settings", "add_adapters", "has_adapters", "adapters_disabled",
           "AdapterOffReference", "merged_parameters", "adapter_state_dict", "save_adapter", "is_adapter_folder",
           "merged_model_folder"]

LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear",
                                 "merged_checkpoints": True}
ADAPTER = "default"
_PEFT_PREFIX = "base_model.model."


class LoraSpecError(ValueError):
    """A bad ``model.lora`` mapping (the message names the key and what is allowed)."""

    def __init__(self, msg: str, key: str | None = None):
        super().__init__(msg)
        self.key = key


@FIELD_CHECKS.register("model.lora")
def check_lora(spec: Any) -> None:
    """Raise :class:`LoraSpecError` unless ``spec`` is a valid ``model.lora`` mapping."""
    lora_settings(spec)


def lora_settings(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` over :data:`LORA_DEFAULTS`, checked."""
    if not isinstance(spec, Mapping):
        raise LoraSpecError(f"must be a mapping such as {{r: 16, alpha: 32}}, got {spec!r}")
    unknown = sorted(str(k) for k in spec if k not in LORA_DEFAULTS)
    if unknown:
        raise LoraSpecError(f"unknown key(s) {unknown}; allowed: {', '.join(LORA_DEFAULTS)}", unknown[0])
    s = {**LORA_DEFAULTS, **spec}
    if not isinstance(s["r"], int) or isinstance(s["r"], bool) or s["r"] < 1:
        raise LoraSpecError(f"= {s['r']!r}: the rank must be an integer >= 1 (e.g. 16)", "r")
    if not isinstance(s["alpha"], (int, float)) or isinstance(s["alpha"], bool) or not s["alpha"] > 0:
        raise LoraSpecError(f"= {s['alpha']!r}: alpha must be a number > 0 (the update is scaled by alpha / r)",
                            "alpha")
    if not isinstance(s["dropout"], (int, float)) or not 0 <= s["dropout"] < 1:
        raise LoraSpecError(f"= {s['dropout']!r}: dropout must be in [0, 1)", "dropout")
    tm = s["target_modules"]
    if not (tm == "all-linear" or (isinstance(tm, (list, tuple)) and tm and all(isinstance(x, str) and x for x in tm))):
        raise LoraSpecError(f"= {tm!r}: 'all-linear' (every linear layer but the LM head) or a list of module "
                            "names such as [q_proj, v_proj]", "target_modules")
    if not isinstance(s["merged_checkpoints"], bool):
        raise LoraSpecError(f"= {s['merged_checkpoints']!r}: true or false", "merged_checkpoints")
    s["alpha"] = float(s["alpha"])
    s["target_modules"] = tm if tm == "all-linear" else list(tm)
    return s


def _peft_config(s: dict[str, Any]):
    from peft import LoraConfig

    return LoraConfig(r=s["r"], lora_alpha=s["alpha"], lora_dropout=s["dropout"], target_modules=s["target_modules"],
                      bias="none", task_type="CAUSAL_LM")


def add_adapters(model: torch.nn.Module, spec: Mapping[str, Any]) -> torch.nn.Module:
    """Inject LoRA adapters into ``model`` in place and freeze everything else; returns ``model``.

    The adapters start as an exact no-op (``B = 0``), so the first step's policy equals the base model."""
    from peft import inject_adapter_in_model

    s = lora_settings(spec)
    inject_adapter_in_model(_peft_config(s), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    model.mathrl_lora = s  # read back by save_adapter and the checkpoint code
    return model


def has_adapters(model: torch.nn.Module) -> bool:
    return getattr(getattr(model, "module", model), "mathrl_lora", None) is not None


def _lora_layers(model: torch.nn.Module):
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model (every LoRA layer returns the base layer's output)."""
    layers = _lora_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class AdapterOffReference:
    """The reference model under LoRA: the policy module with its adapters switched off for the call.

    Stands where a reference module goes (``layout.logprobs(ref, ...)``); ``module`` is the policy module
    (its ``forward`` signature and config are the base model's)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.config = module.config

    def __call__(self, *args, **kwargs):
        with adapters_disabled(self.module):
            return self.module(*args, **kwargs)


def _gathered(params: list[torch.Tensor]):
    """Full tensors of ZeRO-3 partitioned parameters for the duration of the block (no-op otherwise)."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return contextlib.nullcontext()


def merged_parameters(model: torch.nn.Module, *, dtype: torch.dtype | None = None
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(base model name, tensor)`` for every base parameter, with each adapted weight merged:
    ``W + scaling * B @ A`` (``scaling = alpha / r``). LoRA parameters themselves are not yielded.
    ZeRO-3 parameters are gathered one layer at a time; the tensors are copies."""
    model = getattr(model, "module", model)
    layers = {id(getattr(m, "base_layer", None)): m for m in _lora_layers(model)}
    owner = {}
    for mod_name, mod in model.named_modules():
        if id(mod) in layers:
            owner[mod_name] = layers[id(mod)]
    for name, p in model.named_parameters():
        if ".lora_" in name:
            continue
        base_name = name.replace(".base_layer.", ".")
        mod_name = name.rsplit(".", 1)[0]
        layer = owner.get(mod_name) if name.endswith(".weight") else None
        if layer is None:
            with _gathered([p]):
                t = p.detach().clone()
        else:
            a, b = layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight
            with _gathered([p, a, b]):
                t = (p.detach().float() + layer.scaling[ADAPTER] * (b.detach().float() @ a.detach().float())).to(p.dtype)
        yield base_name, (t.to(dtype) if dtype is not None and t.dtype != dtype else t)


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights under peft's saved names (``base_model.model.<module>.lora_A.weight``), gathered."""
    model = getattr(model, "module", model)
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" not in name:
            continue
        key = _PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")
        with _gathered([p]):
            out[key] = p.detach().clone().contiguous()
    return out


def save_adapter(folder: Path, state_dict: Mapping[str, torch.Tensor], spec: Mapping[str, Any], base_model: str
                 ) -> None:
    """Write an adapter folder in peft's format (``adapter_config.json``, ``adapter_model.safetensors``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = _peft_config(lora_settings({k: v for k, v in spec.items() if k in LORA_DEFAULTS}))
    cfg.base_model_name_or_path = str(base_model)
    cfg.save_pretrained(str(folder))
    save_file(dict(state_dict), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file() and (Path(path) / "adapter_model.safetensors").is_file()


def merged_model_folder(adapter_dir: str | Path, cache_dir: str | Path) -> Path:
    """A Hugging Face folder of the base model with the adapter of ``adapter_dir`` merged in, made once
    under ``cache_dir/merged/<hash>`` (keyed by the adapter's files) and reused."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir = Path(adapter_dir)
    h = hashlib.sha256()
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        h.update((adapter_dir / f).read_bytes())
    dest = Path(cache_dir) / "merged" / h.hexdigest()[:16]
    if (dest / "config.json").is_file():
        return dest
    base = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    tmp = dest.with_name(dest.name + ".tmp")
    merged.save_pretrained(str(tmp), safe_serialization=True)
    tok_src = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else Path(base)
    AutoTokenizer.from_pretrained(str(tok_src)).save_pretrained(str(tmp))
    tmp.rename(dest)
    return dest
