"""mathrl: verifiable-reward reinforcement learning for math reasoning.

Pipeline (see docs/architecture.md): data -> rollout -> reward -> advantage -> loss -> update;
eval reads checkpoints. Each stage is a subpackage.
"""

import hashlib as _hashlib
import os as _os
import sys as _sys

__version__ = "0.1.0"


def torch_extensions_dir(prefix: str = _sys.prefix, home: str | None = None) -> str:
    """The folder DeepSpeed's just-in-time ops (CPU shared-memory collectives, CPU Adam) are built into:
    one per Python environment. torch's default (``~/.cache/torch_extensions/py311_cpu``) is shared by every
    environment of one Python version, and an op built by another environment (``.venv`` and ``.venv-vllm``,
    which both hold DeepSpeed; two clones) is rebuilt at the next start, minutes on a small machine, each
    start waiting on the other's build lock."""
    root = home or _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    tag = _hashlib.sha1(_os.path.realpath(prefix).encode()).hexdigest()[:12]
    return _os.path.join(root, "torch_extensions", f"mathrl-{tag}")


# A user's TORCH_EXTENSIONS_DIR wins. A value set by mathrl (marked in MATHRL_TORCH_EXTENSIONS_DIR) in a parent
# process of another environment (the trainer's tests starting .venv-vllm's python) is replaced, not inherited.
if _os.environ.get("TORCH_EXTENSIONS_DIR") in (None, _os.environ.get("MATHRL_TORCH_EXTENSIONS_DIR")):
    _os.environ["TORCH_EXTENSIONS_DIR"] = _os.environ["MATHRL_TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
