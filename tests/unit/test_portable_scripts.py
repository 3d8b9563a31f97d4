"""The scripts that made published results run on another machine (issue 40, point 5): no absolute path of
the machine that ran them, the data folder from MATHRL_DATA, and TRL pinned to the version the docs name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for d in ("docs", "scripts") for p in (ROOT / d).rglob("*.sh"))
# an absolute path into a machine's own folders (the repo, the data, a home, a scratch folder)
_MACHINE_PATH = re.compile(r"(?<![\w.$}])/(?:work|home|Users|tmp|root|mnt|data)/")


def test_the_published_shell_scripts_are_found():
    assert ROOT / "docs" / "results" / "wordproblems_vs_trl" / "run.sh" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_script_names_a_machine_path(script: Path):
    bad = [f"{script.relative_to(ROOT)}:{i}: {line.strip()}" for i, line in
           enumerate(script.read_text().splitlines(), 1)
           if not line.lstrip().startswith("#") and _MACHINE_PATH.search(line)]
    assert not bad, "absolute paths of one machine:\n" + "\n".join(bad)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script: Path):
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("name", ["run.sh", "eval_finals_first.sh"])
def test_anchor_scripts_stop_without_data_folder_and_run_from_anywhere(tmp_path, name):
    """Started from another folder without MATHRL_DATA, the script stops at once and says what to set
    (before any training): it found the repo from its own location, not from the caller's folder."""
    script = ROOT / "docs" / "results" / "wordproblems_vs_trl" / name
    env = {k: v for k, v in os.environ.items() if k != "MATHRL_DATA"}
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "set MATHRL_DATA" in res.stderr, res.stderr
    assert "No such file" not in res.stderr, res.stderr  # the cd into the repo worked


def test_trl_is_pinned_to_the_version_the_docs_name():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from trl_anchor import pinned_trl
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    pin = pinned_trl()
    assert pin is not None, "pyproject.toml's dev extra must pin trl==X (the published comparisons ran one TRL)"
    named = set(re.findall(r"TRL (\d+\.\d+)(?:\.\d+)?(?= GRPOTrainer|'s)", (ROOT / "README.md").read_text()))
    assert named, "README names the TRL version of its comparisons"
    assert named == {".".join(pin.split(".")[:2])}, (pin, named)


def test_pinned_trl_reads_an_exact_pin_only(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from trl_anchor import pinned_trl
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    f = tmp_path / "pyproject.toml"
    f.write_text('[project.optional-dependencies]\ndev = ["pytest>=8", "trl>=1.0"]\n')
    assert pinned_trl(f) is None
    f.write_text('[project.optional-dependencies]\ndev = ["pytest>=8", "TRL == 1.16.0"]\n')
    assert pinned_trl(f) == "1.16.0"
