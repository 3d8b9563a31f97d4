"""Memory: what a training micro-batch needs, what this process may still use, and the token budget
that fits (``train.micro_batch_tokens: auto``).

A micro-batch's forward keeps, for the backward, every decoder layer's activations at every position it
processes, and the response logits with their gradient. For a Llama-style layer in float32 (RMSNorm,
rotary attention with grouped KV heads, SwiGLU MLP) the saved tensors per position are about
``10 h + 4 kv + 4 i`` numbers (h the hidden size, kv the KV width, i the MLP width: the norms' inputs
and outputs, q/k/v before and after the rotary embedding, the KV heads repeated to all heads for the
attention kernel, the attention output, and the MLP's gate, up, activation and product), plus ``2 H S``
for the attention weights and their softmax (H heads, S the positions attended to) when the attention
kernel keeps that score matrix (:func:`builds_score_matrix`: eager attention does, flash and sdpa's fused
kernels do not); the response positions add ``2 V`` (logits and their gradient, V the vocabulary). With the shared prompt
(``train.share_prompt``) a group's prompt is processed once: ``groups x P`` prompt positions and
``rows x T`` response positions, each response attending to its prompt and itself.
:data:`CALIBRATION` scales this count to what ``scripts/bench_memory.py`` measured (peak resident
memory of a forward and backward of SmolLM2-135M-Instruct on CPU; README's memory table).

What the process may use is the least of the machine's ``MemAvailable``, the cgroup's limit minus its
usage (v2 ``memory.max``/``memory.current``, v1 ``memory.limit_in_bytes``/``usage_in_bytes``) and
the address-space limit (``RLIMIT_AS``) minus the address space in use.
"""

from __future__ import annotations

import math
import resource
from pathlib import Path
from typing import Any
from mathrl.config import ConfigError
from mathrl.dist.collectives import device, global_min
from mathrl.train.checkpoint import TrainingError
from mathrl.train.layouts import group_share
from mathrl.train.preflight import context_length, longest_prompt

__all__ = ["AUTO_TOKENS", "CALIBRATION", "available_bytes", "builds_score_matrix", "fit_micro_batches",
           "micro_batch_bytes", "optimizer_reserve", "parameter_count", "per_token_bytes", "token_cap",
           "tokens_that_fit"]

#: scale from the counted numbers to the measured peak (``scripts/bench_memory.py`` on SmolLM2, CPU, float32,
#: sdpa, whose CPU kernel is torch's flash kernel and keeps no score matrix, so the count has no ``2 H S`` term:
#: over the README's 7 measured shapes the count is 0.76-0.87x the measured peak less the 513 MiB of parameter
#: gradients the backward allocates (which :func:`fit_micro_batches` reserves separately), lowest for short
#: sequences, where allocator slack and the kernels' temporaries weigh most; x 1.35 it is 1.03-1.17x, so the
#: estimate does not fall short on any measured shape)
CALIBRATION = 1.35


#: attention implementations (``config._attn_implementation``) whose kernel never materialises the
#: ``heads x S x S`` score matrix (flash attention computes the softmax block by block and keeps only its
#: log-sum-exp per row)
FUSED_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention", "sdpa_paged",
                   "flash_paged", "kernels-community/flash-attn", "kernels-community/vllm-flash-attn3")


