"""The labelled verifier sets in eval/verifier_sets/ stay well-formed: the peers' set passes its own
checker (schema, unique ids and pairs, the dev/holdout rule), and every model-output record has a
label, its split by the same rule, and a committed answer wherever the label is true."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

SETS = Path(__file__).resolve().parents[2] / "eval" / "verifier_sets"


def _split(rid: str) -> str:
    return "holdout" if int(hashlib.sha1(rid.encode()).hexdigest(), 16) % 10 < 3 else "dev"


def test_peers_set_passes_its_checker():
    out = subprocess.run([sys.executable, str(SETS / "check_peers.py"), str(SETS / "peers.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name,n", [("model_outputs_gsm8k.jsonl", 150), ("model_outputs_math500.jsonl", 150),
                                    ("model_outputs_synthetic.jsonl", 192)])
def test_model_output_sets_are_well_formed(name, n):
    rows = [json.loads(line) for line in (SETS / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == n and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert isinstance(r["label"], bool) and isinstance(r["debatable"], bool), r["id"]
        assert r["split"] == _split(r["id"]), r["id"]
        assert r["finish_reason"] in ("stop", "length"), r["id"]
        # committed_answer is the labeller's reading (mostly verbatim, twice condensed from math spans)
        assert not r["label"] or r["committed_answer"], r["id"]  # a right answer was committed to
