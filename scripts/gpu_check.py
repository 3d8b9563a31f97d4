#!/usr/bin/env python
"""GPU check: what a lent GPU should confirm, in one run of at most 7 minutes (one H200).

Run it through ``bash scripts/gpu_check.sh`` (it installs the wheelhouse ``scripts/gpu_wheelhouse.sh``
built, then calls this script). Every step runs in its own subprocess under its own wall-clock limit and
appends one JSON line (``name, title, ok, seconds, budget_s, details``) to ``<out>/gpu_check.jsonl`` as it
finishes, so a run cut off still reports; ``<out>/gpu_check.md`` is rebuilt from the JSONL at the end
(and by ``--report-only``). Before each step the script prints its estimate, limit and the time left of
``--budget-s``; a step whose estimate does not fit is recorded as ``skipped: budget`` instead of run.

Steps (model: random weights, Qwen2.5-0.5B depth and width with an 8192-token vocabulary and a word-level
tokenizer that fits it, bf16; ``--device cpu``: 2 layers of width 64, vocabulary 512, float32):

* ``env``: the packages, versions, the device;
* ``algo``: every estimator, KL estimator and loss of ``mathrl.algo`` on the device vs CPU (float64);
* ``model``: the random model, the training and held-out problem files;
* ``memory``: the memory guard's activation estimate (mathrl/train/memory.py) against the measured peak
  (``torch.cuda.max_memory_allocated``) of one micro-batch's forward and backward (the trainer's own
  ``policy_forward``) at three shapes;
* ``grad_accum``: 16 micro-batch gradients of the bf16 model accumulated in bf16 and in fp32 (the two
  settings of DeepSpeed's ``data_types.grad_accum_dtype``, done here with torch), each against the
  float64 model's accumulated gradient;
* ``eval``: ``mathrl eval`` with the hf backend; on CUDA it fails when the engine did not run on the GPU;
* ``zero3_deepspeed``: ``deepspeed --num_gpus 1 --module mathrl.cli train`` (scripts/launch_1gpu.sh's
  launch), GRPO under ZeRO-3 with gradient checkpointing, 3 steps, checkpoints at steps 2 and 3, and a NaN
  injected into step 2's loss (``MATHRL_FAULT=nan@loss@2``, installed by the launched module ``mathrl.testing.faults``): step 2 must be
  skipped and step 3 must train;
* ``kill_resume``: the same run under ``torchrun --nproc_per_node 1 -m mathrl.cli train``, its launcher's
  process group (and every descendant) SIGKILLed once step 2's checkpoint is complete, then ``--resume
  auto``: step 3's weights and the logged metrics (less ``time/``, ``throughput/``, ``sys/``) must equal
  the uninterrupted run's bit for bit;
* ``lora_zero3``: LoRA adapters (``model.lora``) under ZeRO-3 (torchrun, as the runs below);
* ``ballast``: a tensor standing for vLLM's share of the GPU allocated before a run: the run's fitted
  ``train.micro_batch_tokens: auto`` (``sys/`` metrics) must drop below the whole mini-batch (and below the
  8192 that auto starts from), without OOM;
* ``bench``: ``scripts/bench_gpu.py`` (update tokens/s and MFU, generation tokens/s of mathrl's hf
  engine vs plain ``model.generate``);
* ``offload``: ZeRO-2 with the optimizer offloaded to the CPU, last, only when the budget has room.

The cheap in-process measurements come first, so a slow training run cannot crowd them out. Training
runs read the problem files through ``data.source=jsonl``; random weights rarely answer right, so the
rollouts stop at a filler word at random lengths and DAPO's length term gives the groups reward variance.

``--device cpu`` runs every step's code path with tiny shapes, float32 and gloo, through the same
launchers (both work on CPU); the CI test tests/bench/test_gpu_check.py runs it. ``--preflight`` only
checks the imports (exit 3 and the fix when one is missing).

    bash scripts/gpu_check.sh                                    # on the GPU machine
    python scripts/gpu_check.py --device cpu --out-dir /tmp/gc   # CPU, a few minutes
    python scripts/gpu_check.py --report-only --out-dir /tmp/gc  # the table again, from the JSONL
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # mathrl from this working tree (not installed on the GPU machine)
    sys.path.insert(0, str(REPO))
from mathrl.procs import DIST_ENV_VARS, child_pids, without_dist_env  # noqa: E402  (stdlib only)

#: this interpreter, named through the real path of its environment (with a symlinked virtualenv the
#: launchers' workers, started from the console scripts' shebangs, would otherwise see other paths, and
#: DeepSpeed's JIT-built ops, e.g. gloo's shared-memory collectives, other include paths: each would rebuild)
_PY = Path(os.path.realpath(sys.prefix)) / "bin" / Path(sys.executable).name
PYTHON = str(_PY) if _PY.is_file() else sys.executable

#: import name -> pip distribution (what the wheelhouse carries when the image lacks it)
NEEDED = {
    "torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers", "safetensors": "safetensors",
    "yaml": "pyyaml", "sympy": "sympy", "numpy": "numpy",
    "deepspeed": "deepspeed", "hjson": "hjson", "cpuinfo": "py-cpuinfo", "msgpack": "msgpack",
    "pydantic": "pydantic", "einops": "einops", "psutil": "psutil", "packaging": "packaging",
    "math_verify": "math-verify", "latex2sympy2_extended": "latex2sympy2_extended",
    "antlr4": "antlr4-python3-runtime",
}


sys.path.insert(0, str(REPO / "scripts"))
from bench_gpu import Shape as _Dims  # noqa: E402  (the decoder dimensions; bench_gpu's FLOPs use them too)


@dataclass(frozen=True)
class Shape(_Dims):
    """bench_gpu's decoder dimensions plus a name for the report."""

    name: str = ""


SHAPES = {
    # Qwen2.5-0.5B's depth and width with a small vocabulary: checkpoints stay small (0.7 GB of weights)
    "0.5b": Shape(name="Qwen2.5-0.5B shape, vocab 8192", layers=24, hidden=896, heads=14, kv_heads=2,
                  intermediate=4864, vocab=8192),
    "tiny": Shape(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512),
}


# --------------------------------------------------------------------------- imports


def check_imports() -> tuple[dict[str, str], dict[str, str]]:
    """(found: import name -> version, missing: import name -> 'ExcType: message')."""
    import importlib
    from importlib import metadata

    found, missing = {}, {}
    for mod, dist in NEEDED.items():
        try:
            importlib.import_module(mod)
        except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install
            missing[mod] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            continue
        try:
            found[mod] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[mod] = "?"
    return found, missing


#: what the GPU image provides itself (the wheelhouse does not carry these)
IMAGE = {"torch", "transformers", "tokenizers", "safetensors", "yaml", "sympy", "numpy", "psutil", "packaging"}


