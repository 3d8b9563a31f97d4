"""LoRA through peft on the real SmolLM2-135M-Instruct with DeepSpeed ZeRO-2 and ZeRO-3: the reference is
the base model (the policy with its adapters off, no second copy), only the adapters train, the
checkpoint holds the adapter (peft format) and the merged model, and a resume is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _train_tasks import crash_copy, without_timing, step_rows as _steps
from safetensors.torch import load_file

from mathrl.config import ConfigError, load_config
from mathrl.train import checkpoint as ckpt
from mathrl.train import run

QUIET = ["logging.tensorboard=false"]



@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", [2, 3])
def test_lora_on_the_real_model(embedded_model_path, tmp_path, stage):
    args = [f"model.name={embedded_model_path}", "model.lora.r=4", "model.lora.alpha=8", "rollout.backend=hf",
            "rollout.n=2", "rollout.max_tokens=16", "train.batch_size=2", "train.steps=2", "train.save_every=1",
            "train.keep_last=3", "train.lr=1e-3", "algo.kl_coef=0.04", "algo.ppo_epochs=2", "algo.entropy_coef=0.01",
            "data.source=synthetic",
            "data.synthetic_size=16", "data.eval_limit=1", "eval.n=1", "eval.k=1", "eval.max_tokens=4",
            "eval.greedy=false", f"deepspeed.zero_stage={stage}", *QUIET]
    full = tmp_path / "full"
    assert run(load_config("configs/demo.yaml", [*args, f"train.output_dir={full}"])) == 0
    steps = _steps(full)
    # the reference is the base model and the adapters start as a no-op (B = 0): no KL at step 1
    assert steps[0]["kl/mean"] < 1e-9 and steps[1]["kl/mean"] > 1e-6
    folder = ckpt.list_checkpoints(full)[-1][1]
    adapter = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert any(float(v.abs().max()) > 0 for k, v in adapter.items() if ".lora_B." in k)  # the adapters trained
    # the DeepSpeed state holds the adapters and their optimizer state, not the 135M frozen weights
    ds_bytes = sum(f.stat().st_size for f in (folder / "ds_policy").rglob("*.pt"))
    assert ds_bytes < 0.1 * (135e6 * 4), ds_bytes
    # the adapter folder is peft's format: loaded onto the base model it gives the merged policy/ folder
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 504, 3108, 28, 216, 33, 1212]])
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_model_path), folder / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(folder / "policy")
    base = AutoModelForCausalLM.from_pretrained(embedded_model_path)
    with torch.no_grad():
        a, b, c = peft_model(input_ids=ids).logits, merged(input_ids=ids).logits, base(input_ids=ids).logits
    assert (a - b).abs().max() < 1e-3 and (a - c).abs().max() > 1e-3
    # mathrl eval --model <checkpoint>/adapter: merged onto its base once, in the cache
    from mathrl.models import resolve_model_path

    via_adapter = resolve_model_path(str(folder / "adapter"), tmp_path / "cache")
    w_adapter, w_policy = load_file(str(Path(via_adapter) / "model.safetensors")), load_file(
        str(folder / "policy" / "model.safetensors"))
    assert all((w_adapter[k] - w_policy[k]).abs().max() < 1e-5 for k in w_policy)
    # exact resume from the step-1 checkpoint
    part = tmp_path / "part"
    crash_copy(full, part, keep_step=1)
    assert run(load_config("configs/demo.yaml", [*args, f"train.output_dir={part}", "train.resume=auto"])) == 0
    a_part = load_file(str(ckpt.list_checkpoints(part)[-1][1] / "adapter" / "adapter_model.safetensors"))
    assert all(torch.equal(a_part[k], adapter[k]) for k in adapter)
    assert without_timing(_steps(part)) == without_timing(steps)
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["config"]["model"]["lora"] == {"r": 4, "alpha": 8}


def test_lora_settings_are_checked_with_the_key_at_fault():
    with pytest.raises(ConfigError, match=r"model.lora.r \(command line\): .*integer >= 1"):
        load_config(None, ["model.lora.r=0"])
    with pytest.raises(ConfigError, match=r"model.lora.rank.*unknown key.*allowed: r, alpha"):
        load_config(None, ["model.lora.rank=8"])
    with pytest.raises(ConfigError, match="algo.ref_update_every = 2 with model.lora"):
        load_config(None, ["model.lora.r=8", "algo.ref_update_every=2"])
    assert load_config(None, ["model.lora.target_modules=[q_proj, v_proj]"]).model.lora == {
        "target_modules": ["q_proj", "v_proj"]}
