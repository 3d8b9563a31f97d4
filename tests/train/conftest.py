"""Fixtures for trainer tests: a tiny model on disk, and a digit task a tiny model learns in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from _train_tasks import digit_tokenizer


def _save_digit_model(path: Path, hidden_size: int) -> Path:
    from mathrl.testing.tiny import build_tiny_model

    tok = digit_tokenizer()
    build_tiny_model(tok, seed=0, hidden_size=hidden_size).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def digit_model_dir(tmp_path_factory) -> Path:
    return _save_digit_model(tmp_path_factory.mktemp("digit_model"), 32)


@pytest.fixture(scope="session")
def digit_model_dir_vllm(tmp_path_factory) -> Path:
    """vLLM's CPU attention kernels need head_dim >= 32: 4 heads x 32."""
    return _save_digit_model(tmp_path_factory.mktemp("digit_model_vllm"), 128)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer, saved as a Hugging Face folder."""
    from mathrl.testing.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0)