def missing_message(missing: dict[str, str]) -> str:
    lines = ["gpu_check: packages the check needs are missing:"]
    lines += [f"  {m} (pip: {NEEDED[m]}): {why}" for m, why in missing.items()]
    if set(missing) - IMAGE:
        lines.append("fix: build the wheelhouse where PyPI is reachable (bash scripts/gpu_wheelhouse.sh), carry "
                     "gpu_wheels/ to this machine, and run bash scripts/gpu_check.sh (it installs it first)")
    if set(missing) & IMAGE:
        lines.append(f"fix: {', '.join(sorted(set(missing) & IMAGE))} come with the GPU image, not the wheelhouse: "
                     "run the check with the image's Python (PYTHON=/path/to/python bash scripts/gpu_check.sh)")
    return "\n".join(lines)


def imported_distributions() -> dict[str, str]:
    """pip distribution -> version of every package this process imported (what the wheelhouse must cover)."""
    from importlib import metadata

    owners = metadata.packages_distributions()
    out = {}
    for top in {m.split(".")[0] for m in list(sys.modules)}:
        for dist in owners.get(top, []):
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


# --------------------------------------------------------------------------- model


def build_tokenizer(vocab: int):
    """A word-level tokenizer of exactly ``vocab`` ids: specials, digits, a few words, fillers ``t<i>``,
    with a chat template that keeps the question's first line (so prompts are real tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", *map(str, range(10)), "what", "is", "+", "-", "?", "=", ":", "show"]
    words += [f"t{i}" for i in range(vocab - len(words))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{{ messages[-1]['content'].split('\\n')[0] }}"
    return tok


def save_random_model(shape: Shape, folder: Path, device: str) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(shape.vocab)
    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=4096,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


# --------------------------------------------------------------------------- algo on the device


def algo_check(device: str) -> dict:
    """Each mathrl.algo function on ``device`` vs on CPU (float64)."""
    import torch

    from mathrl.algo import advantages as A
    from mathrl.algo import kl as K
    from mathrl.algo import losses as L

    g = torch.Generator().manual_seed(0)
    n, T, G = 12, 9, 4
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (n,), generator=g)[:, None]
    scores = (torch.rand(n, generator=g) < 0.5).double()
    group = torch.arange(n // G).repeat_interleave(G)
    logp = -torch.rand(n, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.1 * torch.randn(n, T, generator=g, dtype=torch.float64)
    ref = logp + 0.2 * torch.randn(n, T, generator=g, dtype=torch.float64)
    values = torch.randn(n, T, generator=g, dtype=torch.float64)
    old_v = values + 0.1 * torch.randn(n, T, generator=g, dtype=torch.float64)

    def cases(dev):
        mv = lambda x: x.to(dev)  # noqa: E731
        m, sc, gi, lp, ol, rf, va, ov = map(mv, (mask, scores, group, logp, old, ref, values, old_v))
        out = {}
        for name in ("grpo", "dr_grpo", "rloo"):
            out[f"adv/{name}"] = A.get_advantage_estimator(name)(sc, gi)
        kl = K.estimate(lp, rf, "k1")
        tr = A.token_level_rewards(sc, m, kl, 0.05)
        out["adv/reinforce_pp"] = A.reinforce_pp(tr, m)
        adv, ret = A.gae(tr, va, m, gamma=1.0, lam=0.95)
        out["adv/gae"], out["adv/gae_returns"] = adv, ret
        for k in ("k1", "k2", "k3"):
            out[f"kl/{k}"] = K.estimate(lp, rf, k)
        tok_adv = A.broadcast_to_tokens(out["adv/grpo"], m)
        norms = L.global_normalizers(m, reduce=None)
        for agg in L.LOSS_AGG_MODES:
            kw = {"norm_const": float(T)} if "norm" in agg and "token-sum" in agg else {}
            loss, _st = L.policy_loss(lp, ol, tok_adv, m, clip_high=0.28, dual_clip=3.0, agg=agg,
                                      norm_tokens=norms.tokens, norm_seqs=norms.seqs, **kw)
            out[f"loss/policy/{agg}"] = loss
        vl, _ = L.value_loss(va, ov, ret, m, clip=0.2, norm_tokens=norms.tokens)
        out["loss/value"] = vl
        return {k: v.detach().cpu() for k, v in out.items()}

    cpu, dev = cases("cpu"), cases(device)
    diffs = {k: float((cpu[k] - dev[k]).abs().max()) if cpu[k].numel() else 0.0 for k in cpu}
    worst = max(diffs.values())
    return {"device": device, "functions": len(diffs), "max_abs_diff": worst, "diffs": diffs, "ok": worst < 1e-10}


# --------------------------------------------------------------------------- run context and launchers


@dataclass
class Ctx:
    """What a step gets: the device, the output folder, the shape."""

    device: str
    out: Path
    budget_s: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def work(self) -> Path:
        return self.out / "work"

    @property
    def model(self) -> Path:
        return self.work / "model"

    @property
    def shape(self) -> Shape:
        return SHAPES["0.5b" if self.cuda else "tiny"]


def step_env(ctx: Ctx, **extra) -> dict:
    """The environment of a launched process: no inherited rendezvous, this tree's mathrl, offline."""
    env = without_dist_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "8" if ctx.cuda else "1")
    if not ctx.cuda:
        env["DS_ACCELERATOR"] = "cpu"
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _console_script(name: str, module: str) -> list[str]:
    """``name`` beside this Python (where pip put it), else on PATH, else ``python -m module``."""
    here = Path(PYTHON).parent / name
    if here.is_file():
        return [str(here)]
    found = shutil.which(name)
    return [found] if found else [PYTHON, "-m", module]


