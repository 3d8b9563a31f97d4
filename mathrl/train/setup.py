"""Starting a training run, shared by every method (RL in :mod:`mathrl.train.loop`, SFT/RFT in
:mod:`mathrl.ablate`): version and input checks, the process group, the run folder, resume and the
metrics log."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from mathrl.config import Config, ConfigError, rules
from mathrl.dist.checkpoint_io import ckpt_root
from mathrl.train import run_folder
from mathrl.train.checkpoint import State, load_checkpoint
from mathrl.dist.collectives import DistInfo, init_distributed
from mathrl.train.metrics import MetricsLogger
from mathrl.train.models import Models
from mathrl.train.preflight import preflight
from mathrl.versions import check_versions


def restore_torch_linear() -> bool:
    """Put back torch's own ``torch.nn.functional.linear`` when an earlier DeepSpeed ZeRO-3 model in this
    process replaced it; returns whether it did.

    ZeRO-3 (``deepspeed.zero.Init``, and ``deepspeed.initialize`` of a stage-3 engine) swaps
    ``torch.nn.functional.linear`` for its memory-efficient autograd function (``zero3_linear_wrap``:
    matmul, then the bias added as a separate op, and its own backward) and never swaps it back
    ("This will persist unless manually reset"). Every later model in the process, a ZeRO-0/1/2 run's
    included, then computes its linear layers with it: in bfloat16 that rounds differently (the bias is
    added after the product was rounded to bf16), so the same run gave other weights after a ZeRO-3 run
    in the same process than before one. The first GPU check (a resume after the ZeRO-3 runs, compared with
    a run made before them) differed by up to 3e-5 this way; float32 happens to round alike. A ZeRO-3 run
    puts its wrapper in again when it builds its models (DeepSpeed swaps only torch's own function), so every
    run computes as its own configuration says, whatever ran before it in the process.
    """
    import torch.nn.functional as F

    try:
        from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as ZeroInit
    except ImportError:  # pragma: no cover - DeepSpeed is a dependency
        return False
    original = getattr(ZeroInit, "linear_bk", None)  # where DeepSpeed keeps torch's function when it swaps it
    if original is None or F.linear is original:
        return False
    F.linear = original
    return True


def prepare_run(cfg: Config) -> tuple[DistInfo, Path]:
    """Process group, batch-size checks, the run folder with its config as given (:func:`record_config`; the
    trainer adds what it decided at start-up); removes checkpoints
    half-written by a crash; torch's own linear back if an earlier ZeRO-3 run in this process replaced it
    (:func:`restore_torch_linear`). Shared by every training method (RL here, SFT/RFT in mathrl.ablate)."""

    check_versions()  # an old DeepSpeed/transformers fails here with a message, not deep inside them
    restore_torch_linear()
    preflight(cfg)  # cheap input checks (tokenizer, config.json, data) before any expensive work
    out = Path(cfg.train.output_dir)
    held = run_folder.holds_run(out) if cfg.train.resume == "none" else None
    if held and not cfg.train.overwrite:  # every rank sees the folder: all stop here, before the process group
        raise ConfigError(f"train.output_dir={out} holds another run ({held}); continue it with --resume auto, "
                          "choose another train.output_dir, or start afresh with --overwrite (train.overwrite=true), "
                          f"which moves it aside to {out}.replaced-<time>")
    dist = init_distributed(cfg.train.dist_timeout_minutes)
    rules.refuse_for_training(cfg, dist.world_size)
    if dist.is_main:
        if held:
            moved = run_folder.move_aside(out, "replaced")
            print(f"mathrl: train.overwrite: the earlier run in {out} ({held}) moved to {moved}", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        record_config(cfg, dist, out)
        run_folder.clean_temporaries(out)
    return dist, out


#: the settings a run's config.yaml records as used rather than as given: they depend on the moment the run starts
#: (the free memory), so a rerun from the file must not decide them again. The other decided settings (each auto)
#: follow from the config and the kind of machine, and a rerun on another machine should decide them for it.
RECORDED_AS_USED = ("train.micro_batch_tokens",)


def record_config(cfg: Config, dist: DistInfo, out: Path, decided: dict[str, tuple[Any, Any]] | None = None) -> None:
    """Write ``<out>/config.yaml`` (main rank; a temporary file renamed over it): the config as given, and once
    the trainer decided its settings (``decided``: ``key -> (given, used)``: each ``auto``, the memory-fitted
    ``train.micro_batch_tokens``, the sized ``rollout.max_model_len``) a comment at the top naming each with the
    value used. The keys of :data:`RECORDED_AS_USED` hold the value used, so ``mathrl train <out>/config.yaml``
    splits micro-batches as this run did."""
    if not dist.is_main:
        return
    data = cfg.to_dict()
    lines = []
    if decided:
        lines.append("# What this run ran with: the settings it decided at start-up (given -> used).")
        for key, (given, used) in decided.items():
            section, name = key.split(".")
            recorded = key in RECORDED_AS_USED
            data[section][name] = used if recorded else given
            lines.append(f"#   {key}: {_scalar(given)} -> {_scalar(used)}"
                         + ("  (recorded below: a rerun from this file does the same)" if recorded else ""))
        if any(k not in RECORDED_AS_USED for k in decided):
            lines.append("# The others are as given below, so a rerun decides them for its own machine.")
    path = out / "config.yaml"
    tmp = path.with_name(".config.yaml.tmp")
    tmp.write_text("".join(line + "\n" for line in lines) + yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)


def _scalar(value: Any) -> str:
    """``value`` as YAML writes it (``null``, ``auto``, ``8192``)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def resume_and_log(cfg: Config, dist: DistInfo, out: Path, models: Models, state: State
                   ) -> tuple[Path | None, MetricsLogger]:
    """Restore ``train.resume``'s checkpoint into ``models``/``state`` (if any) and open the metrics log
    (truncated to the resumed step). Shared by every training method (RL here, SFT/RFT in mathrl.ablate)."""
    damaged = run_folder.damaged_newer(out) if cfg.train.resume == "auto" else []
    try:
        resume_from = run_folder.find_resume(out, cfg.train.resume)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if dist.is_main:
        for folder, why in damaged:  # passed over: kept for inspection, never overwritten by this run's saves
            moved = run_folder.move_aside(folder, "damaged")
            print(f"mathrl: warning: resume: skipped {folder} ({why}); moved it to {moved.name}", flush=True)
    if resume_from is not None:
        load_checkpoint(resume_from, models, state)
        if dist.is_main:
            print(f"mathrl: resumed from {resume_from} (step {state.step})", flush=True)
    elif cfg.train.resume == "auto" and dist.is_main:
        print(f"mathrl: resume: no complete checkpoint in {ckpt_root(out)}; starting at step 0", flush=True)
    logger = MetricsLogger(out, enabled=dist.is_main, tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb,
                           wandb_project=cfg.logging.wandb_project, config=cfg.to_dict(),
                           resume_step=state.step if resume_from is not None else None,
                           total_steps=cfg.train.steps, console=cfg.logging.console, log_every=cfg.logging.log_every)
    return resume_from, logger
