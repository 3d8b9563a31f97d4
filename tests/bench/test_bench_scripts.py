"""The benchmark scripts: scripts/bench_vs_trl.py and scripts/bench_gpu.py.

* The FLOPs formula of bench_gpu (used for MFU) against torch's own FLOP counter on a small
  Qwen2-shaped model: forward, forward + backward, a cached prefix, and mathrl's shared-prompt
  GRPO forward (fast).
* bench_vs_trl end to end at ``--size tiny`` with the tiny random model: both systems and the limit
  worker run, alternate, and produce the markdown table and the JSON file (slow: ~30-60 s).
* bench_gpu ``--help`` works without a GPU, and ``--smoke`` runs its whole path on CPU (slow).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mathrl_testenv import SHARED_DATA, require, require_import

from mathrl.procs import without_dist_env

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
GSM8K = SHARED_DATA / "gsm8k" / "train.jsonl"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench_gpu():
    return _load("bench_gpu")


@pytest.fixture(scope="module")
def eager_model(bench_gpu):
    # eager attention: plain matmuls, which torch's FLOP counter sees (its CPU SDPA kernel it does not)
    return bench_gpu.build_model(bench_gpu.SMOKE, torch.float32, "cpu", attn="eager")


def _count(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def test_forward_flops_match_torch_counter(bench_gpu, eager_model):
    s = bench_gpu.SMOKE
    ids = torch.randint(3, s.vocab, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = _count(lambda: eager_model(input_ids=ids, logits_to_keep=10, use_cache=False))
    assert got == bench_gpu.forward_flops(s, 24, 10, causal=False, rows=3)
    # causal counts only the needed query-key pairs: fewer than the dense rectangle
    assert bench_gpu.forward_flops(s, 24, 10, causal=True, rows=3) < got


def test_training_flops_are_three_forwards(bench_gpu, eager_model):
    s = bench_gpu.SMOKE
    ids = torch.randint(3, s.vocab, (2, 20), generator=torch.Generator().manual_seed(1))
    eager_model.train()

    def fwd_bwd():
        eager_model(input_ids=ids, logits_to_keep=8, use_cache=False).logits.sum().backward()

    got = _count(fwd_bwd)
    eager_model.zero_grad(set_to_none=True)
    assert got == 3 * bench_gpu.forward_flops(s, 20, 8, causal=False, rows=2)


def test_cached_prefix_flops(bench_gpu, eager_model):
    from transformers import DynamicCache

    s = bench_gpu.SMOKE
    ids = torch.randint(3, s.vocab, (3, 24), generator=torch.Generator().manual_seed(2))
    cache = DynamicCache(config=eager_model.config)
    with torch.no_grad():
        eager_model(input_ids=ids[:, :7], use_cache=True, past_key_values=cache)
        got = _count(lambda: eager_model(input_ids=ids[:, 7:], use_cache=True, past_key_values=cache,
                                         logits_to_keep=5))
    assert got == bench_gpu.forward_flops(s, 17, 5, causal=False, prefix_len=7, rows=3)


def test_train_flops_of_mathrl_shared_prompt_update(bench_gpu, eager_model):
    """train_flops(shared_prompt=True) = what mathrl's grouped policy forward + backward computes,
    except the one logits position per row that the shared path computes and drops."""
    from mathrl.train.rows import ForwardBatch
    from mathrl.train.layouts import Padded

    s = bench_gpu.SMOKE
    B, G, P, R = 2, 3, 9, 6
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, s.vocab, (B, P), generator=g).repeat_interleave(G, 0)
    resp = torch.randint(3, s.vocab, (B * G, R), generator=g)
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    rmask = torch.ones_like(resp, dtype=torch.bool)
    layout = Padded(G)  # shared prompt
    mb = layout.micro_batch(ForwardBatch(prompts, pmask, resp, rmask), torch.arange(B * G), "cpu")
    eager_model.train()

    def step():
        logp, _ = layout.policy_forward(eager_model, mb, temperature=1.0, with_entropy=True)
        logp.sum().backward()

    got = _count(step)
    eager_model.zero_grad(set_to_none=True)
    expected = bench_gpu.train_flops(s, [P] * B, [[R] * G] * B, shared_prompt=True, causal=False)
    dropped = 3 * B * G * 2 * s.hidden * s.vocab
    assert got == expected + dropped
    # sharing the prompt computes less than repeating it for every row
    assert expected < bench_gpu.train_flops(s, [P] * B, [[R] * G] * B, shared_prompt=False, causal=False)


def test_trl_micro_rows_fit_the_token_budget():
    mod = _load("bench_vs_trl")
    assert mod.trl_micro_rows(64, 200, 128, 8192) == 16  # 16 x 328 fits, 32 x 328 does not
    assert mod.trl_micro_rows(16, 300, 64, 8192) == 16
    assert mod.trl_micro_rows(6, 10_000, 64, 8192) == 1  # one row over budget still forms a micro-batch


def test_ratios_are_against_trls_fastest_row_and_rows_name_their_precision():
    mod = _load("bench_vs_trl")
    systems = {"trl": {"wall_median": 90.0}, "trl-bf16": {"wall_median": 70.0}, "mathrl-hf-bf16": {"wall_median": 7.0}}
    assert mod.trl_best(systems) is systems["trl-bf16"]
    assert mod.trl_best({"mathrl-hf": {"wall_median": 1.0}}) is None
    assert mod.label("mathrl-hf-bf16") == "mathrl, hf backend, bf16 autocast"
    assert mod.label("trl", "1.16.0") == "TRL 1.16.0 GRPOTrainer (transformers generate)"
    assert "model.autocast=bfloat16" in mod.mathrl_overrides(
        {"model_path": "m", "data": "d", "template": "t", "G": 2, "T": 4, "beta": 0.0, "B": 1, "lr": 1e-6, "seed": 0,
         "total_steps": 1, "micro_batch_tokens": 64, "workdir": "w", "reward_workers": 1}, "hf", bf16=True)
    assert mod.trl_settings({"B": 2, "G": 2, "T": 4, "beta": 0.0, "lr": 1e-6, "total_steps": 1, "seed": 0,
                             "workdir": "w"}, 2, bf16=True)["bf16"] is True


def _env() -> dict:
    """The scripts' environment: a world of their own. An earlier test may have left this pytest
    process holding a process group (RANK, MASTER_PORT in os.environ, its TCP store listening); a child
    that inherits MASTER_PORT fails to bind it (EADDRINUSE)."""
    return dict(without_dist_env(), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                DS_ACCELERATOR="cpu")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_vs_trl_tiny_end_to_end(tmp_path):
    require(GSM8K.is_file(), f"real data file {GSM8K} is absent")
    require_import("trl", "pip install -e '.[dev]'")
    out, md = tmp_path / "res.json", tmp_path / "table.md"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_vs_trl.py"), "--size", "tiny", "--model", "tiny",
                           "--steps", "1", "--threads", "1", "--out", str(out), "--md", str(md),
                           "--workdir", str(tmp_path / "work")],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["systems"]) == {"trl", "mathrl-hf"}
    B, G, T = res["size"]["B"], res["size"]["G"], res["size"]["T"]
    for name, s in res["systems"].items():
        steps = res["raw"][name]
        assert len(steps) == 2  # warm-up + 1 measured
        assert s["wall_median"] > 0 and s["peak_rss_mib"] > 100
        # every row generated at least one token and at most T
        assert B * G <= s["gen_tokens_median"] <= B * G * T
        assert s["phases_median"]["generate"] > 0
    assert res["systems"]["mathrl-hf"]["ratio_vs_trl"] > 0
    assert res["limit"]["decode_tok_s"] > 0 and res["limit"]["update_tok_s"] > 0
    # the TRL run used the settings the script promises (printed and recorded)
    trl = res["settings"]["trl"]
    assert trl["gradient_checkpointing"] is False and trl["use_cpu"] is True and trl["use_vllm"] is False
    assert trl["beta"] == pytest.approx(0.04) and trl["num_generations"] == G
    table = md.read_text()
    assert table.startswith("| system |") and "mathrl, hf backend" in table and "TRL" in table and "limit" in table
    assert table.strip() in proc.stdout


@pytest.mark.slow
def test_bench_gpu_help_and_cpu_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_gpu.py"), "--help"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "deepspeed" in proc.stdout.lower() and "--smoke" in proc.stdout
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_gpu.py"), "--smoke", "--no-deepspeed",
                           "--out", str(out)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    tr, ge = res["grpo_update"], res["generation"]
    assert "no DeepSpeed" in tr["optimizer"] and tr["update_s_median"] > 0 and tr["train_flops"] > 0
    assert ge["mathrl_hf"]["tokens"] > 0 and ge["raw_hf_generate"]["tokens"] > 0
    assert res["markdown"].startswith("| GPU measurement |")


@pytest.mark.slow
def test_bench_packing_smoke(embedded_model_path):
    """scripts/bench_packing.py end to end at a tiny size on the real model: both layouts, the table,
    and packing removes padding where lengths are spread."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_packing.py"), "--prompts", "2", "--group", "8",
                           "--max-tokens", "32", "--repeats", "1", "--model", str(embedded_model_path)],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith(("| equal", "| spread"))]
    assert [(r[0].strip(), r[3].strip()) for r in rows] == [("equal", "padded"), ("equal", "packed"),
                                                           ("spread", "padded"), ("spread", "packed")]
    frac = {(r[0].strip(), r[3].strip()): float(r[4]) for r in rows}
    assert frac[("spread", "packed")] < frac[("spread", "padded")]