def launcher_cmd(kind: str, argv: list[str], module: str = "mathrl.cli") -> list[str]:
    """``mathrl <argv>`` at world size 1 through the real launcher: ``deepspeed --num_gpus 1 --module
    mathrl.cli`` (scripts/launch_1gpu.sh) or ``torchrun --nproc_per_node 1 -m mathrl.cli``. ``module``
    ``mathrl.testing.faults``: the same CLI with ``MATHRL_FAULT``'s faults installed."""
    port = str(_free_port())
    if kind == "deepspeed":
        return [*_console_script("deepspeed", "deepspeed.launcher.runner"), "--num_gpus", "1", "--master_port", port,
                "--module", module, *argv]
    return [*_console_script("torchrun", "torch.distributed.run"), "--nproc_per_node", "1", "--master_port", port,
            "-m", module, *argv]


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and every descendant (a launcher's workers may sit in another
    session)."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        try:
            todo += child_pids(p)
        except OSError:
            pass
    for p in [pid] + seen:
        for kill in (lambda q: os.killpg(q, signal.SIGKILL), lambda q: os.kill(q, signal.SIGKILL)):
            try:
                kill(p)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def launch(ctx: Ctx, cmd: list[str], log: Path, timeout: float, env_extra: dict | None = None,
           until=None) -> tuple[int, float]:
    """Run ``cmd`` (its own session) with output to ``log``; kill it when ``timeout`` passes or when
    ``until()`` turns true. Returns (exit status, seconds); 124 on timeout, -9 when ``until`` killed it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=step_env(ctx, **(env_extra or {})), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None:
            if time.perf_counter() - t0 > timeout:
                kill_tree(proc.pid)
                proc.wait()
                return 124, time.perf_counter() - t0
            if until is not None and until():
                kill_tree(proc.pid)
                proc.wait()
                return -9, time.perf_counter() - t0
            time.sleep(0.05)
    return proc.returncode, time.perf_counter() - t0


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# --------------------------------------------------------------------------- training through the launchers


def train_overrides(ctx: Ctx, out: Path, steps: int, stage: int, *extra: str) -> list[str]:
    """A GRPO run on the check's model and problem files. Random weights rarely say anything right, so
    the rollouts stop at a filler word (``rollout.stop``) at random lengths and DAPO's length term
    (reward.terms) gives the groups reward variance besides the real verifier's ``correctness``."""
    T = 48 if ctx.cuda else 6
    data = ctx.work / "data"
    return [f"model.name={ctx.model}", f"model.dtype={'bfloat16' if ctx.cuda else 'float32'}",
            "rollout.backend=hf", f"rollout.max_tokens={T}", f"rollout.n={8 if ctx.cuda else 4}",
            f"rollout.stop=[{'t12' if ctx.cuda else 't1'}]", f"train.batch_size={8 if ctx.cuda else 2}",
            "train.lr=1e-5", f"train.steps={steps}", f"deepspeed.zero_stage={stage}", "data.source=jsonl",
            f"data.path={data / 'train.jsonl'}", f"data.eval_path={data / 'test.jsonl'}", "data.eval_limit=4",
            "data.template=chat_boxed", "eval.n=1", "eval.k=[1]", "eval.max_tokens=8", "eval.greedy=false",
            "logging.tensorboard=false", "logging.console=plain", f"train.output_dir={out}", "algo.name=grpo",
            "algo.kl_coef=0.04", "reward.workers=2", f"reward.terms={{correctness: {{}}, length: {{coef: 0.5, "
            f"buffer: {T}}}}}", *extra]


def read_steps(out: Path) -> list[dict]:
    from mathrl.train.metrics import read_metrics

    p = out / "metrics.jsonl"
    return [m for m in read_metrics(p) if "event" not in m] if p.is_file() else []


def checkpoints(out: Path) -> dict[int, Path]:
    from mathrl.train import checkpoint as ckpt

    return dict(ckpt.list_checkpoints(out)) if (out / "checkpoints").is_dir() else {}


def policy_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "policy" / "model.safetensors"))


def _finite(row: dict) -> bool:
    return all(v == v and abs(v) != float("inf") for v in row.values() if isinstance(v, float))


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "sys/"))} for r in rows]


def train_result(out: Path, rc: int, seconds: float, steps: int, log: Path) -> dict:
    rows = read_steps(out)
    res = {"rc": rc, "seconds": round(seconds, 1), "steps_logged": len(rows), "checkpoints": sorted(checkpoints(out))}
    keys = ("reward/mean", "reward/std", "loss/policy", "kl/mean", "policy/grad_norm", "bad_step",
            "sys/memory_available_gb", "sys/micro_batch_tokens", "sys/activation_estimate_gb")
    res["metrics"] = [{k: r[k] for k in keys if k in r} for r in rows]
    if rc != 0 or len(rows) != steps:
        res["log_tail"] = tail(log)
    return res


NAN_STEP = 2  # the step whose loss the NaN fault poisons (zero3_deepspeed and kill_resume)


def step_zero3_deepspeed(ctx: Ctx) -> dict:
    out = ctx.work / "zero3-full"
    shutil.rmtree(out, ignore_errors=True)
    steps = 3
    cmd = launcher_cmd("deepspeed", ["train", *train_overrides(ctx, out, steps, 3, "model.gradient_checkpointing=true",
                                                               "train.save_every=2", "train.keep_last=2")],
                       module="mathrl.testing.faults")
    rc, s = launch(ctx, cmd, ctx.work / "logs" / "zero3-full.log", 600, {"MATHRL_FAULT": f"nan@loss@{NAN_STEP}"})
    res = train_result(out, rc, s, steps, ctx.work / "logs" / "zero3-full.log")
    m = res["metrics"]
    res["nan_step_skipped"] = len(m) >= NAN_STEP and m[NAN_STEP - 1].get("bad_step") == 1.0
    res["later_steps_trained"] = len(m) == steps and all(r.get("bad_step") == 0.0 and _finite(r)
                                                         for i, r in enumerate(m) if i != NAN_STEP - 1)
    cfg = (out / "config.yaml").read_text() if (out / "config.yaml").is_file() else ""
    res["gradient_checkpointing"] = "gradient_checkpointing: true" in cfg
    ck = checkpoints(out)
    if steps in ck and rc == 0:
        w3 = policy_weights(ck[steps])
        init = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(ctx.model / "model.safetensors"))
        res["weights_changed"] = any(not w3[k].equal(init[k]) for k in w3 if k in init)
    res["ok"] = bool(rc == 0 and res["nan_step_skipped"] and res["later_steps_trained"] and
                     res["gradient_checkpointing"] and res.get("weights_changed") and steps in ck)
    res["summary"] = (f"{s:.0f} s; step {NAN_STEP} skipped (NaN): {res['nan_step_skipped']}, steps after it trained: "
                      f"{res['later_steps_trained']}, weights moved: {res.get('weights_changed')}, gradient "
                      f"checkpointing: {res['gradient_checkpointing']}, checkpoints {res['checkpoints']}")
    return res


