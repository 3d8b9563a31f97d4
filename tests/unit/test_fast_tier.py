"""`make test-fast` (``pytest -m "not slow"``) keeps tests of every package: a test folder whose tests
were all marked slow would drop out of the edit-loop tier without anyone noticing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fast_tier_counts(extra: list[str] | None = None) -> Counter:
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-m", "not slow",
                           "-p", "no:cacheprovider", *(extra or [])], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    return Counter(line.split("/")[1] for line in ids)


@pytest.mark.slow
def test_fast_tier_covers_every_test_folder():
    folders = sorted(p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    counts = fast_tier_counts()
    thin = {f: counts.get(f, 0) for f in folders if counts.get(f, 0) < 5}
    assert not thin, f"`make test-fast` keeps fewer than 5 tests of these folders: {thin}"
    # negative control: deselecting one folder's tests shows up as a missing folder
    assert "eval" not in fast_tier_counts(["--ignore", "tests/eval"])
