"""An unreachable hub is detected once (issue 38 point 5): before, a hub id on an offline machine took 27-50 s
of `Retrying in 8s` lines before the clear error (measured here: 50.7 s for a tokenizer); now one TCP probe
switches the libraries to offline mode and the error comes at once, with one note.

The hub is made unreachable by pointing HF_ENDPOINT at a closed local port, so the test does not depend on
the machine's network."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest


def _run(code: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                            "HF_DATASETS_OFFLINE", "MATHRL_DATA")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("what, code, fragment", [
    ("model", "from mathrl.models import load_tokenizer; load_tokenizer('mathrl-test/no-such-model-xyz')",
     "cannot load model 'mathrl-test/no-such-model-xyz'"),
    ("dataset", "from mathrl.data import load_problems; load_problems('gsm8k')",
     "hub:openai/gsm8k"),
])
def test_an_unreachable_hub_fails_at_once_with_one_note(what, code, fragment):
    proc, seconds = _run(code)
    err = proc.stderr
    assert proc.returncode != 0 and fragment in err, err[-3000:]
    assert err.count("mathrl: the Hugging Face hub (127.0.0.1:9) is not reachable") == 1, err[-3000:]
    assert "Retrying" not in err and seconds < 25, (seconds, err[-3000:])