def step_kill_resume(ctx: Ctx) -> dict:
    full = ctx.work / "zero3-full"
    if 3 not in checkpoints(full):
        return {"ok": False, "summary": "needs zero3_deepspeed's run (its step-3 checkpoint is missing)"}
    out = ctx.work / "zero3-killed"
    shutil.rmtree(out, ignore_errors=True)
    over = train_overrides(ctx, out, 3, 3, "model.gradient_checkpointing=true", "train.save_every=2",
                           "train.keep_last=2")
    fault = {"MATHRL_FAULT": f"nan@loss@{NAN_STEP}"}
    faulty = "mathrl.testing.faults"  # mathrl's CLI with MATHRL_FAULT's faults installed
    rc1, s1 = launch(ctx, launcher_cmd("torchrun", ["train", *over], module=faulty),
                     ctx.work / "logs" / "zero3-killed.log", 600, fault, until=lambda: 2 in checkpoints(out))
    at_kill = sorted(checkpoints(out))
    res = {"kill_rc": rc1, "killed_after_s": round(s1, 1), "checkpoints_at_kill": at_kill}
    if rc1 != -9 or max(at_kill, default=0) != 2:
        res.update(ok=False, summary=f"the kill did not land between checkpoints 2 and 3 (exit {rc1}, checkpoints "
                                     f"{at_kill})", log_tail=tail(ctx.work / "logs" / "zero3-killed.log"))
        return res
    rc2, s2 = launch(ctx, launcher_cmd("torchrun", ["train", *over, "--resume", "auto"], module=faulty),
                     ctx.work / "logs" / "zero3-resumed.log", 600, fault)
    res.update(resume_rc=rc2, resume_s=round(s2, 1))
    if rc2 != 0 or 3 not in checkpoints(out):
        res.update(ok=False, summary=f"resume failed (exit {rc2})",
                   log_tail=tail(ctx.work / "logs" / "zero3-resumed.log"))
        return res
    wa, wb = policy_weights(checkpoints(full)[3]), policy_weights(checkpoints(out)[3])
    res["weights_equal"] = set(wa) == set(wb) and all(wa[k].equal(wb[k]) for k in wa)
    res["weights_max_abs_diff"] = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa if k in wb)
    ma, mb = _strip(read_steps(full)), _strip(read_steps(out))
    res["metrics_equal"] = ma == mb
    if not res["metrics_equal"]:
        res["metrics_differing"] = [{k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
                                    for a, b in zip(ma, mb)][:3]
        res["steps"] = (len(ma), len(mb))
    res["ok"] = res["weights_equal"] and res["metrics_equal"]
    res["summary"] = (f"killed after {s1:.0f} s at checkpoint 2, resumed in {s2:.0f} s; step 3 weights equal: "
                      f"{res['weights_equal']} (max abs diff {res['weights_max_abs_diff']:.3g}), metrics equal: "
                      f"{res['metrics_equal']}")
    for d in (out, full):
        shutil.rmtree(d / "checkpoints", ignore_errors=True)  # gigabytes each on the GPU
    return res


def step_lora_zero3(ctx: Ctx) -> dict:
    out = ctx.work / "lora-zero3"
    shutil.rmtree(out, ignore_errors=True)
    steps = 2
    cmd = launcher_cmd("torchrun", ["train", *train_overrides(ctx, out, steps, 3, "model.lora={r: 8, alpha: 16}",
                                                               "train.lr=1e-3")])
    log = ctx.work / "logs" / "lora-zero3.log"
    rc, s = launch(ctx, cmd, log, 600)
    res = train_result(out, rc, s, steps, log)
    ck = checkpoints(out)
    adapter = ck[steps] / "adapter" if steps in ck else None
    res["adapter_saved"] = bool(adapter and any(adapter.glob("adapter_model.*")))
    if res["adapter_saved"]:
        from safetensors.torch import load_file

        files = list(adapter.glob("adapter_model.safetensors"))
        if files:
            sd = load_file(str(files[0]))
            res["adapter_tensors"] = len(sd)
            res["lora_B_trained"] = any(float(v.abs().max()) > 0 for k, v in sd.items() if "lora_B" in k)
    res["ok"] = bool(rc == 0 and res["steps_logged"] == steps and all(_finite(r) for r in res["metrics"])
                     and res["adapter_saved"] and res.get("lora_B_trained", False))
    res["summary"] = (f"{s:.0f} s; {res['steps_logged']} steps, adapter saved: {res['adapter_saved']} "
                      f"({res.get('adapter_tensors')} tensors), lora_B moved from 0: {res.get('lora_B_trained')}")
    shutil.rmtree(out, ignore_errors=True)
    return res


def step_ballast(ctx: Ctx) -> dict:
    """A tensor standing for vLLM's share of the GPU, then a run whose micro-batch budget must shrink."""
    import torch

    from mathrl.train.memory import AUTO_TOKENS, HEADROOM, per_token_bytes

    out = ctx.work / "ballast"
    shutil.rmtree(out, ignore_errors=True)
    B, G, T, P = (32, 8, 48, 8) if ctx.cuda else (2, 4, 6, 8)
    gib = 2 ** 30
    res: dict = {}
    if ctx.cuda:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(ctx.model))
        n = sum(p for p in _param_counts(ctx.shape))
        per_tok = per_token_bytes(config, group_size=G, prompt_len=P, response_len=T, bytes_per_number=2)
        whole = B * (P + G * T)
        # leave the trainer about half a mini-batch of activations (by the guard's own estimate), on top of
        # what it holds when it measures (policy + reference bf16, ZeRO-2's fp32 master copy, CUDA context) and
        # the gradients and Adam moments it reserves for
        want_avail = 0.5 * whole * per_tok / HEADROOM + 12 * n
        resident = 8 * n + 1.5 * gib
        free, total = torch.cuda.mem_get_info()
        ballast_bytes = int(free - resident - want_avail)
        res.update(free_before_gib=free / gib, per_token_mib=per_tok / 2 ** 20, whole_minibatch_tokens=whole)
        ballast = torch.empty(max(ballast_bytes, 0), dtype=torch.uint8, device="cuda")
        ballast.fill_(1)
        torch.cuda.synchronize()
    else:  # CPU: the machine's memory is shared with everything else; the path runs, the drop is not asserted
        ballast_bytes = 256 * 2 ** 20
        ballast = torch.ones(ballast_bytes, dtype=torch.uint8)
        whole = B * (P + G * T)
    res["ballast_gib"] = ballast_bytes / gib
    cmd = launcher_cmd("torchrun", ["train", *train_overrides(ctx, out, 1, 2, f"train.batch_size={B}",
                                                               f"rollout.n={G}", "train.micro_batch_tokens=auto")])
    log = ctx.work / "logs" / "ballast.log"
    rc, s = launch(ctx, cmd, log, 600)
    del ballast
    r = train_result(out, rc, s, 1, log)
    res.update(r)
    m = (r["metrics"] or [{}])[0]
    fitted, avail = m.get("sys/micro_batch_tokens"), m.get("sys/memory_available_gb")
    res.update(fitted_micro_batch_tokens=fitted, trainer_saw_free_gib=avail)
    res["oom"] = "out of memory" in tail(log, 20000).lower()
    if ctx.cuda:
        res["budget_dropped"] = fitted is not None and fitted < min(AUTO_TOKENS, whole)
        res["free_memory_dropped"] = avail is not None and avail < res["free_before_gib"] - 0.9 * res["ballast_gib"]
        res["ok"] = bool(rc == 0 and r["steps_logged"] == 1 and res["budget_dropped"] and res["free_memory_dropped"]
                         and not res["oom"])
    else:
        res["ok"] = bool(rc == 0 and r["steps_logged"] == 1 and fitted is not None and avail is not None)
    res["summary"] = (f"{s:.0f} s; ballast {res['ballast_gib']:.1f} GiB; trainer saw {_f(avail, '.1f')} GiB free, "
                      f"fitted train.micro_batch_tokens {_f(fitted)} (auto: at most {AUTO_TOKENS}; mini-batch {whole} tokens)"
                      + ("" if ctx.cuda else "; cpu: memory shared with the machine, drop not asserted")
                      + ("; OOM" if res["oom"] else ""))
    shutil.rmtree(out, ignore_errors=True)
    return res


