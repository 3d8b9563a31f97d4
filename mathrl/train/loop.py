"""The RL loop (DESIGN.md, "The loop"): one function, every step visible.

GRPO and PPO are the same loop; the configuration chooses the advantage
estimator, where the KL to the reference goes (the loss, the per-token reward,
or nowhere), and whether a critic exists. Per step:

1. draw B problems (this rank's share), render prompts with the chat template;
2. the rollout engine samples G responses each;
3. the verifier grades them (worker processes, hard timeouts) -> scalar rewards;
4. no-grad forwards: reference logprobs (KL on), old logprobs (only when they
   differ from the current ones: several epochs or several mini-batches, or KL
   in the reward), critic values (GAE);
5. advantages from the registry;
6. for each PPO epoch and mini-batch: token-budgeted micro-batches, loss with the
   *global* normalisers of the mini-batch, backward; one optimizer step;
7. push the new weights to the rollout engine; log; checkpoint;
8. iterative RL (``algo.ref_update_every = N``): every N steps the reference
   model becomes a copy of the current policy (DeepSeekMath sec. 4.2).

Exact resume: the data order, sampling seeds and mini-batch shuffles are pure
functions of (seed, step, rank), so a checkpoint needs only weights, optimizer,
LR scheduler and the step counter.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mathrl.algo import advantages as adv_mod
from mathrl.algo import kl as kl_mod
from mathrl.algo.losses import agg_loss, global_normalizers, policy_loss, value_loss
from mathrl.config import Config, ConfigError, dump_yaml
from mathrl.train import checkpoint as ckpt
from mathrl.train.engines import (DistInfo, all_gather_objects, build_engine, build_inference_engine, copy_weights, device,
                                  discard_gradients, ds_config, inference_ds_config, init_distributed,
                                  load_engine_checkpoint, resolve_dtype, zero3_init)
from mathrl.train.forward import (agreed_plan, batch_logprobs, batch_values, make_micro_batch,
                                  plan_micro_batches, policy_forward, value_forward)
from mathrl.train.metrics import MetricsLogger, process_stats
from mathrl.train.preflight import preflight


class TrainingError(RuntimeError):
    """The run stopped for a reason the user must act on (message says what and where)."""


# --------------------------------------------------------------------------- data


def load_training_problems(cfg: Config):
    from mathrl.data import load_problems

    d = cfg.data
    opts: dict[str, Any] = {}
    if d.source == "synthetic":
        opts = {"n": d.synthetic_size, "level": d.synthetic_level, "seed": cfg.train.seed}
    problems = load_problems(d.source, d.path, d.split if d.source != "synthetic" else "train",
                             limit=d.limit, skip_bad_rows=d.skip_bad_rows, **opts)
    if not problems:
        raise ConfigError(f"data.source = {d.source!r}: no problems loaded")
    return problems


def step_indices(num_problems: int, step: int, batch: int, seed: int, shuffle: bool = True) -> list[int]:
    """Problem indices of ``step``: consecutive slices of per-epoch seeded permutations
    (``shuffle=False``: of the file order, pass after pass)."""
    out = []
    start = step * batch
    for pos in range(start, start + batch):
        epoch, i = divmod(pos, num_problems)
        if not shuffle:
            out.append(i)
            continue
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(num_problems, generator=g)
        out.append(int(perm[i]))
    return out


# --------------------------------------------------------------------------- evaluation


def stop_strings(cfg: Config) -> tuple[str, ...]:
    """rollout.stop plus the prompt template's own stops (few-shot plain prompts)."""
    from mathrl.data import get_template

    return tuple(dict.fromkeys([*cfg.rollout.stop, *get_template(cfg.data.template).stop]))


def evaluate(rollout, problems, cfg: Config, *, out_dir: Path | None = None,
             dist: DistInfo | None = None) -> dict[str, float]:
    """Held-out evaluation with the evaluation stage's runner (:mod:`mathrl.eval.runner`): greedy
    accuracy, pass@k and maj@k over ``eval.n`` samples, plus the format metrics of the demo.

    ``greedy_boxed`` is the strict score: greedy answer correct *and* written in ``\\boxed{}``.
    Per-sample records go to ``out_dir/heldout/samples.jsonl`` when ``out_dir`` is given (pass it on
    the main rank only). With ``dist`` of several ranks every rank generates and grades its share of
    the chunks, the graded records are all-gathered and every rank returns the same metrics (no rank
    waits in a collective while one rank evaluates everything).
    """
    from mathrl.eval.runner import EvalSettings, evaluate_benchmark

    settings = EvalSettings.from_config(cfg)
    part = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    res = evaluate_benchmark(rollout, problems, settings, name="heldout", out_dir=out_dir, log=lambda _m: None,
                             part=part, gather=all_gather_objects)
    out = {k: float(v["value"]) for k, v in res.summary["metrics"].items()}
    samples = [s for r in res.records for s in r["samples"]]
    out["boxed_rate"] = sum("\\boxed" in s["text"] for s in samples) / len(samples)
    if settings.greedy:
        out["greedy_boxed"] = sum(bool(r["greedy"].get("correct")) and "\\boxed" in r["greedy"]["text"]
                                  for r in res.records) / len(res.records)
    out["length_mean"] = float(res.summary["mean_length"])
    out["truncation_rate"] = float(res.summary["truncation_rate"])
    return out


# --------------------------------------------------------------------------- the trainer


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
    tokenizer: Any = None
    model_path: str = ""
    policy_guard: GradGuard | None = None
    critic_guard: GradGuard | None = None


