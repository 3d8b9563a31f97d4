"""Every rule that refuses or warns about a combination of settings, in one place.

Single fields are checked where they are declared (:func:`mathrl.config.schema.option`: type, bounds,
registry choices); the rules here need more than one field, or a fact of the run:

* :func:`refuse` -- combinations that cannot run or would learn nothing (every command that loads a config,
  through :func:`mathrl.config.validate`);
* :func:`refuse_for_training` -- what a training run also needs: the world size dividing the batch, a dtype
  the DeepSpeed configs can train in;
* :func:`refuse_for_method` -- settings a training method cannot honour (asynchronous rollout with RFT);
* :func:`warnings` -- valid settings that have no effect in the run (printed once before any work:
  :func:`inert_settings`), that differ from the method's paper (:func:`off_paper_settings`) or that leave
  something uncorrected.

Each message names the key and value at fault and the fix. A leaf module: it reads the registries
(:mod:`mathrl.registry`) for the estimators' and sources' facts and imports nothing above :mod:`mathrl.config`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mathrl.config.errors import ConfigError
from mathrl.config.schema import Config
from mathrl.registry import ESTIMATORS, SOURCES

__all__ = ["inert_settings", "off_paper_settings", "refuse", "refuse_for_method", "refuse_for_training", "warnings"]


def refuse(cfg: Config) -> None:
    """Raise :class:`ConfigError` on the first combination of settings that cannot run or would learn nothing."""
    # G = 1 with a group baseline is refused, not warned about: the baseline is the sample's own reward
    # (grpo, dr_grpo) or undefined (rloo's leave-one-out mean over G - 1 = 0 others), so every advantage
    # is 0, the policy gradient vanishes and the run would spend its whole budget learning nothing while
    # its logs look normal. A warning scrolls past in a days-long log; the fix is one override.
    allowed = ("auto", *ESTIMATORS)
    if cfg.algo.advantage not in allowed:
        raise ConfigError(f"algo.advantage = {cfg.algo.advantage!r}: unknown advantage estimator; allowed: "
                          f"{', '.join(allowed)}")
    spec = ESTIMATORS[cfg.advantage]
    algo_fields = {f.name for f in dataclasses.fields(type(cfg.algo))}
    unknown = [p for p in spec.params if p not in algo_fields]
    if unknown:
        raise ConfigError(f"algo.advantage = {spec.name!r}: the estimator declares params {unknown} that are not "
                          f"algo.* fields; allowed: {', '.join(sorted(algo_fields))}")
    if cfg.rollout.n < spec.min_group:
        others = [s.name for s in ESTIMATORS.values() if s.min_group <= cfg.rollout.n and not s.needs_critic]
        alt = f"algo.advantage={others[0]}, or " if others else ""
        few = "one sample" if cfg.rollout.n == 1 else f"only {cfg.rollout.n} samples"
        raise ConfigError(f"rollout.n = {cfg.rollout.n}: the '{spec.name}' advantage compares the samples of "
                          f"a prompt with each other; with {few} every advantage is 0 and nothing is "
                          f"learned, so it needs rollout.n >= {spec.min_group}; fix: set "
                          f"rollout.n={max(8, spec.min_group)} (or more), or use an estimator with a baseline "
                          f"across prompts: {alt}algo.name=ppo (critic)")
    if cfg.algo.std_normalize is not True and "std_normalize" not in spec.params:
        takes = [s.name for s in ESTIMATORS.values() if "std_normalize" in s.params]
        raise ConfigError(f"algo.std_normalize = {cfg.algo.std_normalize!r} with algo.advantage resolving to "
                          f"{spec.name!r}: only {', '.join(takes)} reads algo.std_normalize, so the setting would be "
                          f"ignored; use algo.advantage={takes[0]} with it, or leave algo.std_normalize at true")
    if spec.level == "step" and not cfg.model.prm:
        raise ConfigError(f"algo.advantage = {spec.name!r} scores each step with a process reward model, and "
                          "model.prm is not set; train one (`mathrl prm label`, then `mathrl prm train --out DIR`) "
                          "and set model.prm=DIR (in a study, study.prm: {problems: 64} trains one first)")
    if cfg.model.prm and spec.level != "step":
        takes = [s.name for s in ESTIMATORS.values() if s.level == "step"]
        raise ConfigError(f"model.prm = {cfg.model.prm!r} with algo.advantage resolving to {spec.name!r}: only "
                          f"{', '.join(takes)} reads a process reward model, so it would be loaded and ignored; set "
                          f"algo.advantage={takes[0]}, or remove model.prm")
    if spec.level == "step" and cfg.algo.kl_coef > 0 and cfg.kl_in == "reward":
        raise ConfigError(f"algo.kl_in = reward with algo.advantage = {spec.name!r}: the process advantage is built "
                          "from the PRM's step rewards only (DeepSeekMath keeps GRPO's KL in the loss); set "
                          "algo.kl_in=loss (or auto)")
    if cfg.algo.prm_update_every and spec.level != "step":
        raise ConfigError(f"algo.prm_update_every = {cfg.algo.prm_update_every} with algo.advantage resolving to "
                          f"{spec.name!r}: retraining a process reward model only matters for algo.advantage=grpo_ps")
    if cfg.algo.prm_update_every and cfg.deepspeed.zero_stage == 3:
        raise ConfigError(f"algo.prm_update_every = {cfg.algo.prm_update_every} with deepspeed.zero_stage = 3: the PRM "
                          "is a sharded inference engine under ZeRO-3 and is not retrained in the run; use zero_stage "
                          "1 or 2, or algo.prm_update_every=0")
    if cfg.algo.ps_outcome_weight and "ps_outcome_weight" not in spec.params:
        raise ConfigError(f"algo.ps_outcome_weight = {cfg.algo.ps_outcome_weight} with algo.advantage resolving to "
                          f"{spec.name!r}: only grpo_ps mixes an outcome advantage into process rewards, so the "
                          "setting would be ignored; set algo.advantage=grpo_ps, or algo.ps_outcome_weight=0")
    if cfg.algo.dynamic_sampling and spec.min_group < 2:
        group_est = [s.name for s in ESTIMATORS.values() if s.min_group >= 2]
        raise ConfigError(f"algo.dynamic_sampling = true with algo.advantage resolving to {spec.name!r}: dynamic "
                          "sampling drops groups whose rewards are all equal, which only carry no signal for a "
                          f"group-relative estimator; use one of {', '.join(group_est)}, or set "
                          "algo.dynamic_sampling=false")
    for key, new in (("rollout.max_tokens", cfg.rollout.max_tokens), ("eval.max_tokens", cfg.eval.max_tokens)):
        if cfg.rollout.max_model_len is not None and cfg.rollout.max_model_len <= new:
            raise ConfigError(f"rollout.max_model_len = {cfg.rollout.max_model_len} leaves no room for a prompt before "
                              f"{key} = {new} new tokens (vLLM cuts a sequence at max_model_len); set "
                              "rollout.max_model_len above it, or leave it unset (null) to size it to the run")
    if cfg.rollout.staleness:
        conflicts = [(k, why) for k, on, why in (
            ("algo.dynamic_sampling", cfg.algo.dynamic_sampling, "its extra rounds need this step's grades before "
             "the next step's prompts are drawn"),
            ("algo.pass_rate_filter", cfg.algo.pass_rate_filter, "the next step's prompts would be drawn before "
             "this step's pass rates are known"),
            ("rollout.sleep_between_steps", cfg.rollout.sleep_between_steps, "the engine must stay awake to sample "
             "during the update"),
            ("rollout.tensor_parallel_size", cfg.rollout.tensor_parallel_size > 1, "a tensor-parallel group's "
             "collectives cannot run in the background generation")) if on]
        if conflicts:
            k, why = conflicts[0]
            raise ConfigError(f"rollout.staleness = {cfg.rollout.staleness} (asynchronous rollout) with {k}: {why}; "
                              f"set rollout.staleness=0 or turn {k} off")
    if cfg.algo.policy_loss == "cispo" and cfg.algo.dual_clip is not None:
        raise ConfigError(f"algo.dual_clip = {cfg.algo.dual_clip} with algo.policy_loss = cispo: CISPO already "
                          "bounds its weight by clip_low/clip_high; set algo.dual_clip=null")
    shorthands = [k for k, v, default in (("reward.function", cfg.reward.function, "correctness"),
                                          ("reward.overlong_penalty", cfg.reward.overlong_penalty, 0.0))
                  if v != default]
    if cfg.reward.terms is not None and shorthands:
        raise ConfigError(f"reward.terms is set together with the shorthand {', '.join(shorthands)}; put every "
                          "term in reward.terms (format: {bonus: ...}, length: {coef: ..., buffer: ...}) or use "
                          "only the shorthands")
    if cfg.model.lora is not None and cfg.algo.ref_update_every and cfg.model.ref_model is None:
        raise ConfigError(f"algo.ref_update_every = {cfg.algo.ref_update_every} with model.lora: under LoRA the "
                          "reference model is the policy with its adapters switched off, so it cannot be reset to "
                          "the current policy; set algo.ref_update_every=0, or give a separate model.ref_model")
    if cfg.algo.ref_update_every and cfg.algo.kl_coef == 0:
        raise ConfigError(f"algo.ref_update_every = {cfg.algo.ref_update_every}: resetting the reference model only "
                          "matters with a KL term; set algo.kl_coef > 0 or algo.ref_update_every = 0")
    if cfg.algo.kl_coef > 0 and cfg.kl_in == "loss" and cfg.kl_estimator == "k1":
        raise ConfigError("algo.kl_estimator = 'k1' with the KL in the loss (algo.kl_in resolves to 'loss'): k1 = "
                          "log pi - log pi_ref has zero expected gradient as a loss term, so the penalty would do "
                          "nothing; use k3 (DeepSeekMath) or k2 in the loss, or set algo.kl_in=reward to use k1 "
                          "as a reward penalty")
    mb = cfg.train.mini_batch_size
    if mb is not None and (mb > cfg.train.batch_size or cfg.train.batch_size % mb):
        raise ConfigError(f"train.mini_batch_size = {mb}: must divide train.batch_size = {cfg.train.batch_size}")
    bad_k = [k for k in cfg.eval.k if k < 1 or k > cfg.eval.n]
    if bad_k:
        raise ConfigError(f"eval.k = {cfg.eval.k}: each k must satisfy 1 <= k <= eval.n = {cfg.eval.n}")
    if cfg.train.resume not in ("none", "auto") and not Path(cfg.train.resume).exists():
        raise ConfigError(f"train.resume = {cfg.train.resume!r}: no such checkpoint; allowed: none, auto, "
                          "or an existing checkpoint folder")
    if cfg.deepspeed.config_path is not None and not Path(cfg.deepspeed.config_path).is_file():
        raise ConfigError(f"deepspeed.config_path = {cfg.deepspeed.config_path!r}: file not found")
    if cfg.data.fields is not None:
        readers = [n for n, spec in SOURCES.items() if "fields" in spec.options]
        if cfg.data.source not in readers:
            raise ConfigError(f"data.fields = {cfg.data.fields}: data.source = {cfg.data.source!r} has its own field "
                              f"names; only {', '.join(readers)} reads data.fields (set data.source="
                              f"{readers[0]} and data.path to your file, or remove data.fields)")


def refuse_for_training(cfg: Config, world_size: int) -> None:
    """The rules a training run adds, with ``world_size`` processes."""
    t = cfg.train
    mini = t.mini_batch_size or t.batch_size
    if t.batch_size % world_size or mini % world_size:
        raise ConfigError(f"train.batch_size = {t.batch_size} and train.mini_batch_size = {mini} must be divisible "
                          f"by the number of processes ({world_size})")
    if cfg.model.dtype == "float16":  # "auto" is bfloat16 on GPU, float32 on CPU: never float16
        raise ConfigError("model.dtype = 'float16': training in float16 needs loss scaling, which mathrl's DeepSpeed "
                          "configs do not set up; use model.dtype=bfloat16 (or auto: bfloat16 on GPU, float32 on CPU)")


def refuse_for_method(cfg: Config, method: str, *, sft: bool) -> None:
    """The rules of training ``method`` (``sft``: a method whose update is supervised fine-tuning, RFT)."""
    if sft and cfg.rollout.staleness:
        raise ConfigError(f"rollout.staleness = {cfg.rollout.staleness} with method {method}: asynchronous "
                          "rollout is a GRPO/PPO option (RFT samples and fine-tunes in turn); set "
                          "rollout.staleness=0 for this run")


def warnings(cfg: Config, *, rl: bool = True) -> list[str]:
    """Warnings about ``cfg`` for an RL run (``rl``) or an RFT run: :func:`inert_settings` and, for RL,
    asynchronous rollout without a correction."""
    msgs = inert_settings(cfg) + off_paper_settings(cfg) if rl else []
    if rl and cfg.rollout.staleness and cfg.algo.tis_cap is None:
        msgs.append("rollout.staleness = 1 without algo.tis_cap: every batch was sampled by the weights one "
                    "optimizer step old and nothing corrects for it: the PPO ratio is taken against the "
                    "trainer's current weights (exactly 1 with one update per batch), so its clip never sees the "
                    "staleness; set algo.tis_cap (2.0 is usual) to weight each token by pi_current / pi_sampler")
    return msgs


def off_paper_settings(cfg: Config) -> list[str]:
    """Warnings for explicit settings that differ from the chosen method's paper in a way that changes what it
    computes (the ``auto`` values are the papers'; see :attr:`Config.clip_low`, :attr:`Config.loss_agg`)."""
    a, out = cfg.algo, []
    if a.policy_loss == "gspo":
        wide = [f"algo.{k} = {getattr(a, k)}" for k in ("clip_low", "clip_high")
                if getattr(a, k) != "auto" and float(getattr(a, k)) > 0.01]
        if wide:
            out.append(f"{' and '.join(wide)} with algo.policy_loss = gspo: GSPO clips one ratio per response, the "
                       "geometric mean of its token ratios, which stays within about 1e-3 of 1, so a clip this wide "
                       "almost never binds and the update is an unclipped sequence-level policy gradient; the paper "
                       "uses 3e-4 / 4e-4 (set algo.clip_low=auto algo.clip_high=auto)")
        if a.loss_agg not in ("auto", "seq-mean-token-mean"):
            out.append(f"algo.loss_agg = {a.loss_agg} with algo.policy_loss = gspo: GSPO averages each response's "
                       "tokens, then the responses (seq-mean-token-mean); this aggregation weights responses by "
                       "their length instead (set algo.loss_agg=auto)")
    spec = ESTIMATORS[cfg.advantage]
    if spec.loss_agg is not None and a.loss_agg not in ("auto", spec.loss_agg):
        out.append(f"algo.loss_agg = {a.loss_agg} with algo.advantage = {spec.name}: the estimator's paper "
                   f"aggregates with {spec.loss_agg} (Dr. GRPO removes the 1/|o_i| length normaliser as well as "
                   "the std); set algo.loss_agg=auto, or keep this to study the aggregation on its own")
    return out


def inert_settings(cfg: Config) -> list[str]:
    """Warnings for settings that are valid but have no effect in this run (the loop prints them).

    The PPO clip acts only off-policy: with ``algo.ppo_epochs = 1`` and one mini-batch per step, the
    old logprobs are the current ones (:func:`mathrl.train.loop.train_step` does not even compute
    them), the ratio is exactly 1 on every token, and neither clip bound (nor a dual clip) is ever
    reached. The defaults (0.2 / 0.2, no dual clip) are then harmless; a non-default bound -- DAPO's
    clip-higher above all -- is a choice the user expects to matter, so it is reported.
    """
    a, t = cfg.algo, cfg.train
    if cfg.updates_per_step > 1:
        return []
    default = type(a)()
    set_ = [f"algo.{k} = {getattr(a, k)}" for k in ("clip_low", "clip_high", "dual_clip")
            if getattr(a, k) != getattr(default, k)]
    if not set_:
        return []
    mb = "null (the whole batch)" if t.mini_batch_size is None else t.mini_batch_size
    return [f"{' and '.join(set_)} has no effect in this run: each batch makes exactly one optimizer update "
            f"(algo.ppo_epochs = 1, train.mini_batch_size = {mb} with train.batch_size = {t.batch_size}), so the "
            "importance ratio is exactly 1 on every token and no clip bound is reached; "
            f"the clip acts only on off-policy updates: set train.mini_batch_size to a divisor of "
            f"{t.batch_size} below it (several updates per step) or algo.ppo_epochs > 1"]
