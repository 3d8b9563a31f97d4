"""A tiny randomly initialised causal LM for fast unit tests.

It uses a real tokenizer (the embedded SmolLM2 one by default) so that chat
templates, EOS handling and padding behave as with the real model, but it has
two layers of width 64, so a forward pass takes milliseconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def tiny_config(vocab_size: int, *, pad_token_id: int | None = None, eos_token_id: int | None = None,
                bos_token_id: int | None = None, hidden_size: int = 64, layers: int = 2):
    """A small Llama config (the SmolLM2 architecture, scaled down)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=pad_token_id,
        eos_token_id=eos_token_id, bos_token_id=bos_token_id,
    )


def build_tiny_model(tokenizer, *, seed: int = 0, hidden_size: int = 64, layers: int = 2):
    """Build a tiny ``LlamaForCausalLM`` matching ``tokenizer``'s vocabulary, deterministically."""
    from transformers import LlamaForCausalLM

    cfg = tiny_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                      hidden_size=hidden_size, layers=layers)
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.float().eval()


def save_tiny_model(dest: str | os.PathLike, tokenizer=None, *, seed: int = 0) -> Path:
    """Save a tiny model and its tokenizer as a Hugging Face folder (loadable by vLLM too)."""
    from mathrl.models.loading import load_tokenizer

    if tokenizer is None:
        tokenizer = load_tokenizer("embedded")
    dest = Path(dest)
    model = build_tiny_model(tokenizer, seed=seed)
    model.save_pretrained(str(dest), safe_serialization=True)
    tokenizer.save_pretrained(str(dest))
    return dest