def _param_counts(s: Shape) -> list[int]:
    """Parameter count of a Qwen2 decoder of shape ``s`` (tied embeddings), as [embeddings, layers]."""
    kv = s.kv_heads * s.head_dim
    layer = s.hidden * s.hidden * 2 + s.hidden * kv * 2 + s.hidden + 2 * kv + 3 * s.hidden * s.intermediate \
        + 2 * s.hidden
    return [s.vocab * s.hidden, s.layers * layer + s.hidden]


def step_offload(ctx: Ctx) -> dict:
    out = ctx.work / "offload"
    shutil.rmtree(out, ignore_errors=True)
    steps = 2
    cmd = launcher_cmd("torchrun", ["train", *train_overrides(ctx, out, steps, 2, "deepspeed.offload=optimizer")])
    log = ctx.work / "logs" / "offload.log"
    rc, s = launch(ctx, cmd, log, 600)
    res = train_result(out, rc, s, steps, log)
    res["ok"] = bool(rc == 0 and res["steps_logged"] == steps and all(_finite(r) for r in res["metrics"]))
    res["summary"] = f"{s:.0f} s; ZeRO-2, optimizer on the CPU: {res['steps_logged']} steps" + (
        "" if res["ok"] else f", exit {rc}")
    shutil.rmtree(out, ignore_errors=True)
    return res


# --------------------------------------------------------------------------- in-process measurements


def step_env_info(ctx: Ctx) -> dict:
    found, missing = check_imports()
    import torch

    res = {"versions": found, "missing": missing, "python": sys.version.split()[0],
           "device_name": torch.cuda.get_device_name(0) if ctx.cuda and torch.cuda.is_available() else "cpu",
           "dtype": "bfloat16" if ctx.cuda else "float32", "cuda_available": torch.cuda.is_available(),
           "launchers": {k: launcher_cmd(k, [])[0] for k in ("deepspeed", "torchrun")},
           "imported_distributions": imported_distributions()}
    res["ok"] = not missing and (torch.cuda.is_available() or not ctx.cuda)
    res["summary"] = (f"{res['device_name']}; python {res['python']}, torch {found.get('torch')}, transformers "
                      f"{found.get('transformers')}, deepspeed {found.get('deepspeed')}")
    return res


def step_algo(ctx: Ctx) -> dict:
    r = algo_check(ctx.device)
    r["summary"] = f"{r['functions']} functions on {r['device']} vs CPU (float64): max abs diff {r['max_abs_diff']:.2g}"
    return r


def write_problems(folder: Path) -> None:
    """Training problems ``what is a + b ?`` (words the check's tokenizer knows) and gsm8k-style held-out ones."""
    folder.mkdir(parents=True, exist_ok=True)
    train, test = [], []
    for i in range(64):
        a, b = i % 10, (3 * i + 1) % 10
        if a + b < 10:
            train.append({"question": f"what is {a} + {b} ?", "answer": str(a + b)})
            test.append({"question": f"what is {b} + {a} ?", "answer": f"{b} + {a} = {a + b}\n#### {a + b}"})
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))


def step_model(ctx: Ctx) -> dict:
    shutil.rmtree(ctx.model, ignore_errors=True)
    save_random_model(ctx.shape, ctx.model, ctx.device)
    write_problems(ctx.work / "data")
    size = sum(f.stat().st_size for f in ctx.model.iterdir()) / 2 ** 30
    n = sum(_param_counts(ctx.shape))
    return {"ok": True, "shape": ctx.shape.name, "params": n, "folder_gib": size,
            "summary": f"{ctx.shape.name}: {n / 1e6:.0f}M parameters, {size:.2f} GiB on disk"}


def step_memory(ctx: Ctx) -> dict:
    """The guard's activation estimate vs the measured peak of one micro-batch (trainer's own forward)."""
    import torch

    from mathrl.models import load_causal_lm
    from mathrl.train.rows import ForwardBatch
    from mathrl.train.layouts import Padded
    from mathrl.train.memory import micro_batch_bytes

    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    lm = load_causal_lm(str(ctx.model), dtype=dtype).to(ctx.device)
    lm.train()
    V = lm.config.vocab_size
    shapes = [(1, 8, 128, 128), (2, 8, 256, 256), (4, 8, 256, 512)] if ctx.cuda else \
        [(1, 4, 16, 8), (2, 4, 16, 16), (2, 4, 32, 16)]
    g = torch.Generator().manual_seed(0)

    def one(groups, G, P, T) -> int:
        n = groups * G
        prompt = torch.randint(20, V - 1, (groups, P), generator=g).repeat_interleave(G, 0)
        resp = torch.randint(20, V - 1, (n, T), generator=g)
        layout = Padded(G)  # the trainer's shared-prompt layout
        mb = layout.micro_batch(ForwardBatch(prompt, torch.ones_like(prompt), resp, torch.ones_like(resp)),
                                torch.arange(n), ctx.device)
        for p in lm.parameters():
            if p.grad is not None:
                p.grad.zero_()
        if ctx.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            before = _clear_and_rss()
        logp, ent = layout.policy_forward(lm, mb, temperature=1.0, with_entropy=True)
        (-(logp.sum()) - 0.0 * ent.sum()).backward()
        if ctx.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - before
        return _kb("VmHWM") * 1024 - before

    one(*shapes[0])  # the gradients' buffers and the kernels' workspaces, before measuring
    rows = []
    for groups, G, P, T in shapes:
        measured = one(groups, G, P, T)
        est = micro_batch_bytes(lm.config, groups=groups, rows=groups * G, prompt_len=P, response_len=T,
                                bytes_per_number=2 if ctx.cuda else 4)
        rows.append({"groups": groups, "G": G, "P": P, "T": T, "measured_mib": measured / 2 ** 20,
                     "estimate_mib": est / 2 ** 20, "ratio": est / measured if measured > 0 else None})
    res = {"shapes": rows, "how": "torch.cuda.max_memory_allocated" if ctx.cuda else "VmHWM (RSS)"}
    if ctx.cuda:  # the guard must not fall short: the estimate at least 0.9x the measured peak
        res["ok"] = all(r["ratio"] is not None and r["ratio"] >= 0.9 for r in rows)
    else:  # tiny shapes sit below the CPU allocator's granularity: the path runs, the ratio is not asserted
        res["ok"] = all(r["estimate_mib"] > 0 for r in rows)
    res["summary"] = "estimate / measured: " + ", ".join(
        f"{r['groups']}x{r['G']} P{r['P']} T{r['T']}: {r['estimate_mib']:.0f}/{r['measured_mib']:.0f} MiB"
        for r in rows) + ("" if ctx.cuda else " (cpu: not asserted)")
    return res


def _kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _clear_and_rss() -> int:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # peak RSS := current RSS
    except OSError:
        pass
    return _kb("VmRSS") * 1024


