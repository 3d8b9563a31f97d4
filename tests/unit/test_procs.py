"""mathrl.procs: the process-group variables and the /proc helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from mathrl.procs import DIST_ENV_VARS, child_pids, child_processes, cmdline, proc_state, status_kb, without_dist_env

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")


def test_without_dist_env_drops_exactly_the_process_group_variables():
    env = {"PATH": "/bin", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "1"}
    assert without_dist_env(env) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert set(DIST_ENV_VARS) == set(env) - {"PATH", "OMP_NUM_THREADS"}
    assert "RANK" in env  # the input is not changed
    assert without_dist_env() == {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}


def test_child_scan_sees_a_child_and_its_zombie():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.pid in child_pids()
        assert b"time.sleep(30)" in cmdline(proc.pid)
        assert status_kb(proc.pid, "VmRSS") > 0 and status_kb("self", "VmRSS") > 0
        assert proc_state(proc.pid) not in (None, "Z")
        assert proc.pid not in child_pids(os.getppid())  # a grandchild of our parent, not its child
        proc.kill()
        deadline = time.monotonic() + 10
        while proc_state(proc.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (proc.pid, "Z") in child_processes()  # killed, not reaped: a zombie
        assert proc.pid not in child_pids() and proc.pid in child_pids(zombies=True)
    finally:
        proc.kill()
        proc.wait()
    assert proc_state(proc.pid) is None and cmdline(proc.pid) == b"" and status_kb(proc.pid, "VmRSS") == 0
    assert proc.pid not in child_pids(zombies=True)
