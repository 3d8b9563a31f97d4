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


def tiny_qwen2_config(vocab_size: int, *, pad_token_id: int | None = None, eos_token_id: int | None = None,
                      bos_token_id: int | None = None, hidden_size: int = 64, layers: int = 3,
                      tie_word_embeddings: bool = False):
    """A small Qwen2 config (Qwen2.5's shape scaled down: q/k/v biases, rope theta 1e6, untied head by default)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
    )


def _build(model_cls, cfg, tokenizer, seed: int, attn_implementation: str | None):
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(cfg)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.float().eval()


def build_tiny_model(tokenizer, *, seed: int = 0, hidden_size: int = 64, layers: int = 2,
                     attn_implementation: str | None = None):
    """Build a tiny ``LlamaForCausalLM`` matching ``tokenizer``'s vocabulary, deterministically.

    ``attn_implementation`` (``"sdpa"``, ``"eager"``; default: transformers' choice) selects the
    attention kernel."""
    from transformers import LlamaForCausalLM

    cfg = tiny_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                      hidden_size=hidden_size, layers=layers)
    return _build(LlamaForCausalLM, cfg, tokenizer, seed, attn_implementation)


def build_tiny_qwen2_model(tokenizer, *, seed: int = 0, hidden_size: int = 64, layers: int = 3,
                           tie_word_embeddings: bool = False, attn_implementation: str | None = None):
    """Build a tiny ``Qwen2ForCausalLM`` (q/k/v biases, untied LM head by default) matching
    ``tokenizer``'s vocabulary, deterministically: a second architecture for the forward tests."""
    from transformers import Qwen2ForCausalLM

    cfg = tiny_qwen2_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                            hidden_size=hidden_size, layers=layers, tie_word_embeddings=tie_word_embeddings)
    return _build(Qwen2ForCausalLM, cfg, tokenizer, seed, attn_implementation)


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
