"""Fixtures for the rollout tests: tokenizer, a tiny model folder, the embedded SmolLM2, prompts."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from mathrl.models import load_tokenizer

    return load_tokenizer("embedded")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from mathrl.models import resolve_model_path

    return resolve_model_path("embedded")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tokenizer) -> str:
    from mathrl.testing.tiny import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0))


@pytest.fixture(scope="session")
def chat_prompts(tokenizer) -> list[str]:
    qs = ["What is 2+3?", "Name a prime number larger than 10.", "What is 7 times 8?"]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True) for q in qs]