def test_bench_verifier_keeps_its_pool_across_sets_like_math_verify_keeps_its_process(monkeypatch):
    """Throughput per set compares like with like: mathrl's worker pool lives across the sets (as
    math-verify's process does, and as a training run's pool does) and is restarted only when the
    verifier's settings change. The earlier bench restarted it for every set, charging each set with
    a cold worker; that version is the negative control."""
    bench = _load("bench_verifier")
    from mathrl.reward import GradeOptions
    from mathrl.reward import pool as pool_mod

    monkeypatch.setenv("MATHRL_VERIFIER_SECOND_OPINION", "1")
    cases = [("\\boxed{\\frac{1}{2}}", "0.5", True, False), ("so $x=3$", "4", False, False)]
    try:
        verdicts, seconds, timeouts = bench.run_mathrl(cases, 1, 10.0)
        assert verdicts == [True, False] and seconds > 0 and timeouts == 0
        first = pool_mod.get_pool()
        bench.run_mathrl(cases, 1, 10.0)
        assert pool_mod.get_pool() is first, "the pool was restarted between two sets with the same settings"
        bench.run_mathrl(cases, 1, 10.0, second_opinion=False)
        assert pool_mod.get_pool() is not first, "a changed second-opinion switch must restart the workers"
        assert os.environ["MATHRL_VERIFIER_SECOND_OPINION"] == "0"

        # negative control: the old per-set restart is caught by the same identity check
        def old_run(cs, workers, timeout, second_opinion=True):
            pool_mod.shutdown_pool()
            pool_mod.get_pool(workers).grade_many([("\\boxed{1}", "1", False)] * workers,
                                                  GradeOptions(timeout=30.0))
        p = pool_mod.get_pool()
        old_run(cases, 1, 10.0)
        assert pool_mod.get_pool() is not p
    finally:
        pool_mod.shutdown_pool()
        bench._POOL_SETTINGS.clear()