def step_grad_accum(ctx: Ctx) -> dict:
    """16 micro-batch gradients of the bf16 model accumulated in bf16 and in fp32 (DeepSpeed's
    ``data_types.grad_accum_dtype``), each against the float64 model's accumulated gradient."""
    import torch
    import torch.nn.functional as F

    from mathrl.models import load_causal_lm

    dev = ctx.device
    low = load_causal_lm(str(ctx.model), dtype=torch.bfloat16).to(dev)
    ref = load_causal_lm(str(ctx.model), dtype=torch.float32).to(dev)
    ref.load_state_dict({k: v.double() for k, v in low.state_dict().items()}, strict=False)
    ref = ref.double()
    for m in (low, ref):
        m.train()
        m.config.use_cache = False
    k, rows, L = 16, (4 if ctx.cuda else 2), (256 if ctx.cuda else 16)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(20, low.config.vocab_size, (rows, L), generator=g).to(dev) for _ in range(k)]

    def micro_loss(model, ids):
        logits = model(input_ids=ids).logits[:, :-1].float() if model is low else model(input_ids=ids).logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)) / k

    names = [n for n, p in low.named_parameters() if p.requires_grad]
    acc16 = {n: torch.zeros_like(p) for n, p in low.named_parameters() if p.requires_grad}
    acc32 = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in low.named_parameters() if p.requires_grad}
    for ids in batches:
        low.zero_grad(set_to_none=True)
        micro_loss(low, ids).backward()
        for n, p in low.named_parameters():
            if n in acc16:
                acc16[n].add_(p.grad)  # rounds to bf16 after every addition
                acc32[n].add_(p.grad.float())
    ref.zero_grad(set_to_none=True)
    for ids in batches:
        micro_loss(ref, ids).backward()  # float64 .grad accumulates in float64
    refg = dict(ref.named_parameters())

    def rel(acc):
        worst, num, den = 0.0, 0.0, 0.0
        for n in names:
            r = refg[n].grad
            d = (acc[n].double() - r).abs()
            worst = max(worst, float(d.max() / r.abs().max().clamp(min=1e-30)))
            num += float((d ** 2).sum())
            den += float((r ** 2).sum())
        return worst, (num / den) ** 0.5 if den else float("nan")

    (m16, l16), (m32, l32) = rel(acc16), rel(acc32)
    res = {"micro_batches": k, "rows": rows, "tokens_per_row": L,
           "bf16": {"max_rel_diff": m16, "rel_l2": l16}, "fp32": {"max_rel_diff": m32, "rel_l2": l32},
           "note": "per tensor: max |acc - ref| / max |ref|, worst tensor; rel_l2 over all gradients; the "
                   "micro-batch gradients themselves are the bf16 model's in both"}
    res["ok"] = all(x == x for x in (m16, m32, l16, l32)) and l32 <= l16
    res["summary"] = (f"16 micro-batches vs float64: bf16 accumulation max rel diff {m16:.3g} (rel L2 {l16:.3g}), "
                      f"fp32 accumulation {m32:.3g} (rel L2 {l32:.3g})")
    return res


def step_eval(ctx: Ctx) -> dict:
    """``mathrl eval`` (the CLI's own main, in this step's process) with the hf backend; on CUDA the engine
    must have run on the GPU (this process's CUDA peak must hold the model)."""
    import torch

    from mathrl.cli import main as mathrl_main

    out = ctx.work / "eval"
    shutil.rmtree(out, ignore_errors=True)
    plots = "written"
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # a bare GPU image: mathrl eval's PNG plots would stop it after the numbers are in
        import mathrl.eval.report as eval_report

        eval_report.write_plots = lambda out_dir, summary: []
        plots = "skipped (matplotlib is not installed)"
    argv = ["eval", "--model", str(ctx.model), "--benchmarks", f"gsm8k={ctx.work / 'data' / 'test.jsonl'}",
            "--n", "4", "--k", "1,4", "--max-tokens", "32" if ctx.cuda else "6", "--limit", "16" if ctx.cuda else "4",
            "--backend", "hf", "--template", "chat_boxed", "--out", str(out),
            f"model.dtype={'bfloat16' if ctx.cuda else 'float32'}", "reward.workers=2"]
    t0 = time.perf_counter()
    rc = mathrl_main(argv)
    s = time.perf_counter() - t0
    summary = out / "summary.json"
    res = {"rc": rc, "seconds": round(s, 1), "summary_written": summary.is_file(), "plots": plots}
    res["devices_recorded"] = _device_values(json.loads(summary.read_text())) if summary.is_file() else []
    weights = sum(f.stat().st_size for f in ctx.model.glob("*.safetensors"))
    if ctx.cuda:
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0
        res["cuda_peak_gib"] = peak / 2 ** 30
        res["on_gpu"] = peak >= 0.9 * weights and all(d.startswith("cuda") for d in res["devices_recorded"])
        res["ok"] = bool(rc == 0 and res["summary_written"] and res["on_gpu"])
        where = f"CUDA peak of the eval process {peak / 2 ** 30:.2f} GiB (weights {weights / 2 ** 30:.2f} GiB)"
    else:
        res["ok"] = bool(rc == 0 and res["summary_written"])
        where = "cpu"
    res["summary"] = f"{s:.0f} s; exit {rc}, summary.json {res['summary_written']}; {where}"
    return res


