"""Fixtures for the ablation tests: the tiny digit model on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def digit_model_dir(tmp_path_factory) -> Path:
    from _ablate_tasks import digit_tokenizer

    from mathrl.testing.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("ablate_digit_model")
    tok = digit_tokenizer()
    build_tiny_model(tok, seed=0, hidden_size=32).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path