def test_trl_anchor_precision_follows_model_autocast(tmp_path, monkeypatch):
    """TRL runs bf16 exactly when the mathrl run would: model.autocast=auto decided by the same probe."""
    from mathrl.config import load_config
    from mathrl.models import precision

    anchor = _load("trl_anchor")
    monkeypatch.setattr(anchor, "_cuda", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native in (False, True):
        monkeypatch.setattr(precision, "native_bf16", lambda native=native: native)
        for autocast, want in (("auto", native), ("off", False), ("bfloat16", True)):
            cfg = load_config("configs/demo.yaml", [f"model.autocast={autocast}"])
            assert anchor.trl_config_kwargs(cfg, tmp_path, micro_rows=2)["bf16"] is want, (native, autocast)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_trl_anchor_trains_the_recipes_task_and_plots_against_wall_clock(tmp_path, tokenizer):
    """scripts/trl_anchor.py: TRL's GRPOTrainer on the demo recipe's task (tiny model), stopped by its
    wall-clock budget with a checkpoint, the run evaluated by `mathrl eval --series` like a mathrl run,
    and the accuracy-vs-wall-clock plot of both."""
    require_import("trl", "pip install -e '.[dev]'")
    from mathrl.testing.tiny import save_tiny_model

    anchor = _load("trl_anchor")
    model = save_tiny_model(tmp_path / "tiny", tokenizer, seed=0)
    sizes = [f"model.name={model}", "train.batch_size=2", "rollout.n=2", "rollout.max_tokens=6", "train.steps=3",
             "data.eval_limit=3", "eval.n=2", "eval.k=[1,2]", "eval.max_tokens=4", "rollout.backend=hf"]
    # the mapping of the recipe to GRPOConfig is what the docstring promises
    from mathrl.config import load_config

    cfg = load_config("configs/demo.yaml", sizes)
    kw = anchor.trl_config_kwargs(cfg, tmp_path, micro_rows=2)
    assert (kw["num_generations"], kw["max_completion_length"], kw["beta"], kw["learning_rate"]) == (2, 6, 0.04, 1e-5)
    assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == 4 and kw["loss_type"] == "dapo"
    assert kw["temperature"] == cfg.rollout.temperature and kw["scale_rewards"] == "group" and not kw["bf16"]
    assert kw["mask_truncated_completions"] is False
    kw = anchor.trl_config_kwargs(load_config("configs/demo.yaml", sizes + ["algo.mask_truncated=true"]), tmp_path, 2)
    assert kw["mask_truncated_completions"] is True
    # GRPO's batch-level std is TRL's scale_rewards="batch"; Dr. GRPO's auto aggregation its loss_type dr_grpo
    kw = anchor.trl_config_kwargs(load_config("configs/demo.yaml", sizes + ["algo.std_normalize=batch"]), tmp_path, 2)
    assert kw["scale_rewards"] == "batch"
    kw = anchor.trl_config_kwargs(load_config("configs/demo.yaml", sizes + ["algo.std_normalize=false",
                                                                            "algo.loss_agg=seq-mean-token-sum-norm"]),
                                  tmp_path, 2)
    assert (kw["scale_rewards"], kw["loss_type"]) == ("none", "dr_grpo")
    with pytest.raises(SystemExit, match="algo.advantage='rloo'"):
        anchor.trl_config_kwargs(load_config("configs/demo.yaml", sizes + ["algo.advantage=rloo"]), tmp_path, 2)
    # settings without a TRL counterpart are refused, naming the key (the word-problem recipe samples dynamically)
    with pytest.raises(SystemExit, match="algo.dynamic_sampling=True has no counterpart"):
        anchor.trl_config_kwargs(load_config("configs/grpo_wordproblems_cpu.yaml", sizes), tmp_path, micro_rows=2)
    with pytest.raises(SystemExit, match="algo.pass_rate_filter=2"):
        anchor.trl_config_kwargs(load_config("configs/demo.yaml", sizes + ["algo.pass_rate_filter=2"]), tmp_path, 2)
    assert anchor.micro_rows_for(64, 300, 8192) == 16 and anchor.micro_rows_for(6, 10_000, 100) == 1
    run = tmp_path / "trl"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "trl_anchor.py"), "train", "--config", "configs/demo.yaml",
                           "--minutes", "0.0001", "--out", str(run), *sizes],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    clock = [json.loads(x) for x in (run / "wallclock.jsonl").read_text().splitlines()]
    assert [c["step"] for c in clock] == [1] and clock[0]["seconds"] > 0  # the budget stopped it after step 1
    assert (run / "checkpoint-1" / "config.json").is_file()
    env = dict(_env())
    proc = subprocess.run([sys.executable, "-m", "mathrl.cli", "eval", "--config", "configs/demo.yaml", "--series",
                           str(run), "--out", str(run / "series"), *sizes],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [p["step"] for p in json.loads((run / "series" / "series.json").read_text())["points"]]
    assert steps == [0, 1]  # the base model and TRL's checkpoint
    png = tmp_path / "vs.png"
    assert anchor.main(["plot", f"trl={run}", "--metric", "greedy", "--out", str(png)]) == 0
    assert png.stat().st_size > 0
    xs, ys, bench = anchor.curve(run, run / "series", None, "greedy")
    assert xs == [0.0, clock[0]["seconds"] / 60] and len(ys) == 2 and bench == "synthetic"
