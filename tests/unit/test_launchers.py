"""Launchers: DeepSpeed's runner gets a private env file with the variables remote ranks need, and every launcher
passes the user's arguments through exactly (checked with fake srun/deepspeed/torchrun on PATH)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("name", ["launch_multinode.sh", "launch_torchrun_multinode.sh", "launch_slurm.sbatch",
                                  "launch_1gpu.sh", "launch_8gpu.sh"])
def test_launchers_are_valid_bash(name):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / name)]).returncode == 0


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
    (bin_dir / name).chmod(0o755)


# what a fake launcher prints: its argv, one JSON list (so a test sees every argument exactly)
ARGV_JSON = 'python3 -c \'import json, sys; print("ARGV " + json.dumps(sys.argv[1:]))\' "$@"\n'

HARD_ARGS = ["train.output_dir=/shared/my runs/x", "logging.wandb_tags=[a, \"b c\"]", "data.filter={'level': 5}",
             "it's", "$HOME", "*", "a  b", ""]


def _argv(stdout: str) -> list[str]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("ARGV ")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0][5:])


def test_multinode_dry_run_masks_secrets_and_writes_nothing_here(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "HF_HOME": "/shared/hf",
           "MATHRL_CACHE": "/shared/mathrl", "NCCL_SOCKET_IFNAME": "eth0", "UNRELATED": "x",
           "HF_TOKEN": "hf_secret123", "WANDB_API_KEY": "wb_secret456", "MATHRL_LAUNCH_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(SCRIPTS / "launch_multinode.sh"), "hosts", "configs/grpo_math.yaml",
                          "train.output_dir=/shared/runs/x"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    body = lines[1:lines.index("# command")]
    assert body == ["HF_HOME=/shared/hf", "HF_TOKEN=<set>", "MATHRL_CACHE=/shared/mathrl", "NCCL_SOCKET_IFNAME=eth0",
                    "WANDB_API_KEY=<set>"]
    assert "secret" not in out.stdout
    assert "deepspeed --hostfile hosts --module mathrl.cli train configs/grpo_math.yaml" in out.stdout
    assert not (tmp_path / ".deepspeed_env").exists() and list(tmp_path.iterdir()) == []
    assert not Path(lines[0].split("=", 1)[1].split()[0]).exists()  # removed on exit


def test_multinode_env_file_is_private_and_outside_the_tree(tmp_path):
    """The launcher gets DS_ENV_FILE: a mode-600 file outside the work tree with the tokens the remote ranks
    need, removed when it exits; arguments reach it exactly; its exit status is the script's."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    work.mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".deepspeed_env").write_text("MY_SETTING=1\nHF_HOME=/old\n")
    _fake(bin_dir, "deepspeed", 'echo "FILE $DS_ENV_FILE"; stat -c "MODE %a" "$DS_ENV_FILE"\n'
                                'stat -c "DIRMODE %a" "$(dirname "$DS_ENV_FILE")"; sed "s/^/LINE /" "$DS_ENV_FILE"\n'
                                + ARGV_JSON + "exit 7\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path),
           "HF_HOME": "/shared/hf", "HF_TOKEN": "hf_secret123", "WANDB_API_KEY": "wb_secret456"}
    out = subprocess.run(["bash", str(SCRIPTS / "launch_multinode.sh"), "hosts", "c.yaml", *HARD_ARGS], cwd=work,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 7, out.stderr
    path = Path(next(ln for ln in out.stdout.splitlines() if ln.startswith("FILE "))[5:])
    assert "MODE 600" in out.stdout and "DIRMODE 700" in out.stdout
    assert work not in path.parents and not path.exists()  # outside the work tree, gone after the run
    body = [ln[5:] for ln in out.stdout.splitlines() if ln.startswith("LINE ")]
    assert body == ["MY_SETTING=1", "HF_HOME=/old", "HF_HOME=/shared/hf", "HF_TOKEN=hf_secret123",
                    "WANDB_API_KEY=wb_secret456"]  # DeepSpeed applies them in order: this script's values win
    assert _argv(out.stdout) == ["--hostfile", "hosts", "--module", "mathrl.cli", "train", "c.yaml", *HARD_ARGS]
    assert list(work.iterdir()) == []


def test_slurm_passes_arguments_exactly(tmp_path):
    """srun starts `bash -c` on every node; the overrides must reach torchrun unchanged (the old `$*` inside the
    command string re-split spaces and re-parsed quotes, braces, $ and *)."""
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "scontrol", 'printf "node0\\nnode1\\n"; seq 100000 | sed "s/^/node-extra-/"\n')  # a long list: a `| head` dies of SIGPIPE
    _fake(bin_dir, "srun", 'SLURM_NODEID=1 exec "$@"\n')  # one node's task
    _fake(bin_dir, "torchrun", ARGV_JSON)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "SLURM_JOB_NODELIST": "node[0-1]",
           "SLURM_NNODES": "2"}
    out = subprocess.run(["bash", str(SCRIPTS / "launch_slurm.sbatch"), "my config.yaml", *HARD_ARGS], cwd=tmp_path,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert _argv(out.stdout) == ["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "8", "--master_addr", "node0",
                                 "--master_port", "29500", "-m", "mathrl.cli", "train", "my config.yaml", *HARD_ARGS]
    assert list(tmp_path.iterdir()) == [bin_dir]


def test_torchrun_multinode_needs_its_variables(tmp_path):
    env = {"PATH": os.environ["PATH"], "MATHRL_LAUNCH_DRY_RUN": "1"}
    bad = subprocess.run(["bash", str(SCRIPTS / "launch_torchrun_multinode.sh"), "c.yaml"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "NNODES" in bad.stderr
    ok = subprocess.run(["bash", str(SCRIPTS / "launch_torchrun_multinode.sh"), "c.yaml"],
                        env={**env, "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "n0"}, capture_output=True, text=True)
    assert ok.returncode == 0 and "--nnodes 2 --node_rank 1" in ok.stdout


def test_multinode_passes_sigterm_to_the_launcher(tmp_path):
    """The script stays to remove the env file, so a TERM sent to it (a scheduler stopping the job) must reach
    DeepSpeed's runner, whose handler stops the remote ranks; the file is removed afterwards."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "deepspeed", f'trap \'echo got-term > {tmp_path}/term; exit 143\' TERM\n'
                                f'echo "$DS_ENV_FILE" > {tmp_path}/file; while :; do sleep 0.1; done\n')
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    p = subprocess.Popen(["bash", str(SCRIPTS / "launch_multinode.sh"), "hosts", "c.yaml"], cwd=tmp_path, env=env,
                         start_new_session=True)
    try:
        for _ in range(100):
            if (tmp_path / "file").exists():
                break
            time.sleep(0.1)
        env_file = Path((tmp_path / "file").read_text().strip())
        assert env_file.exists()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 143
        assert (tmp_path / "term").read_text().strip() == "got-term" and not env_file.exists()
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the script and its fake launcher, if a failure left them running
        except ProcessLookupError:
            pass
