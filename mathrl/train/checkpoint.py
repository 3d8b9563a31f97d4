"""Checkpoints: atomic, self-describing, resumable.

Layout of ``<output_dir>/checkpoints/step_000010/``::

    policy/              Hugging Face folder (config, safetensors, tokenizer): load with
                         transformers or vLLM, or pass as --model to mathrl eval
                         (model.lora: the merged model, unless merged_checkpoints is false)
    adapter/             model.lora only: the adapter in peft's format (PeftModel.from_pretrained)
    critic/              PPO only: backbone + value head (mathrl.models.value_head)
    ds_policy/ ds_critic/ DeepSpeed engine state: fp32 weights, optimizer, LR scheduler
    ref/                 iterative RL only: the reset reference model (safetensors)
    rollout_ahead_rank<r>.pt  rollout.staleness = 1 only: rank r's batch already sampled for the
                         next step (tensors and strings; read with weights_only=True)
    rng_rank<r>.pt       rank r's random number generators (torch CPU, its CUDA device, Python's
                         ``random``): what dropout (model.disable_dropout=false, LoRA dropout) draws next
    trainer_state.json   step, data position, metric history pointer, config
    MANIFEST.json        written last: every file with its size and SHA-256

A checkpoint is written under ``.tmp-step_000010`` and renamed to its final name
only when complete (files fsynced, manifest written last), so a crash leaves
either the previous checkpoints or a complete new one; leftover temporary
folders are removed at the next start. Sampling seeds and data order are pure
functions of (seed, step), so weights + optimizer + scheduler + step restore a
run exactly; the global generators, which only dropout draws from after start-up,
are restored too (``rng_rank<r>.pt``), so a run with dropout resumes exactly as well.

Loading never executes code from the checkpoint: weights are safetensors, the trainer state is
JSON, and DeepSpeed's ``.pt`` files are read with ``torch.load(weights_only=True)`` (see
:class:`mathrl.dist.engines.SafeCheckpointEngine`). Before a resume every file is checked
against the manifest's SHA-256 (:func:`verify`), so a modified or corrupted file is refused.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mathrl.algo.filtering import PassRateFilter
from mathrl.config import Config, ConfigError
from mathrl.models.lora import adapter_state_dict, has_adapters, merged_parameters, save_adapter
from mathrl.dist.collectives import DistInfo, all_gather_objects, all_ranks_ok
from mathrl.dist.engines import copy_weights, load_engine_checkpoint
# the checkpoint layer (folders, manifest, verification, listing); its names are part of this module's API too
from mathrl.dist.checkpoint_io import (CKPT_RE, MANIFEST, STATE, begin, ckpt_root, commit,  # noqa: F401
                                       file_owner, hash_own_files, incomplete_reason, is_complete,
                                       list_checkpoints, read_state, sha256_file, step_dirname, verify,
                                       write_manifest)
from mathrl.train.errors import CheckpointError, TrainingError  # noqa: F401 (part of this module's API)
from mathrl.train.models import Models, full_state_dict, iterative_reference
from mathrl.dist.collectives import device, global_sum
from mathrl.progress import SlowPhase
from mathrl.rollout import iter_full_parameters


# --------------------------------------------------------------------------- the trainer's checkpoints


@dataclass
class State:
    step: int = 0
    bad_steps: int = 0
    ref_step: int = 0           # the policy step the reference model is a copy of (iterative RL)
    save_failures: int = 0      # checkpoint writes that failed (train.on_save_error = warn)
    prompts_used: int | None = None  # position in the training stream (None: step * batch_size)
    pass_filter: PassRateFilter = field(default_factory=PassRateFilter)  # algo.pass_rate_filter's history
    ahead: dict[str, Any] | None = None  # this rank's batch sampled for the next step (rollout.staleness = 1)
    micro_batch_tokens: int | None = None  # the token budget the run trained with (memory-fitted)


def save_checkpoint(cfg: Config, dist: DistInfo, models: Models, state: State, *, final: bool = False
                    ) -> Path | None:
    """Write a checkpoint atomically (see :mod:`mathrl.train.checkpoint`); returns its folder on the main rank.
    A save that takes more than a few seconds says so in the log (:class:`mathrl.progress.SlowPhase`).

    A write that fails (disk full, permission denied, file too large: ``OSError``, or the
    ``RuntimeError`` torch.save raises for the same causes) removes the
    half-written temporary folder and leaves every earlier checkpoint intact. Then
    ``train.on_save_error = 'warn'`` prints a warning and returns None (the next save tries
    again), ``'stop'`` raises :class:`TrainingError`; a failed ``final`` save always raises.
    """

    with SlowPhase(f"writing the checkpoint of step {state.step}", enabled=dist.is_main):
        return _save_checkpoint(cfg, dist, models, state, final=final)


def _save_checkpoint(cfg: Config, dist: DistInfo, models: Models, state: State, *, final: bool) -> Path | None:
    import torch.distributed as tdist

    tmp = ckpt_root(cfg.train.output_dir) / f".tmp-{step_dirname(state.step)}"
    error: list[BaseException] = []

    def attempt(write) -> Any:  # one write step of this rank, skipped once an earlier one failed
        if error:
            return None
        try:
            return write()
        except Exception as exc:  # noqa: BLE001 - OSError, and what torch.save / safetensors raise on a
            error.append(exc)     # failed write (RuntimeError "PytorchStreamWriter failed", SafetensorError)
            return None

    if dist.is_main:
        attempt(lambda: begin(cfg.train.output_dir, state.step))
    tdist.barrier()
    # gathers are collectives: every rank runs them whatever happened to the writes
    lora = has_adapters(models.policy.module)
    adapter_sd = adapter_state_dict(models.policy.module) if lora else None
    if not lora:
        policy_sd = full_state_dict(models.policy)
    elif models.policy.module.mathrl_lora["merged_checkpoints"]:
        policy_sd = {n: t.contiguous() for n, t in merged_parameters(models.policy.module)}
    else:
        policy_sd = None
    critic_sd = full_state_dict(models.critic) if models.critic is not None else None
    ref_sd = None
    if iterative_reference(cfg, models) and state.ref_step > 0:  # at ref_step 0 the reference is the initial model

        ref_sd = {n: t.contiguous().clone() for n, t in iter_full_parameters(getattr(models.ref, "module", models.ref))}
    # under LoRA the frozen base weights are the model folder's; DeepSpeed keeps the adapters and their
    # optimizer state
    attempt(lambda: models.policy.save_checkpoint(str(tmp / "ds_policy"), tag="state", exclude_frozen_parameters=lora))
    if models.critic is not None:
        attempt(lambda: models.critic.save_checkpoint(str(tmp / "ds_critic"), tag="state"))
    if state.ahead is not None:  # sampled with weights this checkpoint no longer holds: keep the batch itself
        attempt(lambda: torch.save(state.ahead, tmp / ahead_file(dist.rank)))
    attempt(lambda: torch.save(rng_state(), tmp / rng_file(dist.rank)))

    def write_main() -> None:
        if adapter_sd is not None:
            save_adapter(tmp / "adapter", adapter_sd, models.policy.module.mathrl_lora, models.model_path)
            models.tokenizer.save_pretrained(str(tmp / "adapter"))
        if policy_sd is not None:
            models.policy.module.save_pretrained(str(tmp / "policy"), state_dict=policy_sd, safe_serialization=True)
            models.tokenizer.save_pretrained(str(tmp / "policy"))
        if critic_sd is not None:
            models.critic.module.save_pretrained(tmp / "critic", state_dict=critic_sd)
        if ref_sd is not None:
            from safetensors.torch import save_file

            (tmp / "ref").mkdir()
            save_file(ref_sd, str(tmp / "ref" / "model.safetensors"), metadata={"ref_step": str(state.ref_step)})
        (tmp / STATE).write_text(json.dumps({"step": state.step, "bad_steps": state.bad_steps,
                                                  "ref_step": state.ref_step, "prompts_used": state.prompts_used,
                                                  "pass_filter": state.pass_filter.state_dict(),
                                                  "micro_batch_tokens": state.micro_batch_tokens,
                                                  "world_size": dist.world_size, "config": cfg.to_dict()}))

    if dist.is_main:
        attempt(write_main)
    done = None
    if all_ranks_ok(not error):
        # every rank fsyncs and hashes the files it wrote; rank 0 writes the manifest from them
        own = attempt(lambda: hash_own_files(tmp, dist.rank, dist.world_size))
        parts = all_gather_objects(own)
        if dist.is_main and not error:
            missing = [r for r, part in enumerate(parts) if part is None]
            if missing:
                error.append(CheckpointError(f"hashing the checkpoint files failed on rank(s) {missing}"))
            else:
                known = {rel: v for part in parts for rel, v in part.items()}
                done = attempt(lambda: commit(tmp, state.step, cfg.train.keep_last, known=known))
        if all_ranks_ok(not error):
            tdist.barrier()
            return done
    # the write failed on some rank: drop the temporary folder, keep the earlier checkpoints
    import shutil

    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    tdist.barrier()
    state.save_failures += 1
    earlier = list_checkpoints(cfg.train.output_dir)
    cause = f"{type(error[0]).__name__}: {error[0]}" if error else "it failed on another rank"
    try:  # torch.save's messages rarely say why; the free space often does
        cause += f"; {shutil.disk_usage(tmp.parent).free / 2**20:.0f} MiB free on that filesystem"
    except OSError:
        pass
    msg = (f"step {state.step}: writing the checkpoint {tmp} failed ({cause}); "
           + (f"the previous checkpoint {earlier[-1][1]} is intact" if earlier else "no earlier checkpoint exists"))
    if final or cfg.train.on_save_error == "stop" or not earlier:
        # warn keeps training only while an earlier checkpoint holds the run: with none, every further step
        # would be lost with the next failure (a run that never saved once trained to the end for nothing)
        why = (" (the final weights could not be saved)" if final else
               "" if cfg.train.on_save_error == "stop" else " (train.on_save_error=warn goes on only once a checkpoint "
               "exists)")
        raise TrainingError(msg + ". Free disk space or fix the folder's permissions, then run again with "
                            "--resume auto" + why)
    if dist.is_main:
        print(f"mathrl: warning: {msg}; training continues and the next save tries again "
              "(train.on_save_error=warn)", file=sys.stderr, flush=True)
    return None


def checkpoint_due(cfg: Config, step: int, last_save: float) -> bool:
    """Whether to checkpoint after ``step``: every ``train.save_every`` steps, and when
    ``train.save_every_minutes`` have passed since ``last_save`` (``time.monotonic()``; decided over all
    ranks: one rank's clock is enough). The last step is saved by the loop anyway."""
    import time


    t = cfg.train
    if t.save_every and step % t.save_every == 0:
        return True
    if not t.save_every_minutes or step >= t.steps:
        return False
    late = time.monotonic() - last_save >= 60.0 * t.save_every_minutes
    return bool(global_sum(torch.tensor(1.0 if late else 0.0)).item() > 0)


def ahead_file(rank: int) -> str:
    return f"rollout_ahead_rank{rank}.pt"


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def rng_state() -> dict[str, Any]:
    """This rank's global random generators: torch's CPU generator, its CUDA device's (when CUDA is in use)
    and Python's ``random``. Sampling, the data order and the mini-batch shuffles use their own seeded
    generators; what draws from these after start-up is dropout (``model.disable_dropout=false``, LoRA
    dropout) in the training forwards, so a resume that re-seeded them at start-up drew other dropout masks
    than the uninterrupted run from its first step on."""
    import random


    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    dev = device()
    if dev.type == "cuda":  # this rank's device only (get_rng_state_all would start a context on every GPU)
        out["cuda"] = torch.cuda.get_rng_state(dev)
    return out


def set_rng_state(saved: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (a state saved with CUDA, loaded without it: the CUDA part is
    left out)."""
    import random


    torch.set_rng_state(saved["torch"])
    version, internal, gauss = saved["python"]  # torch.load gives lists back where random wants tuples
    random.setstate((version, tuple(internal), gauss))
    dev = device()
    if "cuda" in saved and dev.type == "cuda":
        torch.cuda.set_rng_state(saved["cuda"], dev)


def load_checkpoint(folder: Path, models: Models, state: State) -> None:
    """Restore weights, optimizer, scheduler and counters; every file is first checked against the
    manifest's SHA-256 and DeepSpeed's pickles are read with ``weights_only=True``."""
    import torch.distributed as tdist

    refused: CheckpointError | None = None
    rank, world = (tdist.get_rank(), tdist.get_world_size()) if tdist.is_initialized() else (0, 1)
    try:  # each rank hashes the files it owns (its ZeRO shards; rank 0 the rest)
        verify(folder, rank, world)
    except CheckpointError as exc:
        refused = exc
    if not all_ranks_ok(refused is None):
        raise refused or CheckpointError(f"{folder}: refused by another rank (its message names the file)")
    # LoRA: the checkpoint holds the adapters only; the frozen base weights come from the model
    load_engine_checkpoint(models.policy, str(folder / "ds_policy"),
                           load_module_strict=not has_adapters(models.policy.module))
    if models.critic is not None:
        load_engine_checkpoint(models.critic, str(folder / "ds_critic"))
    saved = read_state(folder)
    state.step = int(saved["step"])
    state.bad_steps = int(saved.get("bad_steps", 0))
    state.ref_step = int(saved.get("ref_step", 0))
    state.prompts_used = saved.get("prompts_used")  # None in older checkpoints: step * batch_size
    state.pass_filter.load_state_dict(saved.get("pass_filter", {}))
    state.micro_batch_tokens = saved.get("micro_batch_tokens")
    # asynchronous rollout: every rank takes its saved batch, or (another world size, a synchronous run's
    # checkpoint) none does and the next step samples its own
    ahead = folder / ahead_file(rank)
    same = int(saved.get("world_size", world)) == world and ahead.is_file()
    state.ahead = torch.load(ahead, weights_only=True) if all_ranks_ok(same) else None
    ref_file = folder / "ref" / "model.safetensors"
    if models.ref is not None and state.ref_step > 0:
        if not ref_file.is_file():
            raise ConfigError(f"{folder}: the reference model was reset at step {state.ref_step} (iterative RL) but "
                              f"{ref_file} is missing; the checkpoint cannot restore the KL anchor")
        from safetensors.torch import load_file

        copy_weights(models.ref, load_file(str(ref_file)).items())
    # the random generators where the uninterrupted run had them (older checkpoints: as seeded at start-up)
    rng = folder / rng_file(rank)
    if all_ranks_ok(int(saved.get("world_size", world)) == world and rng.is_file()):
        set_rng_state(torch.load(rng, weights_only=True))
