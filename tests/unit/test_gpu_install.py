"""The GPU install command resolves: pyproject's ``gpu`` extra (torch, vLLM,
transformers, DeepSpeed pins) with mathrl's dependencies and the dev extra, for Linux x86_64 /
CPython 3.12, by pip's resolver against the package registry (metadata only). A mutated pin set that
vLLM 0.33 cannot co-install with (torch 2.13) must be rejected."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_gpu_install.py"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=540)


def test_gpu_pins_resolve_together():
    res = _check()
    assert res.returncode == 0, res.stdout + res.stderr
    table = dict(re.findall(r"^\| (\S+) \| (\S+) \|$", res.stdout, re.M))
    pins = dict(re.findall(r'"(torch|vllm|transformers|deepspeed)==([^"]+)"',
                           (ROOT / "pyproject.toml").read_text()))
    assert set(pins) == {"torch", "vllm", "transformers", "deepspeed"}
    for name, version in pins.items():
        assert table[name] == version, (name, table)


def test_a_conflicting_pin_is_rejected(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    mutated = re.sub(r'"torch==[^"]+"', '"torch==2.13.0"', text)
    assert mutated != text
    (tmp_path / "pyproject.toml").write_text(mutated)
    res = _check("--pyproject", str(tmp_path / "pyproject.toml"))
    assert res.returncode == 1
    assert "does not resolve" in res.stderr and "torch" in res.stderr, res.stderr