@dataclass
class State:
    step: int = 0
    bad_steps: int = 0
    ref_step: int = 0           # the policy step the reference model is a copy of (iterative RL)
    save_failures: int = 0      # checkpoint writes that failed (train.on_save_error = warn)


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    import random

    random.seed(seed)


def _sampling_seed(cfg: Config, step: int, rank: int) -> int:
    """A seed per (run seed, step, rank), hashed so that no two share vLLM's per-sample seed streams
    (vLLM seeds sample j of a call with seed + j, so nearby seeds would reuse noise)."""
    digest = hashlib.sha256(f"mathrl/{cfg.train.seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def optimizer_steps_per_rl_step(cfg: Config) -> int:
    """Optimizer steps in one RL step: one per mini-batch and PPO epoch (the LR schedule counts these)."""
    t = cfg.train
    return cfg.algo.ppo_epochs * (t.batch_size // (t.mini_batch_size or t.batch_size))


def build_models(cfg: Config, dist: DistInfo, total_steps: int) -> Models:
    """The policy engine (and reference, critic). ``total_steps`` is in RL steps; the LR schedule and
    its warm-up (``train.warmup_steps``, also RL steps) are sized in optimizer steps, since the scheduler
    advances once per optimizer step (:func:`optimizer_steps_per_rl_step` of them per RL step)."""
    from mathrl.models import load_causal_lm, load_tokenizer, resolve_model_path
    from mathrl.models.loading import disable_dropout
    from mathrl.models.value_head import ValueModel

    dtype = resolve_dtype(cfg.model.dtype)
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tokenizer = load_tokenizer(path)
    _seed_all(cfg.train.seed)
    stage3 = cfg.deepspeed.zero_stage == 3
    # ZeRO-3: load each model sharded (deepspeed.zero.Init), never whole on every rank
    policy_ds = ds_config(3, cfg.deepspeed.offload, micro_batch=1, world_size=dist.world_size,
                          grad_clip=cfg.train.max_grad_norm, dtype=dtype,
                          config_path=cfg.deepspeed.config_path) if stage3 else None
    with zero3_init(policy_ds):
        policy = load_causal_lm(path, dtype=dtype, gradient_checkpointing=cfg.model.gradient_checkpointing)
    if cfg.model.disable_dropout:
        disable_dropout(policy)
    t = cfg.train
    per = optimizer_steps_per_rl_step(cfg)
    common = dict(schedule=t.lr_schedule, warmup=t.warmup_steps * per, total_steps=total_steps * per,
                  stage=cfg.deepspeed.zero_stage, offload=cfg.deepspeed.offload, grad_clip=t.max_grad_norm,
                  dtype=dtype, world_size=dist.world_size, config_path=cfg.deepspeed.config_path)
    engine = build_engine(policy, lr=t.lr, weight_decay=t.weight_decay, **common)
    ref = None
    if cfg.algo.kl_coef > 0:
        ref_path = resolve_model_path(cfg.model.ref_model, cfg.model.cache_dir) if cfg.model.ref_model else path
        with zero3_init(inference_ds_config(dtype, dist.world_size) if stage3 else None):
            ref_module = load_causal_lm(ref_path, dtype=dtype)
        disable_dropout(ref_module)  # a frozen reference runs in eval mode anyway; this also covers train()
        ref = build_inference_engine(ref_module, stage=cfg.deepspeed.zero_stage,
                                     dtype=dtype, world_size=dist.world_size)
    critic = None
    if cfg.advantage in adv_mod.NEEDS_CRITIC:
        cpath = resolve_model_path(cfg.model.critic_model, cfg.model.cache_dir) if cfg.model.critic_model else path
        with zero3_init(policy_ds):  # sharded like the policy under ZeRO-3
            critic_module = ValueModel.from_pretrained(cpath, dtype=dtype)
        if cfg.model.disable_dropout:
            disable_dropout(critic_module)
        critic = build_engine(critic_module, lr=t.critic_lr, weight_decay=t.weight_decay, **common)
    return Models(policy=engine, ref=ref, critic=critic, tokenizer=tokenizer, model_path=path,
                  policy_guard=GradGuard(engine.module),
                  critic_guard=GradGuard(critic.module) if critic is not None else None)


def _full_state_dict(engine) -> dict[str, torch.Tensor]:
    if engine.zero_optimization_stage() == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    return engine.module.state_dict()


def _iterative(cfg: Config, models: Models) -> bool:
    return bool(cfg.algo.ref_update_every) and models.ref is not None


def reset_reference(models: Models) -> int:
    """Iterative RL: make the reference model a copy of the current policy (ZeRO-3: shard by shard)."""
    from mathrl.rollout import iter_full_parameters

    return copy_weights(models.ref, iter_full_parameters(models.policy.module))


def save_checkpoint(cfg: Config, dist: DistInfo, models: Models, state: State, *, final: bool = False
                    ) -> Path | None:
    """Write a checkpoint atomically (see :mod:`mathrl.train.checkpoint`); returns its folder on the main rank.

    A write that fails (disk full, permission denied, file too large: ``OSError``, or the
    ``RuntimeError`` torch.save raises for the same causes) removes the
    half-written temporary folder and leaves every earlier checkpoint intact. Then
    ``train.on_save_error = 'warn'`` prints a warning and returns None (the next save tries
    again), ``'stop'`` raises :class:`TrainingError`; a failed ``final`` save always raises.
    """
    import torch.distributed as tdist

    from mathrl.train.faults import fault

    tmp = ckpt.ckpt_root(cfg.train.output_dir) / f".tmp-{ckpt.step_dirname(state.step)}"
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
        attempt(lambda: ckpt.begin(cfg.train.output_dir, state.step))
    tdist.barrier()
    # gathers are collectives: every rank runs them whatever happened to the writes
    policy_sd = _full_state_dict(models.policy)
    critic_sd = _full_state_dict(models.critic) if models.critic is not None else None
    ref_sd = None
    if _iterative(cfg, models) and state.ref_step > 0:  # at ref_step 0 the reference is the initial model
        from mathrl.rollout import iter_full_parameters

        ref_sd = {n: t.contiguous().clone() for n, t in iter_full_parameters(getattr(models.ref, "module", models.ref))}
    attempt(lambda: models.policy.save_checkpoint(str(tmp / "ds_policy"), tag="state"))
    if models.critic is not None:
        attempt(lambda: models.critic.save_checkpoint(str(tmp / "ds_critic"), tag="state"))
    fault("ckpt_write", state.step)

    def write_main() -> None:
        models.policy.module.save_pretrained(str(tmp / "policy"), state_dict=policy_sd, safe_serialization=True)
        models.tokenizer.save_pretrained(str(tmp / "policy"))
        if critic_sd is not None:
            models.critic.module.save_pretrained(tmp / "critic", state_dict=critic_sd)
        if ref_sd is not None:
            from safetensors.torch import save_file

            (tmp / "ref").mkdir()
            save_file(ref_sd, str(tmp / "ref" / "model.safetensors"), metadata={"ref_step": str(state.ref_step)})
        (tmp / ckpt.STATE).write_text(json.dumps({"step": state.step, "bad_steps": state.bad_steps,
                                                  "ref_step": state.ref_step,
                                                  "world_size": dist.world_size, "config": cfg.to_dict()}))

    if dist.is_main:
        attempt(write_main)
    done = None
    if _all_ranks_ok(not error):
        # every rank fsyncs and hashes the files it wrote; rank 0 writes the manifest from them
        own = attempt(lambda: ckpt.hash_own_files(tmp, dist.rank, dist.world_size))
        parts = all_gather_objects(own)
        if dist.is_main and not error:
            missing = [r for r, part in enumerate(parts) if part is None]
            if missing:
                error.append(ckpt.CheckpointError(f"hashing the checkpoint files failed on rank(s) {missing}"))
            else:
                known = {rel: v for part in parts for rel, v in part.items()}
                done = attempt(lambda: ckpt.commit(tmp, state.step, cfg.train.keep_last, known=known))
        if _all_ranks_ok(not error):
            tdist.barrier()
            return done
    # the write failed on some rank: drop the temporary folder, keep the earlier checkpoints
    import shutil

    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    tdist.barrier()
    state.save_failures += 1
    earlier = ckpt.list_checkpoints(cfg.train.output_dir)
    cause = f"{type(error[0]).__name__}: {error[0]}" if error else "it failed on another rank"
    try:  # torch.save's messages rarely say why; the free space often does
        cause += f"; {shutil.disk_usage(tmp.parent).free / 2**20:.0f} MiB free on that filesystem"
    except OSError:
        pass
    msg = (f"step {state.step}: writing the checkpoint {tmp} failed ({cause}); "
           + (f"the previous checkpoint {earlier[-1][1]} is intact" if earlier else "no earlier checkpoint exists"))
    if final or cfg.train.on_save_error == "stop":
        raise TrainingError(msg + ". Free disk space or fix the folder's permissions, then run again with "
                            "--resume auto" + (" (the final weights could not be saved)" if final else ""))
    if dist.is_main:
        print(f"mathrl: warning: {msg}; training continues and the next save tries again "
              "(train.on_save_error=warn)", file=sys.stderr, flush=True)
    return None


def load_checkpoint(folder: Path, models: Models, state: State) -> None:
    """Restore weights, optimizer, scheduler and counters; every file is first checked against the
    manifest's SHA-256 and DeepSpeed's pickles are read with ``weights_only=True``."""
    import torch.distributed as tdist

    refused: ckpt.CheckpointError | None = None
    rank, world = (tdist.get_rank(), tdist.get_world_size()) if tdist.is_initialized() else (0, 1)
    try:  # each rank hashes the files it owns (its ZeRO shards; rank 0 the rest)
        ckpt.verify(folder, rank, world)
    except ckpt.CheckpointError as exc:
        refused = exc
    if not _all_ranks_ok(refused is None):
        raise refused or ckpt.CheckpointError(f"{folder}: refused by another rank (its message names the file)")
    load_engine_checkpoint(models.policy, str(folder / "ds_policy"), load_module_strict=True)
    if models.critic is not None:
        load_engine_checkpoint(models.critic, str(folder / "ds_critic"))
    saved = ckpt.read_state(folder)
    state.step = int(saved["step"])
    state.bad_steps = int(saved.get("bad_steps", 0))
    state.ref_step = int(saved.get("ref_step", 0))
    ref_file = folder / "ref" / "model.safetensors"
    if models.ref is not None and state.ref_step > 0:
        if not ref_file.is_file():
            raise ConfigError(f"{folder}: the reference model was reset at step {state.ref_step} (iterative RL) but "
                              f"{ref_file} is missing; the checkpoint cannot restore the KL anchor")
        from safetensors.torch import load_file

        copy_weights(models.ref, load_file(str(ref_file)).items())


def sync_weights(rollout, engine) -> int:
    """Push the trainer's current parameters into the rollout engine (ZeRO-3 shards gathered one at a time)."""
    from mathrl.rollout import iter_full_parameters
    from mathrl.rollout.colocate import ensure_awake

    if getattr(rollout, "model", None) is engine.module:
        return 0  # the hf engine shares the trainer's module: nothing to copy
    ensure_awake(rollout, weights_only=True)  # colocated schedule: weights back, KV cache still free
    return rollout.update_weights(iter_full_parameters(engine.module))


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def _all_ranks_ok(flag: bool) -> bool:
    from mathrl.train.engines import all_reduce

    return float(all_reduce(torch.tensor([0.0 if flag else 1.0]))[0]) == 0.0


def _global_sum(t: torch.Tensor) -> torch.Tensor:
    from mathrl.train.engines import all_reduce

    return all_reduce(t, "sum")


def compute_advantages(cfg: Config, scores: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor,
                       kl_tokens: torch.Tensor | None, values: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-level advantages [N, T] (and returns for GAE) for the configured estimator.

    ``kl_tokens`` (the per-token KL of the sampled responses, given when ``kl_in = reward``) enters
    the reward: per token for the token-level estimators (PPO-style, :func:`token_level_rewards`),
    summed into each response's score before the group baseline for the group estimators (RLOO-style,
    :func:`sequence_kl_scores`). Whitening (GAE, REINFORCE++) uses the statistics of the global batch
    (all ranks)."""
    name = cfg.advantage
    kl_coef = cfg.algo.kl_coef if cfg.kl_in == "reward" else 0.0
    if name in adv_mod.SEQUENCE_LEVEL:
        if kl_tokens is not None and kl_coef:
            scores = adv_mod.sequence_kl_scores(scores, kl_tokens, mask, kl_coef)
        if name == "grpo":
            seq = adv_mod.grpo(scores, group_index, std_normalize=cfg.algo.std_normalize)
        else:
            seq = adv_mod.get_advantage_estimator(name)(scores, group_index)
        return adv_mod.broadcast_to_tokens(seq, mask), None
    rewards = adv_mod.token_level_rewards(scores, mask, kl=kl_tokens, kl_coef=kl_coef)
    if name == "reinforce_pp":
        return adv_mod.reinforce_pp(rewards, mask, gamma=cfg.algo.gamma, reduce=_global_sum), None
    advantages, returns = adv_mod.gae(rewards, values, mask, gamma=cfg.algo.gamma, lam=cfg.algo.lam)
    return adv_mod.masked_whiten(advantages, mask, reduce=_global_sum), returns


def train_step(cfg: Config, dist: DistInfo, models: Models, rollout, problems, state: State,
               loss_sign: float = 1.0, reward_fn=None) -> dict[str, float]:
    """One RL step (see the module docstring).

    ``reward_fn(responses, golds, truncated) -> list[float]`` replaces the verifier-based reward
    (custom tasks); ``loss_sign=-1`` flips the policy gradient (a test hook showing that learning
    depends on the gradient's direction)."""
    from mathrl.data import render_prompt
    from mathrl.reward import grade_batch
    from mathrl.reward.rewards import compute_rewards
    from mathrl.rollout import SamplingConfig
    from mathrl.train.faults import fault

    t_step = time.perf_counter()
    fault("step_start", state.step + 1)
    times: dict[str, float] = {}
    dev = device()
    a, t, r = cfg.algo, cfg.train, cfg.rollout
    G = r.n
    per_rank = t.batch_size // dist.world_size

    # 1. problems of this step (this rank's share) and their prompts
    idx = step_indices(len(problems), state.step, t.batch_size, t.seed, cfg.data.shuffle)[dist.rank * per_rank:(dist.rank + 1) * per_rank]
    batch_problems = [problems[i] for i in idx]
    prompts = [render_prompt(p, models.tokenizer, cfg.data.template) for p in batch_problems]

    # 2. sample G responses per prompt (colocated schedule, rollout.sleep_between_steps: wake the KV
    #    cache before, sleep after; both no-ops without it)
    from mathrl.rollout import colocate

    times.update(colocate.before_generate(rollout))
    t0 = time.perf_counter()
    sampling = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                              stop=stop_strings(cfg), seed=_sampling_seed(cfg, state.step, dist.rank))
    batch = rollout.generate(prompts, G, sampling)
    times["generate"] = time.perf_counter() - t0
    times.update(colocate.after_generate(rollout))
    fault("generate", state.step + 1)

    # 3. grade and reward
    t0 = time.perf_counter()
    truncated = [f == "length" for f in batch.finish_reason]
    golds = [p.gold for p in batch_problems for _ in range(G)]
    if reward_fn is None:
        grades = grade_batch(batch.response_text, golds, timeout=cfg.reward.timeout, workers=cfg.reward.workers,
                             truncated=truncated)
        terms: dict[str, dict] = {"correctness": {}}
        if cfg.reward.function == "correctness_format":
            terms["format"] = {"bonus": cfg.reward.format_bonus}
        if cfg.reward.overlong_penalty > 0:  # DAPO's soft overlong punishment
            terms["length"] = {"coef": cfg.reward.overlong_penalty, "buffer": cfg.reward.overlong_buffer}
        score_list = compute_rewards(terms, grades, batch.response_text, truncated=truncated,
                                     lengths=[int(n) for n in batch.response_mask.sum(1)], max_length=r.max_tokens)
        correct = [g.correct for g in grades]
    else:
        grades = None
        score_list = [float(x) for x in reward_fn(batch.response_text, golds, truncated)]
        correct = [x > 0 for x in score_list]
    scores = torch.tensor(score_list, dtype=torch.float32)
    times["grade"] = time.perf_counter() - t0

    mask = batch.response_mask.bool()
    pids, pmask, rids = batch.prompt_ids, batch.prompt_mask, batch.response_ids
    gs = group_share(cfg)
    fwd = dict(token_budget=t.micro_batch_tokens, device=dev)

    # 4. no-grad forwards
    t0 = time.perf_counter()
    mini = t.mini_batch_size or t.batch_size
    n_minibatches = t.batch_size // mini
    reuse_old = a.ppo_epochs == 1 and n_minibatches == 1 and cfg.kl_in != "reward"
    old_logp = None
    if not reuse_old:
        was_training = models.policy.module.training
        models.policy.module.eval()
        old_logp = batch_logprobs(models.policy.module, pids, pmask, rids, mask, temperature=_temp(r),
                                  group_size=gs, **fwd)
        models.policy.module.train(was_training)
    times["old_forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref_logp = None
    if models.ref is not None:
        ref_logp = batch_logprobs(models.ref, pids, pmask, rids, mask, temperature=_temp(r), group_size=gs, **fwd)
    times["ref_forward"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    values = None
    if models.critic is not None:
        values = batch_values(models.critic.module, pids, pmask, rids, mask, group_size=gs, **fwd)
    times["values_forward"] = time.perf_counter() - t0

    # 5. advantages
    kl_reward = None
    if ref_logp is not None and cfg.kl_in == "reward":
        kl_reward = kl_mod.estimate(old_logp, ref_logp, cfg.kl_estimator)
    advantages, returns = compute_advantages(cfg, scores, batch.group_index, mask, kl_reward, values)

    # 6. PPO epochs over mini-batches of prompts (groups stay together)
    t0 = time.perf_counter()
    stats_acc: dict[str, list[float]] = {}
    problems: list[str] = []
    norm_const = a.norm_const or float(r.max_tokens)
    for epoch in range(a.ppo_epochs):
        g = torch.Generator().manual_seed(_sampling_seed(cfg, state.step, dist.rank) + 7919 * (epoch + 1))
        prompt_order = torch.randperm(per_rank, generator=g) if n_minibatches > 1 else torch.arange(per_rank)
        per_mb = per_rank // n_minibatches
        for m in range(n_minibatches):
            prompts_mb = prompt_order[m * per_mb:(m + 1) * per_mb]
            rows = (prompts_mb[:, None] * G + torch.arange(G)[None, :]).flatten()
            plan = plan_micro_batches(pmask, mask, t.micro_batch_tokens, rows, group_size=gs)
            norms = global_normalizers([mask[rows_] for rows_ in plan], reduce=_global_sum)
            # every rank runs the same number of backwards (ZeRO-2/3 communicate inside each one)
            plan = agreed_plan(plan, gs)
            bad = _update_policy(cfg, dist, models, batch, plan, mask, advantages, old_logp, ref_logp, norms,
                                 norm_const, loss_sign, stats_acc, step=state.step + 1)
            problems += [f"epoch {epoch + 1}, mini-batch {m + 1}: {bad}"] if bad else []
            if models.critic is not None:
                bad = _update_critic(cfg, dist, models, batch, plan, mask, values, returns, norms, norm_const,
                                     stats_acc, step=state.step + 1)
                problems += [f"epoch {epoch + 1}, mini-batch {m + 1}: {bad}"] if bad else []
    times["train"] = time.perf_counter() - t0

    # 7. weights -> rollout engine (colocated schedule: wake the weights first)
    wake = colocate.before_sync(rollout)
    if wake:  # time/wake = both wakes of the step
        times["wake"] = times.get("wake", 0.0) + wake.pop("wake")
        times.update(wake)
    t0 = time.perf_counter()
    sync_weights(rollout, models.policy)
    times["sync"] = time.perf_counter() - t0

    metrics = _step_metrics(cfg, batch, grades, correct, scores, mask, truncated, stats_acc, ref_logp, old_logp)
    metrics["lr"] = models.policy.get_lr()[0]
    metrics["bad_step"] = 1.0 if problems else 0.0
    if problems:
        metrics["bad_reason"] = "; ".join(problems)
    metrics.update({f"time/{k}": v for k, v in times.items()})
    metrics["time/step"] = time.perf_counter() - t_step
    metrics["throughput/tokens_per_s"] = batch.num_tokens / max(metrics["time/step"], 1e-9)
    return metrics


def group_share(cfg: Config) -> int:
    """Rows per shared prompt in training forwards (1 = no sharing)."""
    return cfg.rollout.n if cfg.train.share_prompt and cfg.rollout.n > 1 else 1


def _temp(r) -> float:
    return r.temperature if r.temperature > 0 else 1.0


def _acc(stats_acc: dict[str, list[float]], key: str, value) -> None:
    stats_acc.setdefault(key, []).append(float(value))


def _skip_or_step(engine, guard: GradGuard | None, problem: str | None, what: str, step: int) -> str | None:
    """The optimizer step of one mini-batch, unless some rank saw NaN/inf in it; returns what was bad."""
    from mathrl.train.faults import fault

    fault("optimizer", step)
    if problem is None and guard is not None and guard.bad is not None:
        problem = f"{what} gradient of {guard.bad} is NaN/inf"
    if guard is not None:
        guard.reset()
    if _all_ranks_ok(problem is None):
        engine.step()
        gn = engine.get_global_grad_norm()
        if gn is not None and not math.isfinite(float(gn)):  # DeepSpeed skipped it (its own overflow check)
            return f"{what} gradient norm is {gn}"
        return None
    discard_gradients(engine)
    return problem or f"{what}: NaN/inf on another rank"


def _update_policy(cfg, dist, models, batch, plan, mask, advantages, old_logp, ref_logp, norms, norm_const,
                   loss_sign, stats_acc, step: int = 0) -> str | None:
    """Backward over the micro-batches of one mini-batch, then one optimizer step.

    ``plan`` is this rank's :func:`agreed_plan`: ``(rows, real)`` pairs, the same count on every rank;
    padding entries (``real=False``) run forward and backward with weight 0, so every rank takes part
    in each of ZeRO's per-backward collectives and the gradient is unchanged.

    NaN/inf in the logprobs, the loss or any gradient skips the step (gradients discarded, no
    optimizer or scheduler step); returns where it was seen. The remaining micro-batches still run
    (with weight 0) so that the other ranks are not left waiting in a collective."""
    from mathrl.train.faults import fault

    a, r = cfg.algo, cfg.rollout
    engine = models.policy
    engine.train()
    problem = None
    gs = group_share(cfg)
    n_real = sum(real for _, real in plan)
    for i, (rows, real) in enumerate(plan):
        mb = make_micro_batch(batch.prompt_ids, batch.prompt_mask, batch.response_ids, mask, rows, device(), gs)
        # entropy comes from the same fused pass as the logprobs; it enters the loss only with a bonus
        logp, ent = policy_forward(engine, mb, temperature=_temp(r), with_entropy=True)
        m = mb.response_mask
        adv = advantages[rows, : mb.T].to(logp.device)
        old = old_logp[rows, : mb.T].to(logp.device) if old_logp is not None else logp.detach()
        agg = dict(agg=a.loss_agg, norm_tokens=norms.tokens, norm_seqs=norms.seqs, norm_const=norm_const)
        pg_loss, st = policy_loss(logp, old, adv * loss_sign, m, clip_low=a.clip_low, clip_high=a.clip_high,
                                  dual_clip=a.dual_clip, **agg)
        loss = pg_loss
        kl_loss = None
        if ref_logp is not None and cfg.kl_in == "loss":
            kl_tok = kl_mod.estimate(logp, ref_logp[rows, : mb.T].to(logp.device), cfg.kl_estimator)
            kl_loss = agg_loss(kl_tok, m, **agg)
            loss = loss + a.kl_coef * kl_loss
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * agg_loss(ent, m, **agg)
        if real:
            if kl_loss is not None:
                _acc(stats_acc, "loss/kl", kl_loss.detach() * n_real)  # micro losses sum to the mini-batch's
            for k, v in st.items():
                _acc(stats_acc, f"policy/{k}", v)
            _acc(stats_acc, "policy/entropy", (ent.detach() * m).sum() / m.sum().clamp(min=1))
            _acc(stats_acc, "loss/policy", pg_loss.detach() * n_real)
            if i == n_real - 1 and fault("loss", step):  # after the other micro-batches' backward
                loss = loss * float("nan")
            where = f"micro-batch {i + 1} of {n_real}"
            if problem is None and not _finite(logp):
                problem = f"policy logprobs are NaN/inf ({where})"
            elif problem is None and not _finite(loss):
                problem = f"policy loss is {float(loss.detach())} ({where})"
        # DeepSpeed averages gradients over ranks; the loss already carries the global normaliser.
        weight = float(dist.world_size) if real and problem is None else 0.0
        engine.backward(loss * weight, scale_wrt_gas=False)
    problem = _skip_or_step(engine, models.policy_guard, problem, "policy", step)
    gn = engine.get_global_grad_norm() if problem is None else None
    if gn is not None:
        _acc(stats_acc, "policy/grad_norm", float(gn))
    return problem


def _update_critic(cfg, dist, models, batch, plan, mask, old_values, returns, norms, norm_const, stats_acc,
                   step: int = 0) -> str | None:
    """The critic's counterpart of :func:`_update_policy` (same plan, padding and NaN handling)."""
    a = cfg.algo
    engine = models.critic
    engine.train()
    problem = None
    n_real = sum(real for _, real in plan)
    for i, (rows, real) in enumerate(plan):
        mb = make_micro_batch(batch.prompt_ids, batch.prompt_mask, batch.response_ids, mask, rows, device(),
                              group_share(cfg))
        v = value_forward(engine, mb)
        m = mb.response_mask
        loss, st = value_loss(v, old_values[rows, : mb.T].to(v.device), returns[rows, : mb.T].to(v.device), m,
                              clip=a.value_clip or None, agg=a.loss_agg, norm_tokens=norms.tokens,
                              norm_seqs=norms.seqs, norm_const=norm_const)  # value_clip 0 = no clipping
        if real:
            for k, val in st.items():
                _acc(stats_acc, f"critic/{k}", val)
            _acc(stats_acc, "loss/value", loss.detach() * n_real)
            if problem is None and not _finite(loss):
                problem = f"value loss is {float(loss.detach())} (micro-batch {i + 1} of {n_real})"
        weight = float(dist.world_size) if real and problem is None else 0.0
        engine.backward(a.vf_coef * loss * weight, scale_wrt_gas=False)
    return _skip_or_step(engine, models.critic_guard, problem, "critic", step)


def _step_metrics(cfg, batch, grades, correct, scores, mask, truncated, stats_acc, ref_logp, old_logp
                  ) -> dict[str, float]:
    G = cfg.rollout.n
    lengths = mask.sum(1).float()
    groups = scores.view(-1, G)
    out = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "reward/accuracy": sum(correct) / len(correct),
        "reward/zero_variance_groups": float((groups.std(1) == 0).float().mean()) if G > 1 else 1.0,
        "reward/boxed": sum("\\boxed" in t for t in batch.response_text) / len(batch.response_text),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated": sum(truncated) / len(truncated),
        "tokens": float(mask.sum()),
    }
    if grades is not None:
        out["reward/answer_found"] = sum(g.extracted is not None for g in grades) / len(grades)
        out["reward/timeouts"] = float(sum(g.reason == "timeout" for g in grades))
    if old_logp is not None and cfg.rollout.top_p >= 1.0 and cfg.rollout.top_k <= 0:
        # sampler vs trainer logprobs of the same tokens under the same weights: a live check that the
        # rollout engine has the current weights (stale weights show up as large differences)
        diff = (batch.logprobs - old_logp).abs()[mask]
        out["rollout/logprob_diff_max"] = float(diff.max()) if diff.numel() else 0.0
        out["rollout/logprob_diff_mean"] = float(diff.mean()) if diff.numel() else 0.0
    if ref_logp is not None:
        sampler_logp = batch.logprobs if old_logp is None else old_logp
        kl = kl_mod.estimate(sampler_logp, ref_logp, cfg.kl_estimator)
        out["kl/mean"] = float((kl * mask).sum() / mask.sum().clamp(min=1))
    for k, v in stats_acc.items():
        vals = [x for x in v if math.isfinite(x)]
        if not vals:
            continue
        if k.endswith("ratio_min"):
            out[k] = min(vals)
        elif k.endswith("ratio_max"):
            out[k] = max(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out


def _check_batching(cfg: Config, dist: DistInfo) -> None:
    t = cfg.train
    mini = t.mini_batch_size or t.batch_size
    if t.batch_size % dist.world_size or mini % dist.world_size:
        raise ConfigError(f"train.batch_size = {t.batch_size} and train.mini_batch_size = {mini} must be divisible "
                          f"by the number of processes ({dist.world_size})")


def plot_rewards(history: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:  # a minimal GPU image: the metrics log has the same numbers
        print(f"mathrl: matplotlib is not installed; {path.name} not drawn", file=sys.stderr, flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward/mean"] for h in history], marker="o", label="mean reward")
    ax.plot(steps, [h["reward/accuracy"] for h in history], marker=".", label="accuracy (train samples)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("mathrl GRPO: training reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def prepare_run(cfg: Config) -> tuple[DistInfo, Path]:
    """Process group, batch-size checks, the run folder with its resolved config; removes checkpoints
    half-written by a crash. Shared by every training method (RL here, SFT/RFT in mathrl.ablate)."""
    from mathrl.versions import check_versions

    check_versions()  # an old DeepSpeed/transformers fails here with a message, not deep inside them
    preflight(cfg)  # cheap input checks (tokenizer, config.json, data) before any expensive work
    if resolve_dtype(cfg.model.dtype) == torch.float16:
        raise ConfigError("model.dtype = 'float16': training in float16 needs loss scaling, which mathrl's DeepSpeed "
                          "configs do not set up; use model.dtype=bfloat16 (or auto: bfloat16 on GPU, float32 on CPU)")
    dist = init_distributed(cfg.train.dist_timeout_minutes)
    _check_batching(cfg, dist)
    out = Path(cfg.train.output_dir)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(dump_yaml(cfg))
        ckpt.clean_temporaries(out)
    return dist, out


def resume_and_log(cfg: Config, dist: DistInfo, out: Path, models: Models, state: State
                   ) -> tuple[Path | None, MetricsLogger]:
    """Restore ``train.resume``'s checkpoint into ``models``/``state`` (if any) and open the metrics log
    (truncated to the resumed step). Shared by every training method (RL here, SFT/RFT in mathrl.ablate)."""
    try:
        resume_from = ckpt.find_resume(out, cfg.train.resume)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if resume_from is not None:
        load_checkpoint(resume_from, models, state)
        if dist.is_main:
            print(f"mathrl: resumed from {resume_from} (step {state.step})", flush=True)
    logger = MetricsLogger(out, enabled=dist.is_main, tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb,
                           wandb_project=cfg.logging.wandb_project, config=cfg.to_dict(),
                           resume_step=state.step if resume_from is not None else None,
                           total_steps=cfg.train.steps, console=cfg.logging.console, log_every=cfg.logging.log_every)
    return resume_from, logger


def run(cfg: Config, *, loss_sign: float = 1.0, reward_fn=None, problems=None) -> int:
    """Run training as configured; returns the process exit code.

    ``problems`` (a list of :class:`mathrl.data.Problem`) and ``reward_fn`` (see :func:`train_step`)
    let a script train on its own task; by default both come from the config."""
    dist, out = prepare_run(cfg)
    custom_task = problems is not None
    problems = problems if custom_task else load_training_problems(cfg)
    eval_problems: list = []
    if not custom_task:
        from mathrl.eval.benchmarks import heldout_problems

        eval_problems = heldout_problems(cfg)[1]  # every rank evaluates its share (see evaluate)
    if eval_problems and cfg.rollout.tensor_parallel_size > 1:
        # the ranks of a tensor-parallel group must make the same number of generate calls, which the
        # chunk split across ranks does not guarantee
        if dist.is_main:
            print("mathrl: warning: held-out evaluation is off with rollout.tensor_parallel_size > 1; evaluate the "
                  "saved checkpoints with `mathrl eval`", file=sys.stderr, flush=True)
        eval_problems = []
    models = build_models(cfg, dist, cfg.train.steps)
    state = State()
    resume_from, logger = resume_and_log(cfg, dist, out, models, state)
    rollout = make_rollout(cfg, models)
    try:
        sync_weights(rollout, models.policy)
        before: dict = {}
        last_eval: tuple[int, dict] = (-1, {})
        if eval_problems and state.step == 0:
            before = evaluate(rollout, eval_problems, cfg, out_dir=_main_only(dist, out / "eval" / "step_000000"),
                              dist=dist)
            logger.log(0, before, event="eval")
        while state.step < cfg.train.steps:
            metrics = train_step(cfg, dist, models, rollout, problems, state, loss_sign=loss_sign,
                                 reward_fn=reward_fn)
            state.step += 1
            state.bad_steps = state.bad_steps + 1 if metrics["bad_step"] else 0
            if _iterative(cfg, models) and state.step % cfg.algo.ref_update_every == 0:
                t0 = time.perf_counter()
                reset_reference(models)
                state.ref_step = state.step
                metrics["time/ref_reset"] = time.perf_counter() - t0
            if _iterative(cfg, models):
                metrics["ref/step"] = float(state.ref_step)
            metrics.update(process_stats())
            metrics["checkpoint/failures"] = float(state.save_failures)
            logger.log(state.step, metrics)
            if state.bad_steps >= cfg.train.max_bad_steps:
                # skipped steps left the weights as they were after the last good step: save them
                n = state.bad_steps
                save_checkpoint(cfg, dist, models, state, final=True)
                saved = ckpt.list_checkpoints(out)[-1][1]
                raise TrainingError(f"step {state.step}: {n} consecutive steps had NaN/inf and were skipped (last one: "
                                    f"{metrics.get('bad_reason', 'on another rank')}); the weights are those of step "
                                    f"{state.step - n}, saved in {saved}. Lower train.lr or check the reward function "
                                    "and data, then resume with --resume auto")
            if cfg.train.save_every and state.step % cfg.train.save_every == 0:
                save_checkpoint(cfg, dist, models, state)
            if cfg.eval.every and state.step % cfg.eval.every == 0 and eval_problems:
                last_eval = (state.step, evaluate(rollout, eval_problems, cfg, dist=dist, out_dir=_main_only(
                    dist, out / "eval" / ckpt.step_dirname(state.step))))
                logger.log(state.step, last_eval[1], event="eval")
        if not ckpt.list_checkpoints(out) or ckpt.list_checkpoints(out)[-1][0] != state.step:
            save_checkpoint(cfg, dist, models, state, final=True)
        if last_eval[0] == state.step:  # the periodic evaluation of the last step is the final one
            after = last_eval[1]
        else:
            after = evaluate(rollout, eval_problems, cfg, dist=dist, out_dir=_main_only(
                dist, out / "eval" / ckpt.step_dirname(state.step))) if eval_problems else {}
            if after:
                logger.log(state.step, after, event="eval")
        if dist.is_main:
            _report(out, before, after)
    finally:
        logger.close()
        rollout.close()
    return 0


def _main_only(dist: DistInfo, path: Path) -> Path | None:
    return path if dist.is_main else None


def make_rollout(cfg: Config, models: Models):
    """The rollout engine. The hf backend shares the trainer's module when it is not ZeRO-3
    sharded (no second copy of the weights, nothing to sync); vLLM gets weights pushed."""
    from mathrl.rollout import make_engine, resolve_backend

    backend, _why = resolve_backend(cfg.rollout.backend, cfg.rollout.vllm_python)
    kwargs: dict[str, Any] = {}
    if backend == "hf":
        if models.policy.zero_optimization_stage() < 3:
            kwargs["model"] = models.policy.module
        kwargs["device"] = device()
    else:
        from mathrl.rollout.vllm import dist_from_env

        r = cfg.rollout
        kwargs.update(vllm_python=r.vllm_python, gpu_memory_utilization=r.gpu_memory_utilization,
                      cpu_kv_cache_gb=r.kv_cache_gb, tensor_parallel_size=r.tensor_parallel_size,
                      max_model_len=r.max_model_len, enable_sleep_mode=r.enable_sleep_mode,
                      enforce_eager=r.enforce_eager, sleep_between_steps=r.sleep_between_steps,
                      sleep_level=r.sleep_level, dist=dist_from_env())
    if cfg.rollout.dtype != "auto":
        dtype = cfg.rollout.dtype
    else:
        dtype = "float32" if resolve_dtype(cfg.model.dtype) == torch.float32 else "bfloat16"
    seed = cfg.train.seed if cfg.rollout.seed is None else cfg.rollout.seed
    return make_engine(backend, models.model_path, tokenizer=models.tokenizer, seed=seed, dtype=dtype, **kwargs)


def _report(out: Path, before: dict, after: dict) -> None:
    from mathrl.train.metrics import read_metrics

    history = [h for h in read_metrics(out / "metrics.jsonl") if "event" not in h]
    if history:
        plot_rewards(history, out / "reward_curve.png")
    if before or after:
        keys = [k for k in (after or before)]
        lines = ["| metric | before | after |", "|---|---|---|"]
        for k in keys:
            b, a_ = before.get(k), after.get(k)
            lines.append(f"| {k} | {'' if b is None else f'{b:.3f}'} | {'' if a_ is None else f'{a_:.3f}'} |")
        table = "\n".join(lines)
        (out / "summary.md").write_text(table + "\n")
        print("\nHeld-out evaluation before and after training:\n" + table, flush=True)
    if history:
        print(f"\nreward curve: {out / 'reward_curve.png'}; metrics: {out / 'metrics.jsonl'}", flush=True)
