"""Loading the policy, reference and critic models (docs/architecture.md, "models")."""

from mathrl.models.embedded import EMBEDDED_ALIASES, cache_root, ensure_embedded_model, is_embedded
from mathrl.models.errors import ModelError
from mathrl.models.loading import load_causal_lm, load_tokenizer, resolve_model_path, torch_dtype

__all__ = [
    "EMBEDDED_ALIASES", "ModelError", "cache_root", "ensure_embedded_model", "is_embedded",
    "load_causal_lm", "load_tokenizer", "resolve_model_path", "torch_dtype",
]