def _device_values(obj) -> list[str]:
    """Every value recorded under a key naming a device (``device``, ``engine_device``, ...) in a JSON tree."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if "device" in str(k).lower() and isinstance(v, str):
                found.append(v)
            else:
                found += _device_values(v)
    elif isinstance(obj, list):
        for v in obj:
            found += _device_values(v)
    return found


def _run_bench(ctx: Ctx, name: str, out_name: str, args: list[str], gpu_args: list[str], read) -> dict:
    """Run ``scripts/bench_gpu.py`` with ``args`` (plus ``gpu_args`` on the GPU, ``--smoke`` on CPU) into
    ``<work>/<out_name>.json``, logging to ``logs/<name>.log``; ``read(full_json, res)`` fills the step's
    record from it."""
    out = ctx.work / f"{out_name}.json"
    cmd = [PYTHON, str(REPO / "scripts" / "bench_gpu.py"), "--out", str(out), *args]
    cmd += gpu_args if ctx.cuda else ["--smoke"]
    log = ctx.work / "logs" / f"{name}.log"
    rc, s = launch(ctx, cmd, log, 600)
    res = {"cmd": " ".join(cmd[1:]), "rc": rc, "seconds": round(s, 1), "ok": False}
    if rc == 0 and out.is_file():
        read(json.loads(out.read_text()), res)
    else:
        res["log_tail"] = tail(log)
        res["summary"] = f"exit {rc}"
    return res


def step_bench(ctx: Ctx) -> dict:
    def read(full: dict, res: dict) -> None:
        tr, ge = full.get("grpo_update", {}), full.get("generation", {})
        res.update(ok=bool(tr) and bool(ge) and "DeepSpeed ZeRO" in tr.get("optimizer", ""),
                   optimizer=tr.get("optimizer"), update_tok_s=tr.get("computed_tok_s"),
                   response_tok_s=tr.get("response_tok_s"), mfu=tr.get("mfu"),
                   achieved_tflops=tr.get("achieved_tflops"), gen_tok_s=ge.get("mathrl_hf", {}).get("tok_s"),
                   raw_gen_tok_s=ge.get("raw_hf_generate", {}).get("tok_s"), matmul_tflops=full.get("matmul_tflops"),
                   peak_mem_gib=tr.get("peak_mem_gib"))
        z3 = full.get("grpo_update_other_stages", {}).get("3", {})
        res.update(zero3_optimizer=z3.get("optimizer"), zero3_peak_mem_gib=z3.get("peak_mem_gib"),
                   zero3_vs_zero2_mem=z3.get("peak_mem_vs_headline"))
        res["ok"] = res["ok"] and "DeepSpeed ZeRO-3" in (z3.get("optimizer") or "")
        res["summary"] = (f"update {_f(res['update_tok_s'])} tokens/s ({(res['optimizer'] or '').split(' (')[0]}), "
                          f"MFU {_f(res['mfu'], '.1%')}; generation {_f(res['gen_tok_s'])} tokens/s mathrl hf vs "
                          f"{_f(res['raw_gen_tok_s'])} model.generate; ZeRO-3 peak memory "
                          f"{_f(res['zero3_vs_zero2_mem'], '.2f')}x ZeRO-2's (target <= 1.5)")

    return _run_bench(ctx, "bench", "bench_gpu", ["--zero-stages", "2,3"],
                      ["--warmup", "1", "--steps", "2", "--gen-tokens", "64"], read)


def step_varlen(ctx: Ctx) -> dict:
    """The update in the padding-free layout (mathrl/train/varlen.py) under flex_attention, which runs
    packed sequences without a dense mask on the GPU (flash-attn is not installed there); on CPU the
    smoke shape under sdpa (flex has no CPU backward)."""
    def read(full: dict, res: dict) -> None:
        tr = full.get("grpo_update", {})
        res.update(ok=tr.get("layout") == "varlen", layout=tr.get("layout"), attn=tr.get("attn"),
                   update_tok_s=tr.get("computed_tok_s"), response_tok_s=tr.get("response_tok_s"), mfu=tr.get("mfu"),
                   achieved_tflops=tr.get("achieved_tflops"), useful_tflops=tr.get("useful_tflops"),
                   peak_mem_gib=tr.get("peak_mem_gib"))
        res["summary"] = (f"{res['layout']} layout, {res['attn']}: update {_f(res['update_tok_s'])} tokens/s "
                          f"({_f(res['response_tok_s'])} response), MFU {_f(res['mfu'], '.1%')} of computed FLOPs, "
                          f"{_f(res['useful_tflops'], '.1f')} useful TFLOP/s")

    return _run_bench(ctx, "varlen", "bench_varlen", ["--skip-gen", "--layout", "varlen"],
                      ["--attn", "flex_attention", "--warmup", "1", "--steps", "2"], read)


# --------------------------------------------------------------------------- the steps, their budgets


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    fn: object
    est_s: float      # expected seconds on one H200 (what the budget check uses)
    est_cpu_s: float  # expected seconds on 2 CPU cores
    limit_s: float    # wall-clock limit of its subprocess on the GPU (CPU: 3x)


STEPS = [  # cheap in-process measurements first, so a slow training run cannot crowd them out; offload last
    Step("env", "packages and device", step_env_info, 8, 10, 60),
    Step("algo", "mathrl.algo on the device vs CPU (float64)", step_algo, 10, 8, 60),
    Step("model", "random model and problem files", step_model, 15, 6, 120),
    Step("memory", "memory guard estimate vs measured peak, 3 shapes", step_memory, 20, 10, 90),
    Step("grad_accum", "bf16 vs fp32 gradient accumulation, 16 micro-batches vs float64", step_grad_accum, 15, 8, 90),
    Step("eval", "mathrl eval, hf backend, on the device", step_eval, 25, 20, 120),
    Step("zero3_deepspeed", "deepspeed launcher: GRPO ZeRO-3, gradient checkpointing, NaN step skipped",
         step_zero3_deepspeed, 60, 35, 180),
    Step("kill_resume", "torchrun: SIGKILL at checkpoint 2 of ZeRO-3, --resume auto, bitwise vs uninterrupted",
         step_kill_resume, 90, 50, 240),
    Step("lora_zero3", "torchrun: LoRA under ZeRO-3", step_lora_zero3, 45, 30, 150),
    Step("ballast", "ballast on the device: fitted micro-batch budget drops, no OOM", step_ballast, 50, 30, 180),
    Step("bench", "scripts/bench_gpu.py: update tokens/s, MFU, generation tokens/s; ZeRO-3 vs ZeRO-2 peak memory",
         step_bench, 55, 35, 180),
    Step("varlen", "scripts/bench_gpu.py --layout varlen --attn flex_attention: the padding-free update",
         step_varlen, 40, 20, 150),
    Step("offload", "ZeRO-2 with the optimizer offloaded (last, if time is left)", step_offload, 60, 35, 180),
]
BY_NAME = {s.name: s for s in STEPS}


def run_step_here(name: str, ctx: Ctx) -> int:
    """The body of one step's subprocess: run it, write its result JSON."""
    dest = ctx.work / "results" / f"{name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        res = BY_NAME[name].fn(ctx)
    except Exception as exc:  # noqa: BLE001 - reported as the step's failure
        res = {"ok": False, "summary": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
               "traceback": traceback.format_exc()[-4000:]}
        print(res["traceback"], file=sys.stderr, flush=True)
    dest.write_text(json.dumps(res, indent=1, default=str))
    return 0 if res.get("ok") else 1


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def run_step(step: Step, ctx: Ctx, limit: float) -> dict:
    """One step in its own subprocess (own session) under ``limit`` seconds; its record."""
    log = ctx.work / "logs" / f"step-{step.name}.log"
    result = ctx.work / "results" / f"{step.name}.json"
    result.unlink(missing_ok=True)
    cmd = [PYTHON, str(Path(__file__).resolve()), "--step", step.name, "--device", ctx.device,
           "--out-dir", str(ctx.out)]
    rc, s = launch(ctx, cmd, log, limit)
    if result.is_file():
        details = json.loads(result.read_text())
    else:
        details = {"summary": f"exit {rc} without a result", "log_tail": tail(log)}
    ok = bool(details.pop("ok", False)) and rc == 0
    if rc == 124:
        ok, details["summary"] = False, f"timed out after {limit:.0f} s (its limit)"
    return {"name": step.name, "title": step.title, "ok": ok, "seconds": round(s, 1), "budget_s": step.est_s,
            "limit_s": limit, "details": details}


# --------------------------------------------------------------------------- report


