"""An engine older than mathrl needs fails at start with the package, both versions and the fix."""

from __future__ import annotations

from importlib import metadata

import pytest

from mathrl.config import ConfigError
from mathrl.versions import MINIMUM, parse_version, check_versions


def test_installed_versions_pass():
    check_versions()


def test_parse():
    assert parse_version("2.13.0+cpu") == (2, 13, 0) and parse_version("0.19.4") == (0, 19, 4) and parse_version("5.0.0rc1") == (5, 0, 0)


@pytest.mark.parametrize("old", ["0.16.9", "0.19.3"])
def test_an_old_deepspeed_is_refused_with_the_fix(monkeypatch, old):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: old if name == "deepspeed" else real(name))
    with pytest.raises(ConfigError, match=rf"deepspeed {old} is installed but mathrl needs deepspeed>=0.19.4.*pip install"):
        check_versions()


@pytest.mark.slow
def test_pyproject_floors_match():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    for name, floor in MINIMUM.items():
        assert f'"{name}>={floor}' in text, name
