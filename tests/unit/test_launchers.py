"""Multi-node launchers: DeepSpeed's runner gets a .deepspeed_env with the variables remote ranks need."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("name", ["launch_multinode.sh", "launch_torchrun_multinode.sh", "launch_slurm.sbatch",
                                  "launch_1gpu.sh", "launch_8gpu.sh"])
def test_launchers_are_valid_bash(name):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / name)]).returncode == 0


def test_multinode_writes_deepspeed_env(tmp_path):
    env = {"PATH": os.environ["PATH"], "HF_HOME": "/shared/hf", "MATHRL_CACHE": "/shared/mathrl",
           "NCCL_SOCKET_IFNAME": "eth0", "UNRELATED": "x", "MATHRL_LAUNCH_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPTS / "launch_multinode.sh"), "hosts", "configs/grpo_math.yaml",
                          "train.output_dir=/shared/runs/x"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / ".deepspeed_env").read_text().splitlines()
    assert lines == ["HF_HOME=/shared/hf", "MATHRL_CACHE=/shared/mathrl", "NCCL_SOCKET_IFNAME=eth0"]
    assert "deepspeed --hostfile hosts --module mathrl.cli train configs/grpo_math.yaml" in out.stdout


def test_torchrun_multinode_needs_its_variables(tmp_path):
    env = {"PATH": os.environ["PATH"], "MATHRL_LAUNCH_DRY_RUN": "1"}
    bad = subprocess.run(["bash", str(SCRIPTS / "launch_torchrun_multinode.sh"), "c.yaml"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "NNODES" in bad.stderr
    ok = subprocess.run(["bash", str(SCRIPTS / "launch_torchrun_multinode.sh"), "c.yaml"],
                        env={**env, "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "n0"}, capture_output=True, text=True)
    assert ok.returncode == 0 and "--nnodes 2 --node_rank 1" in ok.stdout
