"""No silent skips in CI: ``require`` of tests/conftest.py skips with the reason in a
user's run and fails under ``MATHRL_REQUIRE_ALL=1`` (set by .ci/run); the vLLM environment probe
does not turn a slow interpreter into a skip, and a broken one fails naming the command and its output.

Each case runs a small pytest session in a subprocess whose test file loads tests/conftest.py by path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here takes seconds (make test-fast skips them)

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
REPO = CONFTEST.parents[1]

INNER = textwrap.dedent('''
    import importlib.util
    import sys
    from pathlib import Path

    import pytest

    spec = importlib.util.spec_from_file_location("testenv_under_test", {conftest!r})
    env = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = env
    spec.loader.exec_module(env)

    ABSENT = Path({absent!r})


    @pytest.fixture()
    def shared_thing():
        env.require(ABSENT.is_dir(), f"data folder {{ABSENT}} is absent")
        return ABSENT


    def test_in_body():
        env.require(ABSENT.is_dir(), f"data folder {{ABSENT}} is absent")


    def test_in_fixture(shared_thing):
        pass


    def test_import():
        env.require_import("mathrl_no_such_module_xyz")


    def test_present():
        env.require(True, "never shown")


    def test_vllm():
        print("VLLM-PY", env.vllm_python())
''')


def _session(tmp_path: Path, require_all: bool, vllm_python: str, probe_timeout: str | None = None):
    tests = tmp_path / "inner"
    tests.mkdir(exist_ok=True)
    (tests / "test_inner.py").write_text(INNER.format(conftest=str(CONFTEST), absent=str(tmp_path / "no-data")))
    env = {k: v for k, v in os.environ.items() if k not in ("MATHRL_REQUIRE_ALL", "MATHRL_VLLM_PROBE_TIMEOUT")}
    env.update(OMP_NUM_THREADS="1", MATHRL_VLLM_PYTHON=vllm_python,
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    if require_all:
        env["MATHRL_REQUIRE_ALL"] = "1"
    if probe_timeout is not None:
        env["MATHRL_VLLM_PROBE_TIMEOUT"] = probe_timeout
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-s", "-p", "no:cacheprovider",
                        "--rootdir", str(tests), str(tests / "test_inner.py")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tests)
    return p.returncode, p.stdout + p.stderr


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for .venv-vllm/bin/python (it ignores its arguments)."""
    path = tmp_path / "fake-vllm-python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.timeout(600)
def test_missing_resources_skip_with_reason_without_the_switch(tmp_path):
    """A user's run: every missing resource is a skip whose reason the summary shows."""
    rc, out = _session(tmp_path, False, str(tmp_path / "no-venv" / "bin" / "python"))
    assert rc == 0, out
    assert "1 passed, 4 skipped" in out, out
    assert out.count("SKIPPED [1]") == 4, out
    assert f"data folder {tmp_path / 'no-data'} is absent" in out
    assert "cannot import mathrl_no_such_module_xyz" in out
    assert "does not exist (run scripts/setup_vllm_env.sh)" in out
    assert "never shown" not in out


@pytest.mark.timeout(600)
def test_missing_resources_fail_under_require_all(tmp_path):
    """CI (MATHRL_REQUIRE_ALL=1): the same session fails; a fixture's missing resource is an error."""
    rc, out = _session(tmp_path, True, str(tmp_path / "no-venv" / "bin" / "python"))
    assert rc == 1, out
    assert "3 failed, 1 passed, 1 error" in out, out
    assert "skipped" not in out.lower(), out
    assert f"data folder {tmp_path / 'no-data'} is absent" in out
    assert "MATHRL_REQUIRE_ALL=1: a missing or broken resource is a failure, not a skip" in out
    assert "does not exist (run scripts/setup_vllm_env.sh)" in out


@pytest.mark.timeout(600)
def test_broken_vllm_env_fails_naming_the_command_and_output(tmp_path):
    py = _fake_python(tmp_path, 'echo "ModuleNotFoundError: No module named vllm (fake)" >&2; exit 3')
    rc, out = _session(tmp_path, True, py)
    assert rc == 1 and "FAILED test_inner.py::test_vllm" in out, out
    assert f"vLLM environment probe `{py} -c 'import vllm, mathrl.rollout.vllm_worker" in out, out
    assert "exited with status 3" in out and "No module named vllm (fake)" in out, out
    rc, out = _session(tmp_path, False, py)
    assert rc == 0 and "exited with status 3" in out and "FAILED" not in out, out


@pytest.mark.timeout(600)
def test_slow_vllm_probe_is_not_a_skip(tmp_path):
    """An interpreter that takes a while to import vllm (a loaded machine) is waited for, not skipped;
    one that runs past the probe's limit fails under the switch, naming the command."""
    py = _fake_python(tmp_path, "sleep 4; echo 0.32.0-fake")
    rc, out = _session(tmp_path, True, py, probe_timeout="")  # the default limit (minutes)
    assert f"VLLM-PY {py}" in out, out
    assert "FAILED test_inner.py::test_vllm" not in out, out
    rc, out = _session(tmp_path, True, py, probe_timeout="1")
    assert "did not finish within 1 s" in out and f"`{py} -c " in out, out
    assert "FAILED test_inner.py::test_vllm" in out, out
