"""Memory: what a training micro-batch needs, what this process may still use, and the token budget
that fits (``train.micro_batch_tokens: auto``).

A micro-batch's forward keeps, for the backward, every decoder layer's activations at every position it
processes, and the response logits with their gradient. For a Llama-style layer in float32 (RMSNorm,
rotary attention with grouped KV heads, SwiGLU MLP) the saved tensors per position are about
``10 h + 4 kv + 4 i`` numbers (h the hidden size, kv the KV width, i the MLP width: the norms' inputs
and outputs, q/k/v before and after the rotary embedding, the KV heads repeated to all heads for the
attention kernel, the attention output, and the MLP's gate, up, activation and product), plus ``2 H S``
for the attention weights and their softmax (H heads, S the positions attended to); the response
positions add ``2 V`` (logits and their gradient, V the vocabulary). With the shared prompt
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

__all__ = ["CALIBRATION", "available_bytes", "micro_batch_bytes", "per_token_bytes", "tokens_that_fit"]

#: scale from the counted numbers to the measured peak (``scripts/bench_memory.py`` on SmolLM2, CPU, float32:
#: the plain count was 0.79-1.40x the measured peak over 7 shapes, lowest for short sequences, where
#: allocator slack and the kernels' temporaries weigh most; x 1.25 it is 0.99-1.75x, so the estimate does not
#: fall short on any measured shape)
CALIBRATION = 1.25


def _dims(config: Any) -> tuple[int, int, int, int, int, int]:
    """(layers, hidden, kv width, MLP width, heads, vocabulary) of a transformers config."""
    h = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or h // heads)
    inter = int(getattr(config, "intermediate_size", None) or 4 * h)
    return int(config.num_hidden_layers), h, kv_heads * head_dim, inter, heads, int(config.vocab_size)


def micro_batch_bytes(config: Any, *, groups: int, rows: int, prompt_len: int, response_len: int,
                      bytes_per_number: int = 4, checkpointing: bool = False) -> int:
    """Estimated activation memory (bytes) of one micro-batch's forward + backward: ``groups`` prompts of
    ``prompt_len`` tokens processed once, ``rows`` responses of ``response_len`` tokens (see the module
    docstring for the count). With gradient checkpointing only each layer's input is kept, plus one
    layer's activations during its recomputation."""
    L, h, kv, inter, heads, V = _dims(config)
    per_position = 10 * h + 4 * kv + 4 * inter
    positions = groups * prompt_len + rows * response_len
    attention = 2 * heads * (groups * prompt_len * prompt_len + rows * response_len * (prompt_len + response_len))
    logits = 2 * V * rows * response_len
    layers = (L * h * positions + per_position * positions + attention) if checkpointing \
        else L * (per_position * positions + attention)
    return int(CALIBRATION * (layers + logits) * bytes_per_number)


def per_token_bytes(config: Any, *, group_size: int, prompt_len: int, response_len: int,
                    bytes_per_number: int = 4, checkpointing: bool = False) -> float:
    """Estimated bytes per budget token (``groups x P + rows x T``) for micro-batches of whole groups of
    ``group_size`` rows with prompts of ``prompt_len`` and responses of ``response_len`` tokens."""
    tokens = prompt_len + group_size * response_len
    return micro_batch_bytes(config, groups=1, rows=group_size, prompt_len=prompt_len, response_len=response_len,
                             bytes_per_number=bytes_per_number, checkpointing=checkpointing) / tokens


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


#: share of the free memory the activations may take (the rest: gradients, the optimizer's first step,
#: the verifier's workers, the allocator's fragmentation)
HEADROOM = 0.7


