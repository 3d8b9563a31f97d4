"""Memory: the activation estimate against hand-computed counts, the limits the free memory is read
from, the micro-batch budget fitted to them (``auto`` lowered, a pin kept or the run stopped, issue 40), the
run folder's record of the budget used and a rerun from it, periodic checkpoints by time, and the real model
under an address-space limit (it adapts; without the fit the same run dies)."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from _train_tasks import step_rows

from mathrl.procs import without_dist_env
from mathrl.train import memory
from mathrl.train.models import Models

TINY = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                       intermediate_size=16, vocab_size=10)


def test_micro_batch_bytes_against_a_hand_count():
    # per position 10*8 + 4*4 + 4*16 = 160; positions 3 + 2*2 = 7; attention 2*2*(3*3 + 2*2*(3+2)) = 116;
    # logits 2*10*2*2 = 80; layers 2*(160*7 + 116) = 2472
    est = memory.micro_batch_bytes(TINY, groups=1, rows=2, prompt_len=3, response_len=2)
    assert est == int(memory.CALIBRATION * (2472 + 80) * 4)
    # gradient checkpointing: each layer's input (2*8*7) plus one layer (160*7 + 116)
    ck = memory.micro_batch_bytes(TINY, groups=1, rows=2, prompt_len=3, response_len=2, checkpointing=True)
    assert ck == int(memory.CALIBRATION * (112 + 1236 + 80) * 4)
    # sharing the prompt: two groups cost twice one group
    assert memory.micro_batch_bytes(TINY, groups=2, rows=4, prompt_len=3, response_len=2) == \
        int(memory.CALIBRATION * 2 * (2472 + 80) * 4)


def test_micro_batch_bytes_without_the_score_matrix():
    """A kernel that keeps no score matrix (flash, sdpa's fused kernels): the same count less the 2 H S term."""
    # layers 2 * 160 * 7 = 2240; logits 80
    est = memory.micro_batch_bytes(TINY, groups=1, rows=2, prompt_len=3, response_len=2, scores=False)
    assert est == int(memory.CALIBRATION * (2240 + 80) * 4)
    ck = memory.micro_batch_bytes(TINY, groups=1, rows=2, prompt_len=3, response_len=2, checkpointing=True,
                                  scores=False)
    assert ck == int(memory.CALIBRATION * (112 + 1120 + 80) * 4)
    # per budget token: the 7 tokens of one group
    assert memory.per_token_bytes(TINY, group_size=2, prompt_len=3, response_len=2, scores=False) == est / 7


def _tiny_attention(impl, dropout=0.0):
    return SimpleNamespace(**vars(TINY), _attn_implementation=impl, attention_dropout=dropout)


@pytest.mark.parametrize("impl, device, dropout, keeps", [
    ("eager", "cpu", 0.0, True),
    (None, "cpu", 0.0, True),                 # not decided: the safe side
    ("flash_attention_2", "cuda", 0.0, False),
    ("flex_attention", "cpu", 0.0, False),
    ("sdpa", "cpu", 0.0, False),              # torch's CPU flash kernel takes the padding mask
    ("sdpa", "cpu", 0.1, True),               # ... but not dropout: the math kernel
    ("sdpa", "cuda", 0.0, False),             # fused kernels (asked of torch where CUDA exists)
])
def test_score_matrix_rule(impl, device, dropout, keeps):
    assert memory.builds_score_matrix(_tiny_attention(impl, dropout), device) is keeps


@pytest.mark.parametrize("impl, dropout", [("sdpa", 0.0), ("sdpa", 0.1), ("eager", 0.0)])
def test_score_matrix_rule_matches_the_kernel_that_runs(impl, dropout):
    """The rule agrees with the kernel the trainer's own forward and backward run on CPU (profiler): the
    flash kernel keeps no score matrix; the math kernel and eager attention's softmax do."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mathrl.train.rows import ForwardBatch
    from mathrl.train.layouts import Padded

    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attention_dropout=dropout)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().train()
    model.set_attn_implementation(impl)
    g, G, P, T = 2, 4, 24, 12
    prompt = torch.randint(10, 299, (g, P)).repeat_interleave(G, 0)
    pm = torch.ones_like(prompt)
    pm[:G, :5] = 0  # a left-padded prompt: the kernels get a mask
    resp = torch.randint(10, 299, (g * G, T))
    rm = torch.ones_like(resp)
    rm[1, 7:] = 0
    layout = Padded(G)  # the trainer's shared-prompt layout
    mb = layout.micro_batch(ForwardBatch(prompt, pm, resp, rm.bool()), torch.arange(g * G), torch.device("cpu"))
    with torch.profiler.profile() as prof:
        logp, _ = layout.policy_forward(model, mb, temperature=1.0)
        (-logp.sum()).backward()
    ops = {e.name for e in prof.events()}
    fused = "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    scores = "aten::_scaled_dot_product_attention_math" in ops or "aten::_softmax" in ops
    assert fused != scores, sorted(o for o in ops if "attention" in o or "softmax" in o)
    assert memory.builds_score_matrix(model.config, "cpu", torch.float32) is scores


def test_parameter_count_reads_zero3_ds_numel():
    import torch

    p = torch.nn.Parameter(torch.empty(0))  # a ZeRO-3 partitioned parameter: no local elements
    p.ds_numel = 4096
    assert p.numel() == 0 and memory.parameter_count(p) == 4096
    assert memory.parameter_count(torch.nn.Parameter(torch.zeros(3, 5))) == 15


@pytest.mark.parametrize("zero3", [False, True])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_fit_reserves_the_full_parameter_count_and_reads_the_attention(monkeypatch, zero3, impl):
    """fit_micro_batches: the budget for activations is 0.7 x (free memory - 12 bytes per trainable parameter),
    counted with ds_numel under ZeRO-3 (numel() 0), and the estimate counts the score matrix as the policy's
    attention implementation keeps it."""
    import torch

    from mathrl.config import load_config
    from mathrl.dist.collectives import DistInfo

    cfg = load_config(overrides=["rollout.n=2", "rollout.max_tokens=2", "train.batch_size=4"])
    policy = torch.nn.Linear(1000, 1000)  # 1 001 000 parameters
    if zero3:  # what deepspeed.zero.Init leaves on a rank: empty local tensors, the full count in ds_numel
        for p in policy.parameters():
            p.ds_numel = p.numel()
            p.data = torch.empty(0)
    policy.config = _tiny_attention(impl)
    models = Models(policy=SimpleNamespace(module=policy))
    free = 64 * 2**30
    monkeypatch.setattr(memory, "available_bytes", lambda: (free, "test"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    seen = {}

    def fit(config, budget, **sizes):
        seen.update(sizes, budget=budget)
        return 10**6

    monkeypatch.setattr(memory, "tokens_that_fit", fit)
    memory.fit_micro_batches(cfg, DistInfo(0, 1, 0), models, prompt_len=3)
    assert seen["budget"] == pytest.approx(0.7 * (free - 12 * 1_001_000))
    assert seen["scores"] is (impl == "eager")


@pytest.mark.parametrize("every, counted", [(0, 0), (10, 1_001_000 + 1_000_000 + 1_001)])
def test_a_prm_retrained_by_iterative_rl_is_counted(monkeypatch, every, counted):
    """GRPO+PS holds a frozen PRM (in memory already, no optimizer); iterative RL (algo.prm_update_every > 0)
    trains it every N steps, so its gradients and Adam moments (12 bytes per parameter) are reserved like the
    policy's, although it is frozen when the fit runs."""
    import torch

    from mathrl.config import load_config
    from mathrl.dist.collectives import DistInfo

    cfg = load_config(overrides=["rollout.n=2", "rollout.max_tokens=2", "train.batch_size=4",
                                 "algo.advantage=grpo_ps", "model.prm=/prm", f"algo.prm_update_every={every}"])
    policy = torch.nn.Linear(1000, 1000)
    policy.config = TINY
    prm = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 1000, bias=False),
                              torch.nn.Linear(1000, 1)).requires_grad_(False)
    free = 64 * 2**30
    monkeypatch.setattr(memory, "available_bytes", lambda: (free, "test"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    seen = {}
    monkeypatch.setattr(memory, "tokens_that_fit", lambda config, budget, **k: seen.update(budget=budget) or 10**6)
    memory.fit_micro_batches(cfg, DistInfo(0, 1, 0), Models(policy=SimpleNamespace(module=policy), prm=prm),
                             prompt_len=3)
    assert seen["budget"] == pytest.approx(0.7 * (free - 12 * (1_001_000 + counted)), abs=1.0)


def test_optimizer_reserve_by_hand():
    """Per rank: Adam's moments 8P split over the ranks from stage 1, float32 gradients 4P from stage 2; an
    offloaded optimizer leaves only the gradients on the device."""
    P = 1000
    assert memory.optimizer_reserve(P, stage=0, world=8) == 12 * P  # plain data parallel: all of it
    assert memory.optimizer_reserve(P, stage=1, world=8) == 8 * P // 8 + 4 * P
    assert memory.optimizer_reserve(P, stage=2, world=8) == 12 * P // 8
    assert memory.optimizer_reserve(P, stage=3, world=8) == 12 * P // 8
    assert memory.optimizer_reserve(P, stage=3, world=8, offloaded=True) == 4 * P // 8
    with pytest.raises(ValueError, match="stage 0-3"):
        memory.optimizer_reserve(P, stage=4, world=1)


def test_the_reserve_is_this_ranks_share_at_zero_3(monkeypatch):
    """A 7B-parameter policy at ZeRO-3 over 8 ranks reserves 12 x 7e9 / 8 = 10.5 GB per rank, not the whole
    12 x 7e9 = 84 GB that would leave an 80 GB GPU no room at all (every 7B run refused before training)."""
    import torch

    from mathrl.config import load_config
    from mathrl.dist.collectives import DistInfo

    cfg = load_config(overrides=["rollout.n=2", "rollout.max_tokens=2", "train.batch_size=8",
                                 "deepspeed.zero_stage=3"])
    policy = torch.nn.Linear(2, 2).to(torch.bfloat16)
    for p in policy.parameters():  # what deepspeed.zero.Init leaves on a rank
        p.ds_numel = 3_500_000_000  # weight and bias: 7e9 in all
        p.data = torch.empty(0, dtype=torch.bfloat16)
    policy.config = TINY
    free = 60 * 2**30
    monkeypatch.setattr(memory, "available_bytes", lambda: (free, "test"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    seen = {}
    monkeypatch.setattr(memory, "tokens_that_fit", lambda config, budget, **k: seen.update(budget=budget) or 10**6)
    memory.fit_micro_batches(cfg, DistInfo(0, 8, 0), Models(policy=SimpleNamespace(module=policy)), prompt_len=3)
    assert seen["budget"] == pytest.approx(0.7 * (free - 12 * 7_000_000_000 // 8), abs=1.0) and seen["budget"] > 0


def test_tokens_that_fit_inverts_the_estimate():
    per = memory.per_token_bytes(TINY, group_size=2, prompt_len=3, response_len=2)
    assert memory.tokens_that_fit(TINY, 100 * per, group_size=2, prompt_len=3, response_len=2) == 100
    assert memory.tokens_that_fit(TINY, 0, group_size=2, prompt_len=3, response_len=2) == 0


@pytest.mark.slow
def test_available_memory_reads_the_address_space_limit():
    """In a child with RLIMIT_AS set, the free memory is the limit minus the address space in use."""
    code = ("import resource, json\n"
            "from mathrl.train.memory import available_bytes\n"
            "resource.setrlimit(resource.RLIMIT_AS, (resource.getrlimit(resource.RLIMIT_AS)[0] if False else "
            "int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]) * 1024 + (1 << 30), "
            "resource.RLIM_INFINITY))\n"
            "print(json.dumps(available_bytes()))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**without_dist_env(), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    avail, what = json.loads(p.stdout)
    assert what == "RLIMIT_AS" and 0.5 * 2**30 < avail <= 2**30
    free, what = memory.available_bytes()  # this process: no such limit
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        assert what != "RLIMIT_AS" and free > 0


def _fit(monkeypatch, configured, fit, resumed=None):
    """fit_micro_batches on a stand-in policy with the free memory holding ``fit`` tokens; mini-batch: 4 prompts of
    3 tokens with 2 responses of 2 tokens, 28 tokens. Returns (cfg, stats)."""
    import torch

    from mathrl.config import load_config
    from mathrl.dist.collectives import DistInfo

    cfg = load_config(overrides=["rollout.n=2", "rollout.max_tokens=2", "train.batch_size=4",
                                 f"train.micro_batch_tokens={configured}"])
    policy = torch.nn.Linear(2, 2)
    policy.config = TINY
    models = Models(policy=SimpleNamespace(module=policy))
    monkeypatch.setattr(memory, "tokens_that_fit", lambda *a, **k: fit)
    monkeypatch.setattr(memory, "available_bytes", lambda: (64 * 2**30, "test"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    return cfg, memory.fit_micro_batches(cfg, DistInfo(0, 1, 0), models, prompt_len=3, resumed=resumed)


@pytest.mark.parametrize("resumed, fit, configured, used, says", [
    (20, 100, "auto", 20, "keeping the checkpoint's train.micro_batch_tokens=20 (auto would choose 8192 for a fresh"),
    (20, 10, "auto", 10, "train.micro_batch_tokens=10, but the checkpoint's run used 20 (the free memory holds 10)"),
    (20, 100, 12, 12, "train.micro_batch_tokens=12, but the checkpoint's run used 20 (the configured value is 12)"),
    (20, 100, 8192, 8192, "=8192, but the checkpoint's run used 20 (the configured value is 8192)"),  # a pin wins
    (50, 30, "auto", 50, None),  # both budgets hold a whole mini-batch (28 tokens): the same split, nothing said
    (50, 100, "auto", 50, None),  # kept, and it holds a whole mini-batch like auto's 8192: nothing said
    (20, 100, 20, 20, None),      # the pin is the checkpoint's budget: nothing said
    (None, 10, "auto", 10, None),  # a fresh run: auto lowered, with a note
    (None, 100, "auto", 8192, None),  # a fresh run with memory to spare: auto is 8192
    (None, 30, 8192, 8192, None),  # a pin above the whole mini-batch, which fits: kept
])
def test_resume_keeps_the_checkpoints_budget_or_says_why_not(monkeypatch, capsys, resumed, fit, configured, used,
                                                              says):
    """``auto`` on resume keeps the micro-batch budget its checkpoint was trained with when the free memory holds
    it (the same micro-batches, so the same run) and says so when a fresh run would split otherwise; a pin is
    kept. When the split differs from the checkpoint's, a warning names both budgets and why, since a different
    split changes the float rounding. After the fit the budget is an int, whatever was configured."""
    cfg, stats = _fit(monkeypatch, configured, fit, resumed)
    assert cfg.train.micro_batch_tokens == used and stats["sys/micro_batch_tokens"] == used
    assert type(cfg.train.micro_batch_tokens) is int
    err = capsys.readouterr().err
    assert ("resume:" in err) == (says is not None), err
    if says:
        assert says in err, err
    assert ("would need about" in err) == (configured == "auto" and used == fit < 28), err


@pytest.mark.parametrize("resumed", [None, 12])
def test_a_pin_the_memory_does_not_hold_stops_with_the_numbers(monkeypatch, resumed):
    """A pinned train.micro_batch_tokens is never lowered: when its largest micro-batch does not fit, the fit
    stops (before training) naming what it needs, what is free, the largest value that fits and the settings
    to change; the value it names passes, one more does not (also on resume: a pin is a pin)."""
    from mathrl.train.checkpoint import TrainingError

    with pytest.raises(TrainingError) as info:
        _fit(monkeypatch, 8192, 10, resumed)
    msg = str(info.value)
    assert msg.startswith("memory: train.micro_batch_tokens=8192 is pinned, but micro-batches of up to 28 tokens "
                          "(a whole mini-batch of this rank: 28 tokens) need about "), msg
    assert re.search(r"need about [\d.]+ [KMG]iB of activations and only [\d.]+ [KMG]iB are free for them \(test: "
                     r"[\d.]+ [KMG]iB, less [\d.]+ [KMG]iB for gradients and optimizer state", msg), msg
    assert "the largest value that fits is 10: set train.micro_batch_tokens=auto (lowered to what fits) or at " \
           "most 10" in msg and "model.gradient_checkpointing=true" in msg and "\n" not in msg
    assert _fit(monkeypatch, 10, 10, resumed)[0].train.micro_batch_tokens == 10
    with pytest.raises(TrainingError, match="train.micro_batch_tokens=11 is pinned"):
        _fit(monkeypatch, 11, 10, resumed)


def _trainer(cfg, steps: list | None = None):
    """The product's Trainer with the RL step on the digit task (``steps`` collects the steps the method ran)."""
    from _train_tasks import digit_problems

    from mathrl.train.loop import RLMethod
    from mathrl.train.trainer import Trainer

    class Counted(RLMethod):
        def step(self, trainer):
            if steps is not None:
                steps.append(trainer.state.step + 1)
            return super().step(trainer)

    return Trainer(cfg, Counted(), problems=digit_problems())


def _policy_weights(out):
    from safetensors.torch import load_file

    from mathrl.train import checkpoint as ckpt

    return load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors"))


def test_a_pinned_budget_the_memory_does_not_hold_stops_the_trainer_before_step_1(digit_model_dir, tmp_path,
                                                                                    monkeypatch):
    """Issue 40: a user who pins train.micro_batch_tokens=8192 where the free memory holds 24 tokens of
    activations is no longer lowered to 24: the Trainer stops in its setup, before any step, with the numbers
    and the settings to change, and saves nothing."""
    from _train_tasks import digit_cfg

    from mathrl.train import checkpoint as ckpt
    from mathrl.train.checkpoint import TrainingError

    monkeypatch.setattr(memory, "tokens_that_fit", lambda *a, **k: 24)
    out = tmp_path / "pinned"
    steps: list = []
    with pytest.raises(TrainingError) as info:
        _trainer(digit_cfg(digit_model_dir, out, "train.steps=2", "train.micro_batch_tokens=8192"), steps).fit()
    msg = str(info.value)
    assert msg.startswith("memory: train.micro_batch_tokens=8192 is pinned, but micro-batches of up to "), msg
    assert re.search(r"need about [\d.]+ [KMG]iB of activations and only [\d.]+ [KMG]iB are free", msg), msg
    assert "the largest value that fits is 24: set train.micro_batch_tokens=auto (lowered to what fits) or at " \
           "most 24" in msg, msg
    assert steps == [] and ckpt.list_checkpoints(out) == []
    assert not (out / "metrics.jsonl").is_file() or step_rows(out) == []


def test_auto_is_lowered_and_the_run_folders_config_records_what_ran(digit_model_dir, tmp_path, monkeypatch, capsys):
    """train.micro_batch_tokens: auto (the default) where the free memory holds 24 tokens: the run trains with 24,
    and its config.yaml holds 24 (the file loads back as a config) and names every setting the trainer decided
    (each auto, rollout.max_model_len) with its value in a comment; those stay as given, for a rerun to decide
    on its own machine."""
    from _train_tasks import digit_cfg

    from mathrl.config import load_config

    monkeypatch.setattr(memory, "tokens_that_fit", lambda *a, **k: 24)
    out = tmp_path / "auto"
    cfg = digit_cfg(digit_model_dir, out, "train.steps=1")
    assert cfg.train.micro_batch_tokens == "auto" and cfg.rollout.max_model_len is None
    trainer = _trainer(cfg)
    assert trainer.fit() == 0
    assert "using train.micro_batch_tokens=24" in capsys.readouterr().err
    assert [r["sys/micro_batch_tokens"] for r in step_rows(out)] == [24.0]
    text = (out / "config.yaml").read_text()
    recorded = load_config(out / "config.yaml")
    assert recorded.train.micro_batch_tokens == 24
    assert "#   train.micro_batch_tokens: auto -> 24  (recorded below" in text
    res = trainer.resolved
    for line in (f"model.dtype: auto -> {res.model_dtype}", f"rollout.dtype: auto -> {res.rollout_dtype}",
                 "algo.advantage: auto -> grpo",
                 "algo.kl_in: auto -> loss", "algo.kl_estimator: auto -> k3",
                 f"rollout.max_model_len: null -> {cfg.rollout.max_model_len}"):
        assert f"#   {line}\n" in text, text
    assert cfg.rollout.max_model_len > 0 and trainer.decided["train.micro_batch_tokens"] == ("auto", 24)
    recorded.train.micro_batch_tokens = "auto"  # all else as given
    assert recorded == digit_cfg(digit_model_dir, out, "train.steps=1")


def test_a_rerun_from_the_recorded_config_splits_the_same_way(digit_model_dir, tmp_path, monkeypatch):
    """Two runs of one recipe: the first where the free memory holds 24 tokens (auto -> 24), the second from the
    first's config.yaml on a machine with memory to spare: it trains with 24 too, so it is the same run (the
    same metrics and weights), where before the file said 8192 and the rerun split by that. Resuming the first
    run with the recipe (auto) keeps the checkpoint's 24, and its config.yaml says so."""
    import torch
    from _train_tasks import crash_copy, digit_cfg, without_timing

    from mathrl.config import load_config

    monkeypatch.setattr(memory, "tokens_that_fit", lambda *a, **k: 24)
    first, again, part = tmp_path / "first", tmp_path / "again", tmp_path / "part"
    assert _trainer(digit_cfg(digit_model_dir, first, "train.steps=2", "train.save_every=1")).fit() == 0
    monkeypatch.setattr(memory, "tokens_that_fit", lambda *a, **k: 10**6)
    rerun = load_config(first / "config.yaml", [f"train.output_dir={again}"])
    assert rerun.train.micro_batch_tokens == 24
    assert _trainer(rerun).fit() == 0
    assert [r["sys/micro_batch_tokens"] for r in step_rows(again)] == [24.0, 24.0]
    assert without_timing(step_rows(again)) == without_timing(step_rows(first))
    a, b = _policy_weights(first), _policy_weights(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    crash_copy(first, part, 1)
    resumed = _trainer(digit_cfg(digit_model_dir, part, "train.steps=2", "train.resume=auto"))
    assert resumed.fit() == 0
    assert [r["sys/micro_batch_tokens"] for r in step_rows(part)] == [24.0, 24.0]
    assert load_config(part / "config.yaml").train.micro_batch_tokens == 24
    assert resumed.decided["train.micro_batch_tokens"] == ("auto", 24)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_real_model_under_a_memory_limit_adapts_and_without_the_fit_dies(embedded_model_path, tmp_path):
    """SmolLM2, the demo task, 4 prompts x 8 responses of up to 64 tokens, train.micro_batch_tokens=8192 (the
    whole batch, up to 2788 tokens, in one micro-batch: about 6.3 GiB of activations by the estimate, 5.7
    measured), under an address-space limit that leaves about 5 GiB: the run lowers the budget with a warning
    naming train.micro_batch_tokens and completes;
    the same run with the fit switched off, in the padded layout the estimate describes, dies in its first
    backward (the negative control); a limit too
    small for one group stops with the settings to change, before training."""
    script = Path(__file__).parent / "_memory_limited_run.py"
    # a world of its own (this process may hold one); both cores: the three runs are one process each
    env = {**without_dist_env(), "OMP_NUM_THREADS": "2"}
    limit = os.environ.get("MATHRL_TEST_AS_LIMIT_GB", "8")

    def launch(out, mode, *extra, lim=limit):
        return subprocess.run([sys.executable, str(script), lim, str(out), mode, *extra], capture_output=True,
                              text=True, timeout=800, env=env, cwd=str(Path(__file__).parents[2]))

    fit = launch(tmp_path / "fit", "fit")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "using train.micro_batch_tokens=" in fit.stderr
    first = step_rows(tmp_path / "fit")[0]
    assert first["sys/micro_batch_tokens"] < 8192 and first["sys/memory_available_gb"] < float(limit)
    shutil.rmtree(tmp_path / "fit")  # checkpoints of the real model: gigabytes of disk
    # the control runs the padded layout, the one the fit's estimate describes (packed rows cost no more,
    # and with packing on this batch can squeeze under the limit on one machine and not on another)
    nofit = launch(tmp_path / "nofit", "nofit", "train.packing=false")
    shutil.rmtree(tmp_path / "nofit", ignore_errors=True)
    assert nofit.returncode != 0, "the limit did not bind: the test shows nothing"
    assert "alloc" in nofit.stderr.lower() or "memory" in nofit.stderr.lower(), nofit.stderr[-2000:]
    tiny = launch(tmp_path / "tiny", "fit", lim=str(float(limit) - 2.5))
    assert tiny.returncode == 3 and "lower rollout.max_tokens" in tiny.stderr, tiny.stderr[-2000:]


@pytest.mark.slow
def test_checkpoints_by_time(digit_model_dir, tmp_path):
    """train.save_every_minutes saves when that much time has passed (here: at once, so after every step);
    0 saves only at the end; the default is on (30 minutes)."""
    from _train_tasks import digit_cfg, digit_problems

    from mathrl.config import load_config
    from mathrl.train import checkpoint as ckpt
    from mathrl.train import run

    def steps_saved(name, *extra):
        out = tmp_path / name
        cfg = digit_cfg(digit_model_dir, out, "rollout.max_tokens=3", "train.steps=3", "train.keep_last=10", *extra)
        assert run(cfg, problems=digit_problems(12)) == 0
        return [s for s, _ in ckpt.list_checkpoints(out)]

    assert load_config(None, []).train.save_every_minutes == 30.0
    assert steps_saved("often", "train.save_every_minutes=0.00001") == [1, 2, 3]
    assert steps_saved("off", "train.save_every_minutes=0") == [3]
