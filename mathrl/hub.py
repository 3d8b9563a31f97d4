"""Reaching the Hugging Face hub: detect a machine without network once, then stay offline.

On an offline machine every hub lookup by transformers, huggingface_hub or datasets retries with
backoff (``Retrying in 8s``) for half a minute or more before it fails, and a model already in the
local cache is not used until then. :func:`offline_if_unreachable` tries one TCP connection to the
hub's host (``$HF_ENDPOINT``, default ``https://huggingface.co``) with a short timeout; when it fails,
the process switches the libraries to their offline mode (as ``HF_HUB_OFFLINE=1`` would), says so
once, and the lookup answers at once from the local cache, or fails at once with the caller's hint.
"""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlparse

__all__ = ["offline_if_unreachable"]

_STATE: dict[str, bool] = {}


def _endpoint() -> tuple[str, int]:
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def _already_offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


def _go_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # child processes and libraries imported later
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:  # libraries already imported read their module constant
        import huggingface_hub.constants as hc

        hc.HF_HUB_OFFLINE = True
    except ImportError:  # pragma: no cover
        pass
    mod = sys.modules.get("datasets.config")
    if mod is not None:
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            if hasattr(mod, name):
                setattr(mod, name, True)


def offline_if_unreachable(what: str, timeout: float = 3.0) -> bool:
    """Whether the hub is unreachable (offline mode on); checked once per process. ``what`` names the item
    being looked up, for the one note printed when the process goes offline."""
    if _already_offline():
        return True
    if "reachable" not in _STATE:
        host, port = _endpoint()
        try:
            with socket.create_connection((host, port), timeout=timeout):
                _STATE["reachable"] = True
        except OSError as exc:
            _STATE["reachable"] = False
            _go_offline()
            print(f"mathrl: the Hugging Face hub ({host}:{port}) is not reachable ({type(exc).__name__}); looking "
                  f"up {what} in the local cache only (HF_HUB_OFFLINE=1)", file=sys.stderr, flush=True)
    return not _STATE["reachable"]
