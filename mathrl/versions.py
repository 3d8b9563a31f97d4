"""The oldest versions of the engines mathrl's code really needs, checked when a run starts.

pip's floors in ``pyproject.toml`` say the same, but an environment can still hold an older build
(installed before mathrl, or pinned by another package); such a run would fail deep inside DeepSpeed
or transformers with an error that does not name the cause. :func:`check_versions` fails at start
with one line naming the package, the installed and the needed version, and the fix.

Why each floor:

* ``deepspeed >= 0.19.4``: the ``managed_gradient_accumulation: false`` switch (caller-owned
  gradient accumulation with a varying number of token-budgeted micro-batches per step) first
  appears in DeepSpeed 0.19.4; older versions ignore the key and manage accumulation themselves.
* ``transformers >= 4.56``: ``from_pretrained(dtype=...)``, ``logits_to_keep`` and
  ``DynamicCache(config=...)`` with ``batch_repeat_interleave`` (the shared-prompt forward).
* ``torch >= 2.5``: the ``torch.serialization.safe_globals`` context (checkpoints loaded with
  ``weights_only=True``).
"""

from __future__ import annotations

import re
from importlib import metadata

MINIMUM: dict[str, str] = {"deepspeed": "0.19.4", "transformers": "4.56", "torch": "2.5"}


def parse_version(v: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); pre-release and local parts are ignored."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def check_versions(packages: dict[str, str] | None = None) -> None:
    """Raise :class:`mathrl.config.ConfigError` when an installed engine is older than mathrl needs."""
    from mathrl.config import ConfigError

    for name, floor in (packages or MINIMUM).items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise ConfigError(f"{name} is not installed; mathrl needs {name}>={floor}: "
                              f"pip install '{name}>={floor}'") from None
        if parse_version(have) < parse_version(floor):
            raise ConfigError(f"{name} {have} is installed but mathrl needs {name}>={floor} (see mathrl/versions.py "
                              f"for why); fix: pip install -U '{name}>={floor}'")