def builds_score_matrix(config: Any, device: Any = "cpu", dtype: Any = None) -> bool:
    """Whether the model's attention keeps the ``heads x S x S`` score matrix (and its softmax) for the
    backward, read from ``config._attn_implementation``:

    * ``eager`` (and any implementation not named below): yes, ``softmax(Q K^T)`` is an autograd tensor.
    * flash / flex attention (:data:`FUSED_ATTENTION`): no.
    * ``sdpa``: what torch's dispatcher picks for this device, the model's dtype and head size, a 4-D padding
      mask (the trainer's micro-batches are padded) and the config's ``attention_dropout``, asked with
      ``torch._fused_sdp_choice``: the math kernel keeps the score matrix, the fused ones (flash,
      memory-efficient, cuDNN) do not. On CPU torch >= 2.3 picks its flash kernel, which takes a mask
      (checked with torch 2.13: fp32, bf16 and fp16, with and without gradients; the profiler shows
      ``_scaled_dot_product_flash_attention_for_cpu`` in the trainer's forward and backward), but falls back
      to the math kernel with dropout > 0. When the question cannot be asked (a CUDA device in a process
      without CUDA, a torch without the probe) the answer is: no on CUDA (the memory-efficient kernel takes
      any mask), yes elsewhere.
    """
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl in FUSED_ATTENTION or "flash" in impl:
        return False
    if impl != "sdpa":
        return True
    import torch

    dev = torch.device(device)
    _, _, _, _, heads, _ = _dims(config)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
    try:
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA in this process")
        q = torch.zeros(1, heads, 8, head_dim, dtype=dtype or torch.float32, device=dev, requires_grad=True)
        mask = torch.ones(1, 1, 8, 8, dtype=torch.bool, device=dev).tril()
        choice = torch._fused_sdp_choice(q, q.detach(), q.detach(), mask, dropout, False)
        return int(choice) == int(torch.nn.attention.SDPBackend.MATH)
    except Exception:
        return dev.type != "cuda"


def _dims(config: Any) -> tuple[int, int, int, int, int, int]:
    """(layers, hidden, kv width, MLP width, heads, vocabulary) of a transformers config."""
    h = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or h // heads)
    inter = int(getattr(config, "intermediate_size", None) or 4 * h)
    return int(config.num_hidden_layers), h, kv_heads * head_dim, inter, heads, int(config.vocab_size)


def micro_batch_bytes(config: Any, *, groups: int, rows: int, prompt_len: int, response_len: int,
                      bytes_per_number: int = 4, checkpointing: bool = False, scores: bool = True) -> int:
    """Estimated activation memory (bytes) of one micro-batch's forward + backward: ``groups`` prompts of
    ``prompt_len`` tokens processed once, ``rows`` responses of ``response_len`` tokens (see the module
    docstring for the count). With gradient checkpointing only each layer's input is kept, plus one
    layer's activations during its recomputation. ``scores``: the attention kernel keeps the score matrix
    (:func:`builds_score_matrix`)."""
    L, h, kv, inter, heads, V = _dims(config)
    per_position = 10 * h + 4 * kv + 4 * inter
    positions = groups * prompt_len + rows * response_len
    attention = 2 * heads * (groups * prompt_len * prompt_len + rows * response_len * (prompt_len + response_len)) \
        if scores else 0
    logits = 2 * V * rows * response_len
    layers = (L * h * positions + per_position * positions + attention) if checkpointing \
        else L * (per_position * positions + attention)
    return int(CALIBRATION * (layers + logits) * bytes_per_number)


def per_token_bytes(config: Any, *, group_size: int, prompt_len: int, response_len: int,
                    bytes_per_number: int = 4, checkpointing: bool = False, scores: bool = True) -> float:
    """Estimated bytes per budget token (``groups x P + rows x T``) for micro-batches of whole groups of
    ``group_size`` rows with prompts of ``prompt_len`` and responses of ``response_len`` tokens."""
    tokens = prompt_len + group_size * response_len
    return micro_batch_bytes(config, groups=1, rows=group_size, prompt_len=prompt_len, response_len=response_len,
                             bytes_per_number=bytes_per_number, checkpointing=checkpointing, scores=scores) / tokens


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_headroom() -> int | None:
    """The memory cgroup's limit minus its usage (None when unlimited or unknown)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup") / rel
            limit, used = _read_int(base / "memory.max"), _read_int(base / "memory.current")
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / rel
            limit, used = _read_int(base / "memory.limit_in_bytes"), _read_int(base / "memory.usage_in_bytes")
        else:
            continue
        if limit is not None and used is not None and limit < 1 << 60:
            return max(0, limit - used)
    return None


def available_bytes() -> tuple[int, str]:
    """Bytes this process can still allocate, and which limit that is (``MemAvailable``, ``cgroup`` or
    ``RLIMIT_AS``)."""
    found: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except OSError:
        pass
    cg = _cgroup_headroom()
    if cg is not None:
        found.append((cg, "cgroup memory limit"))
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        vm = 0
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmSize:"):
                    vm = int(line.split()[1]) * 1024
        except OSError:
            pass
        found.append((max(0, soft - vm), "RLIMIT_AS"))
    if not found:
        return (1 << 62, "unknown")
    return min(found)


def tokens_that_fit(config: Any, budget_bytes: float, **sizes) -> int:
    """The largest token budget whose estimated activations fit in ``budget_bytes`` (0 when none);
    ``sizes`` are :func:`per_token_bytes`'s keyword arguments."""
    if budget_bytes <= 0:
        return 0
    return int(math.floor(budget_bytes / per_token_bytes(config, **sizes)))


