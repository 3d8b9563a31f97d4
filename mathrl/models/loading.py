"""Resolve a model spec (embedded name, local folder, hub id) and load it.

A spec is one of:

* an embedded alias (``embedded``, ``smollm2``): the bundled SmolLM2-135M-Instruct,
  converted on first use (:mod:`mathrl.models.embedded`);
* a local folder holding a Hugging Face model (``config.json``);
* a Hugging Face hub id (``Qwen/Qwen2.5-0.5B-Instruct``), loaded through
  transformers' normal hub path (cached in ``HF_HOME``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mathrl.models.embedded import cache_root, ensure_embedded_model, is_embedded
from mathrl.models.errors import ModelError
from mathrl.hub import offline_if_unreachable
from mathrl.models.lora import is_adapter_folder, merged_model_folder

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_model_path(spec: str, cache_dir: str | os.PathLike | None = None, *, key: str | None = None) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts.

    Embedded aliases become the converted cache folder; an existing local folder
    is returned as an absolute path (and must contain ``config.json``); a LoRA adapter folder
    (``adapter_config.json``) becomes its base model with the adapter merged, in the cache; anything
    that looks like a filesystem path but does not exist is an error; all else is
    treated as a hub id and returned unchanged.

    ``key`` (e.g. ``model.name``) names the config key the spec came from; error
    messages then start with ``key = 'spec':`` so the user knows what to change.
    """
    said = f"{key} = {spec!r}: " if key else ""
    if not spec:
        raise ModelError(f"{said}model spec is empty; give 'embedded', a local folder or a Hugging Face id")
    if is_embedded(spec):
        try:
            return str(ensure_embedded_model(cache_dir))
        except ModelError as exc:
            raise ModelError(f"{said}{exc}") from None
    p = Path(spec).expanduser()
    if p.is_dir():

        if is_adapter_folder(p):  # a LoRA adapter (a checkpoint's adapter/ folder): merged onto its base once
            return str(merged_model_folder(p, cache_root(cache_dir)))
        if not (p / "config.json").is_file():
            raise ModelError(f"{said}model folder {p} has no config.json; expected a Hugging Face "
                             "model folder (save_pretrained output) or a mathrl checkpoint's policy/ folder")
        return str(p.resolve())
    looks_local = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or p.suffix in {".json", ".safetensors", ".bin"}
    if looks_local:
        resolved = str(p.resolve())
        where = "" if resolved == spec else f" (resolved to {resolved})"
        what = "the folder does not exist" if key else f"model path {spec!r} does not exist"
        raise ModelError(f"{said}{what}{where}; fix: give an existing Hugging Face model folder (with "
                         "config.json), 'embedded', or a hub id such as Qwen/Qwen2.5-0.5B-Instruct")

    offline_if_unreachable(f"model {spec!r}")  # an offline machine: the local cache at once, no retries
    return spec


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """Map a config dtype name (``float32``/``bf16``/...) to a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name]
    except KeyError:
        raise ModelError(f"unknown dtype {name!r}; allowed: {', '.join(_DTYPES)}") from None


def one_line(text: object, limit: int = 300) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces, cut to ``limit``
    characters: library exceptions often span lines, and mathrl's user errors are one line each."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _hub_hint(spec: str, exc: Exception) -> ModelError:
    text = str(exc)
    if "Weights only load failed" in text:  # torch refused a pickle that is not plain tensors: nothing ran
        import re

        what = re.search(r"(?:unsupported|Unsupported global:) (GLOBAL [\w.]+)|(Unsupported operand [^\s]+)", text)
        return ModelError(
            f"cannot load model {spec!r}: its weights file is a pickle that holds more than tensors "
            f"({(what.group(1) or what.group(2)) if what else 'not plain tensors'}); mathrl loads pickles with torch's "
            "weights_only=True "
            "and runs none of their code. Use a safetensors copy from a source you trust")
    local = Path(str(spec)).expanduser().exists()
    hint = ("" if local else ". If this is a hub id, the hub may be unreachable (offline machine?): download it "
            "elsewhere and pass the local folder, or use the embedded model (mathrl eval --model embedded, "
            "mathrl train model.name=embedded)")
    return ModelError(f"cannot load model {spec!r}: {type(exc).__name__}: {one_line(exc)}{hint}")


def load_tokenizer(spec: str, *, cache_dir: str | os.PathLike | None = None, padding_side: str = "left"):
    """Load the tokenizer of a model spec; pad = eos when the model defines no pad token."""
    from transformers import AutoTokenizer

    path = resolve_model_path(spec, cache_dir)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise _hub_hint(spec, exc) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability in ``model`` to 0; returns how many were non-zero.

    Covers ``nn.Dropout`` modules and the float attributes attention layers pass to the attention
    kernel (``attention_dropout`` / ``dropout`` in Llama, Qwen2, ...), and the config's ``*dropout*``
    fields so that a saved checkpoint says what was trained."""
    changed = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) and m.p:
            m.p, changed = 0.0, changed + 1
        for attr in ("attention_dropout", "dropout"):
            v = getattr(m, attr, None)
            if isinstance(v, float) and v:
                setattr(m, attr, 0.0)
                changed += 1
    cfg = getattr(model, "config", None)
    if cfg is not None:
        for key, v in list(vars(cfg).items()):
            if "dropout" in key and isinstance(v, float) and v:
                setattr(cfg, key, 0.0)
    return changed


def set_attention(model, attn_implementation: str | None) -> None:
    """Switch ``model``'s attention kernel (``model.attn_implementation``); None leaves it. A kernel this
    machine cannot run (flash_attention_2 without the flash-attn package or a GPU) is a ModelError
    naming the setting."""
    if attn_implementation is None:
        return
    try:
        model.set_attn_implementation(attn_implementation)
    except (ImportError, ValueError, RuntimeError) as exc:
        raise ModelError(f"model.attn_implementation={attn_implementation}: {str(exc).splitlines()[0]} "
                         f"(allowed here: sdpa, eager, or leave it unset)") from None


def load_causal_lm(spec: str, *, dtype: str | torch.dtype = "float32",
                   cache_dir: str | os.PathLike | None = None, gradient_checkpointing: bool = False,
                   attn_implementation: str | None = None):
    """Load a causal LM from a model spec in ``dtype`` (float32 on CPU), with the attention kernel
    ``attn_implementation`` (None: transformers' default)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(spec, cache_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    except Exception as exc:
        raise _hub_hint(spec, exc) from None
    set_attention(model, attn_implementation)
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False
    return model
