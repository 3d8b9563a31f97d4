#!/usr/bin/env python
"""GPU check: everything a lent GPU should confirm, in one run of a few minutes.

On one GPU (``--device cuda``, the default; run through ``bash scripts/gpu_check.sh``, which first
installs the wheelhouse that ``scripts/gpu_wheelhouse.sh`` built):

1. *imports*: every package mathrl's training path needs (DeepSpeed, math-verify, ...), with versions;
2. *algo on CUDA*: every advantage estimator, KL estimator and loss of ``mathrl.algo`` on CUDA
   tensors against the same call on CPU (float64; equal to 1e-10);
3. *training*: for each model shape (random weights, Qwen2.5-0.5B and -1.5B shapes, bf16) and each
   ZeRO stage (0, 2, 3) at world size 1 over NCCL with the hf rollout backend: 3 GRPO steps and 2
   PPO steps through ``mathrl.train.run`` (the real verifier grades; a small length bonus gives the
   groups reward variance);
4. *save and resume*: the first shape's GRPO ZeRO-2 run saves every step; a copy cut back to step 2
   resumes to step 3; weights and logged metrics are compared with the uninterrupted run;
5. *bench*: ``scripts/bench_gpu.py`` (GRPO update tokens/s and MFU, generation tokens/s).

It writes ``<out>/gpu_check.json`` and ``<out>/gpu_check.md`` (one row per check) and exits 0 only
if every check that ran passed. A time budget (``--budget-s``) skips the larger shape's runs that
would not fit, and says so in the table.

``--device cpu`` runs the same path with tiny shapes (2 layers, width 64), float32, gloo, and the
bench's ``--smoke`` mode: the CI test (tests/bench/test_gpu_check.py) runs it so the check cannot
rot before a GPU arrives. ``--preflight`` only checks the imports (exit 3 and the fix when one is
missing).

    bash scripts/gpu_check.sh                         # on the GPU machine
    python scripts/gpu_check.py --device cpu --out-dir /tmp/gc   # CPU, about a minute
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # mathrl from this working tree (not installed on the GPU machine)
    sys.path.insert(0, str(REPO))
from mathrl.procs import DIST_ENV_VARS, without_dist_env  # noqa: E402  (stdlib only)

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
    "0.5b": Shape(name="Qwen2.5-0.5B", layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864,
                  vocab=151936),
    "1.5b": Shape(name="Qwen2.5-1.5B", layers=28, hidden=1536, heads=12, kv_heads=2, intermediate=8960,
                  vocab=151936),
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
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=32768 if device == "cuda" else 1024,
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


def problems(n: int = 64):
    from mathrl.data import Problem

    out = []
    for i in range(n):
        a, b = i % 10, (3 * i + 1) % 10
        if a + b < 10:
            out.append(Problem(id=f"gc/{i}", question=f"what is {a} + {b} ?", gold=str(a + b), source="gpu_check"))
    return out


def register_hash_bonus() -> None:
    """The reward term ``gpu_check_hash``: a small bonus from a hash of the text, added to the real
    verifier's ``correctness`` so groups of a random model still have reward variance and GRPO's
    advantages are not all zero."""
    import zlib

    from mathrl.reward.rewards import REWARDS, register_reward

    if "gpu_check_hash" in REWARDS:
        return

    @register_reward("gpu_check_hash", needs_grades=False)
    def hash_bonus(ctx, *, bonus: float = 0.25) -> list[float]:
        return [bonus * (zlib.crc32(r.encode()) % 2) for r in ctx.responses]


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
            out[f"adv/{name}"] = A.ADVANTAGE_ESTIMATORS[name](sc, gi)
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


# --------------------------------------------------------------------------- training runs


def train_cfg(model_dir: Path, out: Path, algo: str, stage: int, steps: int, device: str, extra=()):
    from mathrl.config import load_config

    cuda = device == "cuda"
    over = [f"model.name={model_dir}", "rollout.backend=hf", f"rollout.max_tokens={48 if cuda else 6}",
            f"rollout.n={8 if cuda else 4}", f"train.batch_size={8 if cuda else 2}", "train.lr=1e-5",
            f"train.steps={steps}", f"deepspeed.zero_stage={stage}", "data.template=chat_boxed",
            f"model.dtype={'bfloat16' if cuda else 'float32'}", "logging.tensorboard=false",
            f"train.output_dir={out}", f"algo.name={algo}",
            "reward.terms={correctness: {}, gpu_check_hash: {}}"]
    register_hash_bonus()
    if algo == "grpo":
        over.append("algo.kl_coef=0.04")
    return load_config(None, over + list(extra))


def _steps(out: Path) -> list[dict]:
    from mathrl.train.metrics import read_metrics

    return [m for m in read_metrics(out / "metrics.jsonl") if "event" not in m]


def _last_checkpoint(out: Path) -> int | None:
    from mathrl.train import checkpoint as ckpt

    found = ckpt.list_checkpoints(out) if (out / "checkpoints").is_dir() else []
    return found[-1][0] if found else None


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def train_run(model_dir: Path, out: Path, shape: Shape, algo: str, stage: int, steps: int, device: str,
              extra=()) -> dict:
    import torch

    from mathrl.train import run

    row = {"shape": shape.name, "algo": algo, "zero_stage": stage, "steps": steps}
    t0 = time.perf_counter()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        rc = run(train_cfg(model_dir, out, algo, stage, steps, device, extra), problems=problems())
        logged = _steps(out)
        keys = ("reward/mean", "loss/policy", "loss/value", "kl/mean", "policy/grad_norm", "tokens")
        row["metrics"] = [{k: s[k] for k in keys if k in s} for s in logged]
        finite = all(isinstance(v, (int, float)) and v == v and abs(v) != float("inf")
                     for s in row["metrics"] for v in s.values())
        row["ok"] = rc == 0 and len(logged) == steps and finite
        row["status"] = "ok" if row["ok"] else f"rc={rc}, {len(logged)} steps logged, finite={finite}"
    except Exception as exc:  # noqa: BLE001 - one failed run must not hide the others
        row["ok"], row["status"] = False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        row["traceback"] = traceback.format_exc()[-4000:]
        print(row["traceback"], file=sys.stderr, flush=True)
    row["seconds"] = time.perf_counter() - t0
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None
    _free(device)
    print(f"gpu_check: {shape.name} {algo} ZeRO-{stage}: {row['status']} ({row['seconds']:.1f} s)", flush=True)
    return row


def resume_source_args(steps: int) -> tuple[str, ...]:
    """The resume source saves at step ``steps - 1`` and at the end (two checkpoints kept)."""
    return (f"train.save_every={max(steps - 1, 1)}", "train.keep_last=2")


def resume_check(model_dir: Path, full: Path, shape: Shape, stage: int, steps: int, device: str) -> dict:
    """Cut the uninterrupted run ``full`` back to step ``steps - 1`` and resume it to ``steps``."""
    from safetensors.torch import load_file

    from mathrl.train import checkpoint as ckpt

    keep = steps - 1
    part = full.parent / (full.name + "-resumed")
    shutil.rmtree(part, ignore_errors=True)
    # what a crash right after step ``keep``'s checkpoint leaves (only that checkpoint is copied: on the
    # GPU each one holds the optimizer state, gigabytes)
    (part / "checkpoints").mkdir(parents=True)
    for f in full.iterdir():
        if f.is_file() and f.name != "metrics.jsonl":
            shutil.copy2(f, part / f.name)
    shutil.copytree(full / "checkpoints" / ckpt.step_dirname(keep), part / "checkpoints" / ckpt.step_dirname(keep))
    (part / "metrics.jsonl").write_text("".join(
        line + "\n" for line in (full / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("step", 0) <= keep))
    row = train_run(model_dir, part, shape, "grpo", stage, steps, device, extra=resume_source_args(steps)
                    + ("train.resume=auto",))
    out = {"shape": shape.name, "zero_stage": stage, "resumed_from_step": keep, "to_step": steps,
           "run_ok": row["ok"], "seconds": row["seconds"], "status": row["status"]}
    if not row["ok"]:
        out.update(ok=False, weights_equal=False, metrics_equal=False)
        return out
    wa = load_file(str(ckpt.list_checkpoints(full)[-1][1] / "policy" / "model.safetensors"))
    wb = load_file(str(ckpt.list_checkpoints(part)[-1][1] / "policy" / "model.safetensors"))
    diff = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "sys/"))}  # noqa: E731
                          for r in rows]
    out["weights_equal"] = set(wa) == set(wb) and all(wa[k].equal(wb[k]) for k in wa)
    out["weights_max_abs_diff"] = diff
    out["metrics_equal"] = strip(_steps(part)) == strip(_steps(full))
    out["ok"] = out["weights_equal"] and out["metrics_equal"]
    print(f"gpu_check: resume from step {keep}: weights equal {out['weights_equal']} (max |dw| {diff:.3g}), "
          f"metrics equal {out['metrics_equal']}", flush=True)
    return out


# --------------------------------------------------------------------------- bench


def bench(device: str, work: Path, timeout: float) -> dict:
    out = work / "bench_gpu.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_gpu.py"), "--out", str(out)]
    cmd += ["--smoke"] if device == "cpu" else ["--warmup", "1", "--steps", "3", "--gen-tokens", "128"]
    t0 = time.perf_counter()
    try:
        # not this process's world-of-one rendezvous (init_distributed put RANK, MASTER_PORT... in os.environ)
        env = without_dist_env()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout, 30))
        tail = (proc.stdout + proc.stderr)[-3000:]
        rc = proc.returncode
    except subprocess.TimeoutExpired as exc:
        tail, rc = f"timed out after {exc.timeout:.0f} s", 124
    res = {"cmd": " ".join(cmd[1:]), "rc": rc, "seconds": time.perf_counter() - t0, "ok": False}
    print(tail, flush=True)
    if rc == 0 and out.is_file():
        full = json.loads(out.read_text())
        tr, ge = full.get("grpo_update", {}), full.get("generation", {})
        res.update(ok=bool(tr) and bool(ge) and "DeepSpeed ZeRO" in tr.get("optimizer", ""), optimizer=tr.get("optimizer"),
                   update_tok_s=tr.get("computed_tok_s"), response_tok_s=tr.get("response_tok_s"),
                   mfu=tr.get("mfu"), achieved_tflops=tr.get("achieved_tflops"),
                   gen_tok_s=ge.get("mathrl_hf", {}).get("tok_s"),
                   raw_gen_tok_s=ge.get("raw_hf_generate", {}).get("tok_s"),
                   matmul_tflops=full.get("matmul_tflops"), peak_mem_gib=tr.get("peak_mem_gib"), full=full)
    else:
        res["tail"] = tail
    return res


# --------------------------------------------------------------------------- report


def _f(x, fmt=".0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(res: dict) -> str:
    ok = lambda b: "ok" if b else "FAIL"  # noqa: E731
    md = [f"GPU check on {res['device_name']} ({res['dtype']}; torch {res['versions'].get('torch')}, "
          f"transformers {res['versions'].get('transformers')}, deepspeed {res['versions'].get('deepspeed')}); "
          f"{res['total_s']:.0f} s", "", "| check | result | detail |", "|---|---|---|"]
    a = res.get("algo")
    if a:
        md.append(f"| algo on {a['device']} vs CPU ({a['functions']} functions, float64) | {ok(a['ok'])} | "
                  f"max abs diff {a['max_abs_diff']:.2g} |")
    for r in res["runs"]:
        last = (r.get("metrics") or [{}])[-1]
        detail = r["status"] if not r.get("ok") else (
            f"{r['seconds']:.0f} s; last step reward {_f(last.get('reward/mean'), '.3f')}, policy loss "
            f"{_f(last.get('loss/policy'), '.4f')}" + (f", value loss {_f(last.get('loss/value'), '.4f')}"
                                                       if "loss/value" in last else "")
            + (f"; peak {r['peak_mem_gib']:.1f} GiB" if r.get("peak_mem_gib") else ""))
        result = "skipped" if r.get("skipped") else ok(r.get("ok"))
        md.append(f"| {r['algo'].upper()} {r['steps']} steps, ZeRO-{r['zero_stage']}, {r['shape']} | {result} | "
                  f"{detail} |")
    rs = res.get("resume")
    if rs:
        detail = (f"weights equal: {rs.get('weights_equal')} (max abs diff {_f(rs.get('weights_max_abs_diff'), '.3g')}), "
                  f"metrics equal: {rs.get('metrics_equal')}") if rs.get("run_ok") else rs["status"]
        md.append(f"| save + resume (step {rs['resumed_from_step']} -> {rs['to_step']}, GRPO ZeRO-{rs['zero_stage']}, "
                  f"{rs['shape']}) | {ok(rs['ok'])} | {detail} |")
    b = res.get("bench")
    if b:
        if b["ok"]:
            md += [f"| bench: GRPO update tokens/s ({b['optimizer'].split(' (')[0]}) | ok | "
                   f"{_f(b['update_tok_s'])} ({_f(b['response_tok_s'])} response) |",
                   f"| bench: MFU | ok | {_f(b['mfu'], '.1%')} ({_f(b['achieved_tflops'], '.1f')} TFLOP/s) |",
                   f"| bench: generation tokens/s, mathrl hf | ok | {_f(b['gen_tok_s'])} (raw generate "
                   f"{_f(b['raw_gen_tok_s'])}) |"]
        else:
            md.append(f"| bench (scripts/bench_gpu.py) | FAIL | rc {b['rc']} |")
    md += ["", f"overall: {'PASS' if res['ok'] else 'FAIL'}"]
    return "\n".join(md)


# --------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="GPU check: imports, algo on CUDA, GRPO/PPO through DeepSpeed ZeRO "
                                 "0/2/3 (NCCL, hf rollout), save+resume, bench_gpu.py; JSON + markdown",
                                 epilog="On the GPU machine: bash scripts/gpu_check.sh (installs gpu_wheels/ first).")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: real shapes, bf16, NCCL; cpu: tiny shapes, float32, gloo (CI)")
    ap.add_argument("--out-dir", default="runs/gpu_check", help="gpu_check.json, gpu_check.md and the run folders")
    ap.add_argument("--shapes", default=None, help="comma list of 0.5b,1.5b,tiny (default: 0.5b,1.5b on cuda; tiny on cpu)")
    ap.add_argument("--stages", default="0,2,3", help="ZeRO stages")
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--ppo-steps", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=390.0,
                    help="time budget of this script; runs that would not fit are skipped (reported)")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--keep-runs", action="store_true",
                    help="keep every run folder (default: deleted after its row is recorded; checkpoints are large)")
    ap.add_argument("--preflight", action="store_true", help="only check the imports (exit 3 if one is missing)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    cpu = args.device == "cpu"
    for k in DIST_ENV_VARS:
        os.environ.pop(k, None)  # a world of one with a fresh rendezvous port (mathrl's init_distributed)
    if cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    found, missing = check_imports()
    if missing:
        print(missing_message(missing), file=sys.stderr, flush=True)
        return 3
    if args.preflight:
        print("gpu_check: imports ok: " + ", ".join(f"{m} {v}" for m, v in found.items()), flush=True)
        return 0
    try:
        import matplotlib  # noqa: F401  (mathrl.train.run plots the reward curve at the end)
    except ImportError:
        import mathrl.train.report as report

        report.plot_rewards = lambda history, path: None
        print("gpu_check: matplotlib is not installed; the reward-curve plot is skipped", flush=True)
        found["matplotlib"] = "absent (plot skipped)"
    import torch

    if not cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run it on the GPU machine, or use --device cpu", file=sys.stderr)
        return 2
    shapes = [SHAPES[s] for s in (args.shapes or ("tiny" if cpu else "0.5b,1.5b")).split(",")]
    stages = [int(s) for s in args.stages.split(",")]
    out_dir = Path(args.out_dir).resolve()
    work = out_dir / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    res: dict = {"device": args.device, "device_name": torch.cuda.get_device_name(0) if not cpu else "cpu",
                 "dtype": "float32" if cpu else "bfloat16", "versions": found, "args": vars(args), "runs": []}
    if not cpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    res["algo"] = algo_check("cpu" if cpu else "cuda")
    print(f"gpu_check: algo on {res['algo']['device']}: max abs diff {res['algo']['max_abs_diff']:.2g}", flush=True)
    elapsed = lambda: time.perf_counter() - t_start  # noqa: E731
    first_shape_s = None
    for i, shape in enumerate(shapes):
        # the larger shape costs about (params ratio) x the first one; skip runs that would not fit
        model_dir = save_random_model(shape, work / f"model-{shape.name}", "cpu" if cpu else "cuda")
        t_shape = time.perf_counter()
        scale = 1.0 if i == 0 or first_shape_s is None else 3.0
        # the larger shapes start with ZeRO-3 (what they would use), in case the budget cuts the rest
        for stage in (stages if i == 0 else sorted(stages, reverse=True)):
            for algo, steps in (("grpo", args.grpo_steps), ("ppo", args.ppo_steps)):
                per_run = (first_shape_s or 0) / (2 * len(stages)) * scale
                if i > 0 and elapsed() + per_run > args.budget_s:
                    res["runs"].append({"shape": shape.name, "algo": algo, "zero_stage": stage, "steps": steps,
                                        "ok": True, "skipped": True,
                                        "status": f"skipped: time budget ({args.budget_s:.0f} s, --budget-s)"})
                    continue
                source = i == 0 and algo == "grpo" and stage == 2 and steps >= 2
                run_dir = work / f"{shape.name}-{algo}-z{stage}"
                res["runs"].append(train_run(model_dir, run_dir, shape, algo, stage, steps, args.device,
                                             resume_source_args(steps) if source else ()))
                row = res["runs"][-1]
                row["checkpoint"] = _last_checkpoint(run_dir)
                if row["ok"] and row["checkpoint"] != steps:
                    row["ok"], row["status"] = False, f"no checkpoint of step {steps} (newest: {row['checkpoint']})"
                if not source and not args.keep_runs:
                    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints hold optimizer states: GBs each
        if i == 0:
            first_shape_s = time.perf_counter() - t_shape
            src = work / f"{shape.name}-grpo-z2"
            if 2 in stages and args.grpo_steps >= 2:
                res["resume"] = resume_check(model_dir, src, shape, 2, args.grpo_steps, args.device)
                if not args.keep_runs:
                    shutil.rmtree(src, ignore_errors=True)
                    shutil.rmtree(src.parent / (src.name + "-resumed"), ignore_errors=True)
            if not args.skip_bench:
                res["bench"] = bench(args.device, work, timeout=max(args.budget_s - elapsed(), 60) if not cpu else 600)
        shutil.rmtree(model_dir, ignore_errors=True)
    res["imported_distributions"] = imported_distributions()
    res["total_s"] = elapsed()
    res["ok"] = bool(res["algo"]["ok"] and all(r.get("ok") for r in res["runs"])
                     and res.get("resume", {"ok": True})["ok"] and (args.skip_bench or res["bench"]["ok"]))
    res["markdown"] = markdown(res)
    (out_dir / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "gpu_check.md").write_text(res["markdown"] + "\n")
    print("\n" + res["markdown"] + f"\n\nwritten: {out_dir / 'gpu_check.json'}, {out_dir / 'gpu_check.md'}",
          flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
