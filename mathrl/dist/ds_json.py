"""DeepSpeed's JSON configs: the ``ds_configs/*.json`` files with their ``"auto"`` values filled from the
mathrl config, a user's own JSON checked before DeepSpeed starts (``deepspeed.config_path``), the
optimizer block ZeRO-Offload needs, and the config of a frozen ZeRO-3 model."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
from mathrl.config import ConfigError

REPO_DS_CONFIGS = Path(__file__).resolve().parents[2] / "ds_configs"


def ds_config(stage: int, offload: str, *, micro_batch: int, world_size: int, grad_clip: float,
              dtype: torch.dtype, config_path: str | None = None) -> dict[str, Any]:
    """Load the DeepSpeed JSON for ``stage``/``offload`` and fill its ``"auto"`` values.

    ``train_batch_size`` is ``micro_batch * world_size`` (one caller-owned accumulation
    boundary per step; micro-batch counts vary with the token budget). A user's JSON
    (``config_path``) is checked first: invalid JSON, or numeric batch sizes that do not
    multiply out, raise :class:`mathrl.config.ConfigError` (see :func:`check_batch_sizes`).
    """
    if config_path:
        path = Path(config_path)
    else:
        name = {("none", 0): "zero1", ("none", 1): "zero1", ("none", 2): "zero2", ("none", 3): "zero3",
                ("optimizer", 2): "zero2_offload", ("optimizer", 3): "zero3_offload",
                ("all", 3): "zero3_offload"}.get((offload, stage))
        if name is None:
            raise ValueError(f"deepspeed.offload={offload!r} needs zero_stage 2 or 3 ('all' needs 3), got {stage}")
        path = REPO_DS_CONFIGS / f"{name}.json"
    if config_path:
        cfg = read_ds_json(path)
        check_batch_sizes(cfg, world_size, path, micro_auto=micro_batch)
    else:
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read DeepSpeed config {path}: {exc}") from None
    cfg = copy.deepcopy(cfg)
    if config_path is None:
        cfg["zero_optimization"]["stage"] = stage
        if stage == 3 and offload == "optimizer":
            cfg["zero_optimization"].pop("offload_param", None)
    if cfg.get("train_micro_batch_size_per_gpu") in (None, "auto"):
        cfg["train_micro_batch_size_per_gpu"] = micro_batch
    if cfg.get("gradient_accumulation_steps") in (None, "auto"):
        cfg["gradient_accumulation_steps"] = 1
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * world_size
    if cfg.get("gradient_clipping") == "auto":
        cfg["gradient_clipping"] = float(grad_clip)
    bf16 = cfg.setdefault("bf16", {})
    if bf16.get("enabled") == "auto":
        bf16["enabled"] = dtype == torch.bfloat16
    if "fp16" in cfg and cfg["fp16"].get("enabled") == "auto":
        cfg["fp16"]["enabled"] = dtype == torch.float16
    fill_grad_accum_dtype(cfg, path if config_path else None)
    if not torch.cuda.is_available():
        zo = cfg.get("zero_optimization", {})
        for key in ("offload_optimizer", "offload_param"):
            if key in zo:
                zo[key]["pin_memory"] = False  # no pinned memory without CUDA
    return cfg


_FP32_NAMES = ("fp32", "float32", "float", "torch.float32")
_BF16_NAMES = ("bf16", "bfloat16", "torch.bfloat16")


def fill_grad_accum_dtype(cfg: dict[str, Any], path: str | os.PathLike | None = None) -> None:
    """Fill ``data_types.grad_accum_dtype``: the dtype the micro-batch gradients of one step are summed in.

    DeepSpeed's default is the model's dtype, so a bf16 run summed its token-budgeted micro-batches in
    bf16: a micro-batch gradient below half a bf16 ulp of the running sum (2^-9 of it) was lost. ``"auto"``
    (the ``ds_configs`` files) or an absent key becomes ``"fp32"`` for bf16 under ZeRO 1-3, where
    DeepSpeed 0.19 honours it: ZeRO-1 switches to its ``BF16_Optimizer`` (fp32 gradient buffer, full size
    on every rank: 4 bytes a parameter), ZeRO-2/3 keep fp32 gradient partitions. The summed gradient is
    still cast to bf16 once for the reduction over ranks (``communication_data_type``, default the model
    dtype). Under ZeRO-0 DeepSpeed refuses bf16 weights with fp32 accumulation ("unsupported mix"), so
    ``"auto"`` leaves bf16 there and an explicit fp32 is an error. Without bf16 the key is dropped
    (the model dtype, fp32). A value a user's JSON sets (``"bf16"`` to save the memory) is kept.

    Raises:
        ConfigError: fp32 accumulation asked for with bf16 under ZeRO stage 0.
    """
    dt = cfg.get("data_types")
    if dt is None:
        dt = {}
    bf16 = (cfg.get("bf16") or {}).get("enabled") is True
    stage = int((cfg.get("zero_optimization") or {}).get("stage", 0) or 0)
    want = dt.get("grad_accum_dtype", "auto")
    if want == "auto":
        if bf16 and stage >= 1:
            dt["grad_accum_dtype"] = "fp32"
        else:
            dt.pop("grad_accum_dtype", None)
    elif bf16 and stage == 0 and str(want).lower() in _FP32_NAMES:

        where = f"{path}: " if path else ""
        raise ConfigError(f"{where}data_types.grad_accum_dtype = {want!r} with bf16 and zero_optimization.stage 0: "
                          "DeepSpeed 0.19 accumulates bf16 gradients in fp32 only under ZeRO 1-3 (stage 0 stops with "
                          "'unsupported mix'); set deepspeed.zero_stage >= 1, or grad_accum_dtype \"auto\" or \"bf16\"")
    if dt:
        cfg["data_types"] = dt
    else:
        cfg.pop("data_types", None)


_DS_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _key_line(text: str, key: str) -> int | None:
    """1-based line of the first ``"key":`` in a JSON text (for messages), or ``None``."""
    import re

    m = re.search(r'"%s"\s*:' % re.escape(key), text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def read_ds_json(path: str | os.PathLike) -> dict[str, Any]:
    """Read a user's DeepSpeed JSON (``deepspeed.config_path``).

    Raises:
        ConfigError: unreadable file, invalid JSON (``file:line:column``), or not a JSON object.
    """

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"deepspeed.config_path = {str(path)!r}: cannot read it: {exc.strerror or exc}") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON in deepspeed.config_path: {exc.msg}; fix "
                          "the JSON, or unset deepspeed.config_path to use ds_configs/zero<stage>.json") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: deepspeed.config_path must hold a JSON object of DeepSpeed settings, "
                          f"got {type(value).__name__}")
    return value


def check_batch_sizes(ds: dict[str, Any], world_size: int, path: str | os.PathLike, *, micro_auto: int = 1,
                      text: str | None = None) -> None:
    """DeepSpeed's batch identity for a user's JSON, checked before DeepSpeed starts.

    DeepSpeed requires ``train_batch_size = train_micro_batch_size_per_gpu x
    gradient_accumulation_steps x world_size`` (``deepspeed/runtime/config.py``,
    ``_batch_assertion``). mathrl fills ``"auto"`` (or absent) values: the
    micro-batch with ``micro_auto`` (1: mathrl sizes micro-batches by
    ``train.micro_batch_tokens`` and owns the accumulation), accumulation with 1,
    and ``train_batch_size`` with the product, so only numbers the user wrote can
    disagree. A numeric ``train_batch_size`` that does not equal the product was
    silently replaced before; now it is an error naming the file, line and keys.

    Raises:
        ConfigError: a batch value that is not a positive integer or "auto", or numbers that
            do not multiply out.
    """

    path = Path(path)
    if text is None:
        try:
            text = path.read_text()
        except OSError:
            text = ""
    vals: dict[str, int | None] = {}
    for key in _DS_BATCH_KEYS:
        v = ds.get(key, "auto")
        if v == "auto" or v is None:
            vals[key] = None
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            line = _key_line(text, key)
            raise ConfigError(f"{path}{f':{line}' if line else ''}: {key} = {v!r} (deepspeed.config_path): must be a "
                              "positive integer or \"auto\"")
        vals[key] = v
    train = vals["train_batch_size"]
    micro = vals["train_micro_batch_size_per_gpu"] or micro_auto
    accum = vals["gradient_accumulation_steps"] or 1
    if train is None or train == micro * accum * world_size:
        return
    line = _key_line(text, "train_batch_size")
    product = micro * accum * world_size
    micro_note = " from \"auto\"" if vals["train_micro_batch_size_per_gpu"] is None else ""
    raise ConfigError(
        f"{path}{f':{line}' if line else ''}: train_batch_size = {train} (deepspeed.config_path) does not multiply "
        f"out: train_micro_batch_size_per_gpu ({micro}{micro_note}) x gradient_accumulation_steps ({accum}) x "
        f"world size ({world_size}) = {product}; fix: set \"train_batch_size\": {product}, or \"auto\" to let "
        "mathrl fill it (mathrl sizes micro-batches by train.micro_batch_tokens, so these numbers only have to agree)")


def offloads_optimizer(config: dict[str, Any]) -> bool:
    """True when the DeepSpeed config moves optimizer state off the accelerator (ZeRO-Offload)."""
    device = (config.get("zero_optimization", {}).get("offload_optimizer") or {}).get("device", "none")
    return str(device).lower() in ("cpu", "nvme")


def optimizer_block(config: dict[str, Any], *, lr: float, weight_decay: float, betas, eps: float = 1e-8) -> dict:
    """The ``"optimizer"`` block DeepSpeed builds its optimizer from under ZeRO-Offload.

    DeepSpeed refuses ZeRO-Offload with a client ``torch.optim`` optimizer (it would step the
    offloaded fp32 master weights with a slow Python loop); with ``"type": "AdamW"`` and the
    optimizer state on the CPU it builds ``DeepSpeedCPUAdam`` (a vectorised C++ AdamW, JIT-compiled
    once per machine). mathrl's ``train.lr`` / ``train.weight_decay`` fill the block; a block in
    the user's own JSON (``deepspeed.config_path``) is kept and only its ``"auto"`` values are filled.
    """
    mine = {"lr": lr, "betas": list(betas), "eps": eps, "weight_decay": weight_decay}
    block = copy.deepcopy(config.get("optimizer") or {"type": "AdamW", "params": {}})
    params = block.setdefault("params", {})
    for key, value in mine.items():
        if params.get(key, "auto") == "auto":
            params[key] = value
    return block


def inference_ds_config(dtype: torch.dtype, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config of a frozen ZeRO-3 model (the reference policy)."""
    return {"train_micro_batch_size_per_gpu": 1, "train_batch_size": world_size,
            "bf16": {"enabled": dtype == torch.bfloat16},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1e4}}
