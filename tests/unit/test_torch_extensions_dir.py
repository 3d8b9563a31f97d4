"""DeepSpeed's just-in-time ops are built per Python environment: importing mathrl points
TORCH_EXTENSIONS_DIR at a folder keyed by sys.prefix (a user's value wins), so .venv and .venv-vllm stop
rebuilding each other's shm-comm op at every start."""

import os
import subprocess
import sys
from pathlib import Path

import mathrl

REPO = Path(__file__).resolve().parents[2]
PROBE = "import os, mathrl; print(os.environ['TORCH_EXTENSIONS_DIR'])"


def _probe(python: str, inherit: bool = False, **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if inherit or k not in ("TORCH_EXTENSIONS_DIR", "MATHRL_TORCH_EXTENSIONS_DIR")}
    out = subprocess.run([python, "-c", PROBE], env={**base, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_one_folder_per_environment(tmp_path):
    a = mathrl.torch_extensions_dir("/envs/a", home=str(tmp_path))
    b = mathrl.torch_extensions_dir("/envs/b", home=str(tmp_path))
    assert a != b and Path(a).parent == Path(b).parent == tmp_path / "torch_extensions"
    assert a == mathrl.torch_extensions_dir("/envs/a", home=str(tmp_path))  # stable across starts


def test_import_sets_it_and_a_users_value_wins(tmp_path):
    got = _probe(sys.executable, XDG_CACHE_HOME=str(tmp_path))
    assert got == mathrl.torch_extensions_dir(sys.prefix, home=str(tmp_path))
    assert _probe(sys.executable, TORCH_EXTENSIONS_DIR="/mine") == "/mine"


def test_the_vllm_environment_gets_another_folder(tmp_path):
    vpy = REPO / ".venv-vllm" / "bin" / "python"
    if not vpy.exists():
        import pytest
        pytest.skip("no .venv-vllm")
    assert _probe(str(vpy), XDG_CACHE_HOME=str(tmp_path)) != _probe(sys.executable, XDG_CACHE_HOME=str(tmp_path))
    # started from this process (which imported mathrl and so set its own folder): replaced, not inherited
    assert os.environ["TORCH_EXTENSIONS_DIR"] == mathrl.torch_extensions_dir(sys.prefix)
    assert _probe(str(vpy), inherit=True) == mathrl.torch_extensions_dir(str(vpy.parent.parent))
    # a user's own value still wins in the child
    assert _probe(str(vpy), inherit=True, TORCH_EXTENSIONS_DIR="/mine") == "/mine"