def fit_micro_batches(cfg, dist, models, prompt_len: int, resumed: int | None = None) -> dict[str, float]:
    """Before the first step: shrink ``train.micro_batch_tokens`` to what the free memory holds (a one-line
    warning names the setting and the numbers), or stop with a :class:`TrainingError` when not even one
    group fits. The budget is agreed over ranks (the least). ``resumed``: the budget the checkpoint's run
    used, kept when it still fits (the same micro-batches, so the resumed run is the same run; a note when the
    configured budget differs), else a warning names both (a different split changes the float rounding). Returns
    ``sys/*`` metrics (free memory, the budget, the activation estimate at that budget) for every step's log.

    Free memory: the GPU's free memory on CUDA, else :func:`available_bytes` shared by the ranks on this
    machine (``LOCAL_WORLD_SIZE``), less the gradients and optimizer state still to be allocated."""
    import os
    import sys

    import torch

    from mathrl.train.checkpoint import TrainingError
    from mathrl.train.engines import device, global_min
    from mathrl.train.update import group_share

    t, r = cfg.train, cfg.rollout
    dev = device()
    trained = [models.policy.module] + ([models.critic.module] if models.critic is not None else [])
    trainable = sum(p.numel() for m in trained for p in m.parameters() if p.requires_grad)
    elem = next(models.policy.module.parameters()).element_size()  # 4 in float32, 2 in bfloat16
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        avail, what = int(free), "free GPU memory"
    else:
        avail, what = available_bytes()
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        avail //= local
        if local > 1:
            what += f" / {local} ranks on this machine"
    later = 3 * 4 * trainable  # gradients and Adam's two moments (float32), if not yet allocated (PPO: critic too)
    budget = max(0.0, HEADROOM * (avail - later))
    gs = group_share(cfg)
    rows = gs if gs > 1 else 1
    config = models.policy.module.config
    ckpt_on = bool(cfg.model.gradient_checkpointing)
    sizes = dict(group_size=rows, prompt_len=prompt_len, response_len=r.max_tokens, checkpointing=ckpt_on,
                 bytes_per_number=elem)
    fit = tokens_that_fit(config, budget, **sizes)
    fit = int(global_min(torch.tensor(float(fit))).item())
    one = prompt_len + rows * r.max_tokens  # the smallest micro-batch: one group (or one row)
    gb = 2 ** 30
    need_one = one * per_token_bytes(config, **sizes)
    if fit < one:
        raise TrainingError(
            f"memory: one micro-batch of {rows} response(s) of rollout.max_tokens={r.max_tokens} tokens after a "
            f"{prompt_len}-token prompt needs about {need_one / gb:.1f} GiB of activations, but only "
            f"{budget / gb:.1f} GiB are free for them ({what}: {avail / gb:.1f} GiB, less {later / gb:.1f} GiB "
            "for gradients and optimizer state, times the headroom); lower rollout.max_tokens or rollout.n, set "
            "model.gradient_checkpointing=true, or free memory")
    # the largest micro-batch this run can form: the budget, or a whole mini-batch of this rank when smaller
    prompts = max(1, (t.mini_batch_size or t.batch_size) // dist.world_size)
    whole = prompts * (prompt_len + r.n * r.max_tokens) if rows > 1 else prompts * r.n * (prompt_len + r.max_tokens)
    configured = t.micro_batch_tokens
    largest = min(configured, whole)
    if resumed is not None and resumed <= min(fit, configured):
        t.micro_batch_tokens = resumed
        if min(resumed, whole) < largest and dist.is_main:
            print(f"mathrl: note: resume: keeping the checkpoint's train.micro_batch_tokens={resumed} instead of the "
                  f"configured {configured} (the same micro-batches, so the resumed run continues the same run)",
                  file=sys.stderr, flush=True)
    elif fit < largest:
        if dist.is_main:
            per = per_token_bytes(config, **sizes)
            print(f"mathrl: warning: memory: micro-batches of up to {largest} tokens (train.micro_batch_tokens="
                  f"{t.micro_batch_tokens}) would need about {largest * per / gb:.1f} GiB of activations but "
                  f"{budget / gb:.1f} GiB are free for them ({what}); using train.micro_batch_tokens={fit} (same loss "
                  "and gradients, more micro-batches; set train.micro_batch_tokens to at most this to silence the "
                  "warning and keep the split fixed between runs, e.g. for an A/B pair: the free memory at start "
                  "varies)", file=sys.stderr, flush=True)
        t.micro_batch_tokens = fit
    # a budget at or above a whole mini-batch gives the same split as any other such budget
    if resumed is not None and min(resumed, whole) != min(t.micro_batch_tokens, whole) and dist.is_main:
        why = f"the free memory holds {fit}" if resumed > fit else f"the configured value is {configured}"
        print(f"mathrl: warning: resume: micro-batches of train.micro_batch_tokens={t.micro_batch_tokens}, but the "
              f"checkpoint's run used {resumed} ({why}): they split differently, so the resumed run's losses and "
              "gradients equal an uninterrupted run's only up to float rounding; to continue it bit for bit, resume "
              f"with train.micro_batch_tokens>={resumed} and that much memory free", file=sys.stderr, flush=True)
    return {"sys/memory_available_gb": avail / gb, "sys/micro_batch_tokens": float(t.micro_batch_tokens),
            "sys/activation_estimate_gb": t.micro_batch_tokens * per_token_bytes(config, **sizes) / gb}