def parameter_count(p: Any) -> int:
    """The number of elements of parameter ``p``, also under ZeRO-3, where ``p.numel()`` is 0 for a partitioned
    parameter and DeepSpeed keeps the full count in ``p.ds_numel``."""
    n = getattr(p, "ds_numel", None)
    return int(n) if n is not None else int(p.numel())


#: share of the free memory the activations may take (the rest: gradients, the optimizer's first step,
#: the verifier's workers, the allocator's fragmentation)
HEADROOM = 0.7

#: ``train.micro_batch_tokens: auto``: this budget, lowered to what the free memory holds
AUTO_TOKENS = 8192


def token_cap(value: int | str) -> int:
    """The token budget ``train.micro_batch_tokens = value`` asks for: the number, or :data:`AUTO_TOKENS` for
    ``auto`` (before :func:`fit_micro_batches` lowers it; for a tool that sizes micro-batches without the trainer)."""
    return AUTO_TOKENS if value == "auto" else int(value)


def _size(n: float) -> str:
    """``n`` bytes in GiB, MiB or KiB (a tiny test model's activations are kilobytes)."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= 0.1 * scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2 ** 10:.1f} KiB"


def optimizer_reserve(params: int, *, stage: int, world: int, offloaded: bool = False) -> int:
    """Bytes one rank still needs, after the engines are built, for the training state of ``params`` trainable
    parameters (full count) at ZeRO ``stage`` over ``world`` data-parallel ranks:

    * Adam's two moments, float32, allocated at the first optimizer step: ``8 P``, partitioned over the ranks
      from stage 1 (none on a GPU with ``deepspeed.offload``: ``offloaded``, they live in CPU memory);
    * gradients, accumulated in float32: ``4 P``, partitioned from stage 2.

    A bf16 model's float32 master copy is not counted: the engine allocates it when it is built, before the fit
    measures the free memory. So stage 0 is ``12 P`` per rank and stage 2 or 3 over 8 ranks ``12 P / 8``."""
    if world < 1 or stage not in (0, 1, 2, 3):
        raise ValueError(f"optimizer_reserve: world={world}, stage={stage}; allowed: world >= 1, stage 0-3")
    moments = 0 if offloaded else 8 * params // (world if stage >= 1 else 1)
    return moments + 4 * params // (world if stage >= 2 else 1)


def fit_micro_batches(cfg, dist, models, prompt_len: int, resumed: int | None = None) -> dict[str, float]:
    """Before the first step: decide ``train.micro_batch_tokens``, an int afterwards for every reader.

    * ``auto``: :data:`AUTO_TOKENS`, lowered to what the free memory holds (a note names the numbers);
      on resume (``resumed``: the budget the checkpoint's run used) that budget, when the free memory still holds
      it (the same micro-batches, so the resumed run is the same run; a note when a fresh run would split
      otherwise).
    * a number is a pin: kept when its largest micro-batch fits, else a :class:`TrainingError` before training
      names what it needs, what is free, the largest value that fits and the settings to change.

    Either way a run where not even one group fits stops with the settings to change, and a resumed run whose
    micro-batches differ from its checkpoint's gets a warning naming both budgets (a different split changes the
    float rounding). A budget above a whole mini-batch of this rank forms the same micro-batches as any other
    such budget, so it fits when the mini-batch does. The fit is agreed over ranks (the least). Returns ``sys/*``
    metrics (free memory, the budget, the activation estimate at that budget) for every step's log.

    Free memory: the GPU's free memory on CUDA, else :func:`available_bytes` shared by the ranks on this
    machine (``LOCAL_WORLD_SIZE``), less this rank's share of the gradients and optimizer state still to be
    allocated (:func:`optimizer_reserve`; for the policy, the critic and a PRM that iterative RL retrains)."""
    import os
    import sys

    import torch

    t, r = cfg.train, cfg.rollout
    dev = device()
    trained = [models.policy.module] + ([models.critic.module] if models.critic is not None else [])
    trainable = sum(parameter_count(p) for m in trained for p in m.parameters() if p.requires_grad)
    first = next(models.policy.module.parameters())
    elem = first.element_size()  # 4 in float32, 2 in bfloat16
    offloaded = dev.type == "cuda" and cfg.deepspeed.offload != "none"
    later = optimizer_reserve(trainable, stage=cfg.deepspeed.zero_stage, world=dist.world_size, offloaded=offloaded)
    if models.prm is not None and cfg.algo.prm_update_every:  # iterative RL trains the (now frozen) PRM every N steps,
        prm_params = sum(parameter_count(p) for p in getattr(models.prm, "module", models.prm).parameters())
        later += optimizer_reserve(prm_params, stage=0, world=dist.world_size)  # a stage-0 engine (prm/iterative)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        avail, what = int(free), "free GPU memory"
    else:
        avail, what = available_bytes()
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        avail //= local
        if local > 1:
            what += f" / {local} ranks on this machine"
    budget = max(0.0, HEADROOM * (avail - later))
    gs = group_share(cfg)
    rows = gs if gs > 1 else 1
    config = models.policy.module.config
    ckpt_on = bool(cfg.model.gradient_checkpointing)
    sizes = dict(group_size=rows, prompt_len=prompt_len, response_len=r.max_tokens, checkpointing=ckpt_on,
                 bytes_per_number=elem, scores=builds_score_matrix(config, dev, first.dtype))
    fit = tokens_that_fit(config, budget, **sizes)
    fit = int(global_min(torch.tensor(float(fit))).item())
    one = prompt_len + rows * r.max_tokens  # the smallest micro-batch: one group (or one row)
    per = per_token_bytes(config, **sizes)
    free_text = (f"{_size(budget)} are free for them ({what}: {_size(avail)}, less {_size(later)} for gradients and "
                 f"optimizer state, times the headroom {HEADROOM})")
    if fit < one:
        raise TrainingError(
            f"memory: one micro-batch of {rows} response(s) of rollout.max_tokens={r.max_tokens} tokens after a "
            f"{prompt_len}-token prompt needs about {_size(one * per)} of activations, but only {free_text}; lower "
            "rollout.max_tokens or rollout.n, set model.gradient_checkpointing=true, or free memory")
    # the largest micro-batch this run can form: the budget, or a whole mini-batch of this rank when smaller
    prompts = max(1, (t.mini_batch_size or t.batch_size) // dist.world_size)
    whole = prompts * (prompt_len + r.n * r.max_tokens) if rows > 1 else prompts * r.n * (prompt_len + r.max_tokens)

    def fits(tokens: int) -> bool:
        return min(tokens, whole) <= fit

    given = t.micro_batch_tokens
    fresh = AUTO_TOKENS if fits(AUTO_TOKENS) else fit  # what auto decides for a fresh run
    if given != "auto":  # a pin
        if not fits(given):
            largest = min(given, whole)
            mini = f" (a whole mini-batch of this rank: {whole} tokens)" if whole < given else ""
            raise TrainingError(
                f"memory: train.micro_batch_tokens={given} is pinned, but micro-batches of up to {largest} tokens"
                f"{mini} need about {_size(largest * per)} of activations and only {free_text}; the largest value "
                f"that fits is {fit}: set train.micro_batch_tokens=auto (lowered to what fits) or at most {fit}, "
                "or lower rollout.max_tokens or rollout.n, set model.gradient_checkpointing=true, or free memory")
        used = given
    elif resumed is not None and fits(resumed):
        used = resumed
        if min(resumed, whole) != min(fresh, whole) and dist.is_main:
            print(f"mathrl: note: resume: keeping the checkpoint's train.micro_batch_tokens={resumed} (auto would "
                  f"choose {fresh} for a fresh run; the same micro-batches, so the resumed run continues the same "
                  "run)", file=sys.stderr, flush=True)
    else:
        used = fresh
        if fresh < min(AUTO_TOKENS, whole) and dist.is_main:
            print(f"mathrl: note: memory: micro-batches of up to {min(AUTO_TOKENS, whole)} tokens would need about "
                  f"{_size(min(AUTO_TOKENS, whole) * per)} of activations and {free_text}; using "
                  f"train.micro_batch_tokens={fresh} (auto: same loss and gradients, more micro-batches). The run "
                  "folder's config.yaml records it: a rerun from that file splits the same way (pin a number for "
                  "an A/B pair: the free memory at start varies)", file=sys.stderr, flush=True)
    t.micro_batch_tokens = used
    if resumed is not None and min(resumed, whole) != min(used, whole) and dist.is_main:
        why = f"the free memory holds {fit}" if given == "auto" else f"the configured value is {given}"
        print(f"mathrl: warning: resume: micro-batches of train.micro_batch_tokens={used}, but the checkpoint's run "
              f"used {resumed} ({why}): they split differently, so the resumed run's losses and gradients equal an "
              "uninterrupted run's only up to float rounding; to continue it bit for bit, resume with "
              f"train.micro_batch_tokens=auto or {resumed} and that much memory free", file=sys.stderr, flush=True)
    gb = 2 ** 30
    return {"sys/memory_available_gb": avail / gb, "sys/micro_batch_tokens": float(used),
            "sys/activation_estimate_gb": used * per / gb}


#: a derived ``rollout.max_model_len`` is rounded up to a multiple of this many tokens (a margin for a prompt a
#: little longer than the longest one measured, see :func:`mathrl.train.preflight.longest_prompt`)
CONTEXT_ROUND = 256


def context_for(configured: int | None, needs: dict[str, tuple[str, int, int]], context: int | None) -> int:
    """The rollout engine's context length (``rollout.max_model_len``) for a run whose generations need
    ``needs``: ``{max_tokens key: (what, longest prompt, max new tokens)}``, e.g. ``{"rollout.max_tokens":
    ("training", 180, 1024), "eval.max_tokens": ("held-out", 200, 512)}``.

    Unset (``configured`` None): the largest prompt + new tokens, rounded up to a multiple of
    :data:`CONTEXT_ROUND`, and at most the model's ``context`` (when that still holds it). vLLM's own default,
    the model's whole context, reserves KV cache for sequences the run never forms. Set: kept, unless it is
    below what the run needs (a :class:`~mathrl.config.ConfigError` names the key and the numbers: vLLM would
    cut the responses there)."""
    key, (what, prompt, new) = max(needs.items(), key=lambda kv: kv[1][1] + kv[1][2])
    need = prompt + new
    if configured is not None:
        if configured < need:

            raise ConfigError(
                f"rollout.max_model_len = {configured}: the longest {what} prompt ({prompt} tokens) plus {key} = "
                f"{new} new tokens is {need} tokens, and vLLM would cut responses at {configured}; set "
                f"rollout.max_model_len to at least {need}, or leave it unset (null) to size it to the run")
        return int(configured)
    size = -(-need // CONTEXT_ROUND) * CONTEXT_ROUND
    if context is not None and need <= context:
        size = min(size, int(context))
    return size


def size_rollout_context(cfg, tokenizer, problems, eval_problems, model_path: str) -> int:
    """Set ``cfg.rollout.max_model_len`` to :func:`context_for` this run (its training prompts with
    ``rollout.max_tokens``, its held-out prompts with ``eval.max_tokens``; the model's context from its
    config.json) before the rollout engine is built; returns it."""

    system = cfg.data.system_prompt
    needs = {"rollout.max_tokens": ("training", longest_prompt(cfg, tokenizer, problems, system)[0],
                                    cfg.rollout.max_tokens)}
    if eval_problems:
        needs["eval.max_tokens"] = ("held-out", longest_prompt(cfg, tokenizer, eval_problems, system)[0],
                                    cfg.eval.max_tokens)
    context = context_length(cfg, model_path)[0] if cfg.rollout.max_model_len is None else None
    cfg.rollout.max_model_len = context_for(cfg.rollout.max_model_len, needs, context)
    return cfg.rollout.max_model_len
