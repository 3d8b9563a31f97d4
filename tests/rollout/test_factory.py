"""`make_engine` / `resolve_backend`: the config's rollout.backend choice."""

from __future__ import annotations

import pytest

from mathrl.rollout import make_engine, resolve_backend
from mathrl.rollout.hf import HFRolloutEngine
from mathrl.rollout.vllm import vllm_importable


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="rollout.backend='sglang'.*vllm, hf, auto"):
        resolve_backend("sglang")


def test_auto_falls_back_to_hf_without_vllm(tmp_path, monkeypatch, tiny_dir):
    if vllm_importable():
        pytest.skip("vllm is importable in this interpreter, so auto picks it")
    missing = str(tmp_path / "no-venv" / "bin" / "python")
    chosen, why = resolve_backend("auto", missing)
    assert chosen == "hf" and "does not exist" in why
    monkeypatch.setenv("MATHRL_VLLM_PYTHON", missing)
    eng = make_engine("auto", tiny_dir)
    assert isinstance(eng, HFRolloutEngine)


def test_explicit_vllm_without_vllm_names_the_fix(tmp_path, tiny_dir):
    if vllm_importable():
        pytest.skip("vllm is importable in this interpreter")
    with pytest.raises(RuntimeError, match="setup_vllm_env.sh"):
        make_engine("vllm", tiny_dir, vllm_python=str(tmp_path / "python"))
