"""`mathrl` sets DS_ACCELERATOR=cpu only where no CUDA device can be visible (issue 37, point 2).

A container given only GPU 3 has /dev/nvidia3 and no /dev/nvidia0; the old test (CUDA_VISIBLE_DEVICES set
or /dev/nvidia0 present) forced DeepSpeed onto the CPU there while mathrl's device() said CUDA."""

from __future__ import annotations

import pytest

import mathrl.cli as cli
from mathrl.accelerator import ds_accelerator_choice

CTL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]


@pytest.mark.parametrize("env, files, want", [
    ({}, [], "cpu"),                                              # a CPU machine
    ({}, CTL, "cpu"),                                             # driver files without a GPU device file
    ({}, ["/dev/nvidia3", *CTL], None),                           # only GPU 3 given to the container
    ({}, ["/dev/nvidia0"], None),
    ({}, ["/dev/nvidia12"], None),
    ({"CUDA_VISIBLE_DEVICES": "1"}, [], None),                    # the scheduler names a device: let DeepSpeed look
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f1e"}, [], None),
    ({}, ["/dev/dxg"], None),                                     # WSL2 exposes CUDA through /dev/dxg
    ({"CUDA_VISIBLE_DEVICES": ""}, [], "cpu"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, [], "cpu"),
    ({"CUDA_VISIBLE_DEVICES": ""}, ["/dev/nvidia0"], "cpu"),      # GPUs hidden: cpu, with a note
    ({"DS_ACCELERATOR": "cuda"}, [], None),                       # the user's choice is never replaced
    ({"DS_ACCELERATOR": "cpu"}, ["/dev/nvidia0"], None),
])
def test_choice(env, files, want):
    assert ds_accelerator_choice(env, files)[0] == want


def test_hidden_gpus_are_named():
    value, note = ds_accelerator_choice({"CUDA_VISIBLE_DEVICES": "-1"}, ["/dev/nvidia2", "/dev/nvidia0", *CTL])
    assert value == "cpu"
    assert "/dev/nvidia0, /dev/nvidia2" in note and "CUDA_VISIBLE_DEVICES='-1'" in note
    assert "CUDA_VISIBLE_DEVICES=0" in note  # the fix
    assert ds_accelerator_choice({}, ["/dev/nvidia3"])[1] is None


@pytest.mark.parametrize("files, env, want", [
    (["/dev/nvidia3", "/dev/nvidiactl"], {}, None),
    ([], {}, "cpu"),
    (["/dev/nvidia3"], {"DS_ACCELERATOR": "xpu"}, "xpu"),
    (["/dev/nvidia0"], {"CUDA_VISIBLE_DEVICES": ""}, "cpu"),
])
def test_main_applies_it(monkeypatch, capsys, files, env, want):
    """`mathrl --version` goes through the same start-up as every command."""
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("glob.glob", lambda pattern: [f for f in files if f.startswith(pattern.rstrip("*"))])
    assert cli.main(["--version"]) == 0
    import os

    assert os.environ.get("DS_ACCELERATOR") == want
    err = capsys.readouterr().err
    assert ("hides them all" in err) == (env.get("CUDA_VISIBLE_DEVICES") == "")