def _f(x, fmt=".0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return out


def overall_ok(records: list[dict]) -> bool:
    return bool(records) and all(r["ok"] or r.get("skipped") for r in records)


def markdown(records: list[dict], planned: list[str] | None = None) -> str:
    env = next((r["details"] for r in records if r["name"] == "env"), {})
    v = env.get("versions", {})
    total = sum(r.get("seconds", 0) for r in records)
    md = [f"GPU check on {env.get('device_name', '?')} ({env.get('dtype', '?')}; torch {v.get('torch')}, transformers "
          f"{v.get('transformers')}, deepspeed {v.get('deepspeed')}); steps {total:.0f} s", "",
          "| step | check | result | seconds (budget) | detail |", "|---|---|---|---|---|"]
    seen = set()
    for r in records:
        seen.add(r["name"])
        result = f"skipped: {r['skipped']}" if r.get("skipped") else ("ok" if r["ok"] else "FAIL")
        detail = str(r.get("details", {}).get("summary", "")).replace("|", "/").replace("\n", " ")
        md.append(f"| {r['name']} | {r.get('title', '')} | {result} | {r.get('seconds', 0):.0f} "
                  f"({r.get('budget_s', 0):.0f}) | {detail} |")
    missing = [n for n in (planned if planned is not None else [s.name for s in STEPS]) if n not in seen]
    if missing:
        md.append(f"| (not reached) | {', '.join(missing)} | FAIL | | the run stopped before them |")
    skipped = [r["name"] for r in records if r.get("skipped")]
    md += ["", f"overall: {'PASS' if overall_ok(records) and not missing else 'FAIL'}"
           + (f" ({len(skipped)} skipped: budget: {', '.join(skipped)})" if skipped else "")]
    return "\n".join(md)


def write_report(out: Path) -> int:
    records = read_jsonl(out / "gpu_check.jsonl")
    plan = out / "gpu_check.plan.json"
    md = markdown(records, json.loads(plan.read_text()) if plan.is_file() else None)
    (out / "gpu_check.md").write_text(md + "\n")
    print("\n" + md + f"\n\nwritten: {out / 'gpu_check.jsonl'}, {out / 'gpu_check.md'}", flush=True)
    return 0 if "\noverall: PASS" in md else 1


# --------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="GPU check: each step in its own subprocess under a time limit, one "
                                 "JSON line per step in <out-dir>/gpu_check.jsonl, a markdown table at the end",
                                 epilog="On the GPU machine: bash scripts/gpu_check.sh (installs gpu_wheels/ first).")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: 0.5B-shaped model, bf16, NCCL; cpu: tiny shapes, float32, gloo (CI)")
    ap.add_argument("--out-dir", default="runs/gpu_check", help="gpu_check.jsonl, gpu_check.md and work/")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="time budget of the steps (default 390 s on cuda; 1800 s on cpu, where the first run "
                         "JIT-builds DeepSpeed's CPU ops); a step whose estimate does not fit in what is left is "
                         "recorded as 'skipped: budget'")
    ap.add_argument("--only", default=None, help="comma list of steps to run (default: all, in order): "
                    + ",".join(s.name for s in STEPS))
    ap.add_argument("--keep-work", action="store_true", help="keep <out-dir>/work (model, logs) after a pass")
    ap.add_argument("--report-only", action="store_true", help="rebuild gpu_check.md from gpu_check.jsonl")
    ap.add_argument("--preflight", action="store_true", help="only check the imports (exit 3 if one is missing)")
    ap.add_argument("--step", default=None, help=argparse.SUPPRESS)  # internal: the body of one step
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out_dir).resolve()
    for k in DIST_ENV_VARS:
        os.environ.pop(k, None)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ctx = Ctx(args.device, out)
    if args.step:
        return run_step_here(args.step, ctx)
    if args.report_only:
        return write_report(out)
    if args.preflight:
        found, missing = check_imports()
        if missing:
            print(missing_message(missing), file=sys.stderr, flush=True)
            return 3
        print("gpu_check: imports ok: " + ", ".join(f"{m} {v}" for m, v in found.items()), flush=True)
        return 0
    budget = args.budget_s if args.budget_s is not None else (390.0 if ctx.cuda else 1800.0)
    names = args.only.split(",") if args.only else [s.name for s in STEPS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"gpu_check: unknown step(s) {unknown} in --only; allowed: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    if ctx.cuda:
        import torch  # no CUDA context in this process: is_available() only asks the driver

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; run it on the GPU machine, or use --device cpu", file=sys.stderr)
            return 2
    if not args.only:  # --only reuses what earlier steps left (the model) in work/
        shutil.rmtree(ctx.work, ignore_errors=True)
    (ctx.work / "logs").mkdir(parents=True, exist_ok=True)
    jsonl = out / "gpu_check.jsonl"
    jsonl.write_text("")
    (out / "gpu_check.plan.json").write_text(json.dumps(names))  # what --report-only counts as not reached
    (out / "gpu_check.md").unlink(missing_ok=True)
    t0 = time.perf_counter()
    plan = [BY_NAME[n] for n in names]
    print(f"gpu_check: {len(plan)} steps on {ctx.device}, budget {budget:.0f} s; estimates: "
          + ", ".join(f"{s.name} {s.est_s if ctx.cuda else s.est_cpu_s:.0f} s" for s in plan), flush=True)
    for i, step in enumerate(plan, 1):
        left = budget - (time.perf_counter() - t0)
        est = step.est_s if ctx.cuda else step.est_cpu_s
        # its own limit, and never past the budget: the whole run stays inside --budget-s
        limit = max(1.0, min(step.limit_s if ctx.cuda else 3 * step.limit_s, left))
        if est > left:
            rec = {"name": step.name, "title": step.title, "ok": None, "skipped": "budget", "seconds": 0,
                   "budget_s": est, "details": {"summary": f"skipped: budget (needs ~{est:.0f} s, {max(left, 0):.0f} "
                                                           f"s left of --budget-s {budget:.0f})"}}
            print(f"gpu_check: [{i}/{len(plan)}] {step.name}: skipped: budget ({est:.0f} s > {left:.0f} s left)",
                  flush=True)
        else:
            print(f"gpu_check: [{i}/{len(plan)}] {step.name}: budget {est:.0f} s, limit {limit:.0f} s, "
                  f"{left:.0f} s left -- {step.title}", flush=True)
            rec = run_step(step, ctx, limit)
            print(f"gpu_check: [{i}/{len(plan)}] {step.name}: {'ok' if rec['ok'] else 'FAIL'} in {rec['seconds']:.0f} s"
                  f" -- {rec['details'].get('summary', '')}", flush=True)
            if not rec["ok"]:
                print(tail(ctx.work / "logs" / f"step-{step.name}.log", 2500), flush=True)
        append_jsonl(jsonl, rec)
    rc = write_report(out)
    print(f"gpu_check: {time.perf_counter() - t0:.0f} s of steps", flush=True)
    if rc == 0 and not args.keep_work:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
