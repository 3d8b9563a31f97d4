"""The critic: a scalar value head on a causal-LM backbone (PPO baseline).

``V(s_t)`` for every token position is ``w . h_t + b`` where ``h_t`` is the
backbone's last hidden state. The head is initialised to zero so the first
values are 0 and the first advantages are the (KL-shaped) returns.

Saved as a Hugging Face folder of the backbone (``save_pretrained``) plus
``value_head.safetensors``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """Backbone (the decoder stack of a causal LM, without its LM head) + linear value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_causal_lm(cls, causal_lm: nn.Module) -> "ValueModel":
        backbone = causal_lm.get_decoder() if hasattr(causal_lm, "get_decoder") else causal_lm.model
        model = cls(backbone, causal_lm.config.hidden_size)
        model.config = causal_lm.config
        return model.to(next(causal_lm.parameters()).dtype)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> "ValueModel":
        """Load a critic saved by :meth:`save_pretrained`, or initialise one from a causal-LM folder."""
        from transformers import AutoModelForCausalLM

        if (Path(path) / "backbone.safetensors").is_file():
            return cls.load_saved(path, dtype)
        return cls.from_causal_lm(AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Values ``[B, L]`` (one per position) in float32."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.value_head(hidden).squeeze(-1).float()

    def save_pretrained(self, path: str | os.PathLike, state_dict: dict | None = None) -> None:
        """Write the backbone as a causal-LM-shaped folder plus the head's safetensors."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        head = {k.split("value_head.", 1)[1]: v.contiguous().cpu() for k, v in sd.items()
                if k.startswith("value_head.")}
        backbone = {k.split("backbone.", 1)[1]: v.contiguous().cpu() for k, v in sd.items()
                    if k.startswith("backbone.")}
        save_file(head, str(path / HEAD_FILE))
        save_file(backbone, str(path / "backbone.safetensors"))
        self.config.save_pretrained(str(path))

    @classmethod
    def load_saved(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> "ValueModel":
        """Reload a critic written by :meth:`save_pretrained` (backbone + head files)."""
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(path))
        lm = AutoModelForCausalLM.from_config(config).to(dtype)
        model = cls.from_causal_lm(lm)
        with _gathered(model):  # under ZeRO-3 init the backbone is sharded: load into the gathered weights
            model.backbone.load_state_dict(load_file(str(Path(path) / "backbone.safetensors")))
            model.value_head.load_state_dict(load_file(str(Path(path) / HEAD_FILE)))
        return model


def _gathered(model: nn.Module):
    """``deepspeed.zero.GatheredParameters`` over the model's ZeRO-3 shards (rank 0's values are kept and
    re-partitioned on exit), or a no-op when nothing is sharded."""
    import contextlib

    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
