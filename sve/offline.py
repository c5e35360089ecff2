"""Working without a network: ask once whether the Hugging Face Hub answers, and if it does not, read only the
local caches. Without this, every download (timm weights, a Hugging Face model, tokenizer or dataset) retries
each file for half a minute and logs every try before the loader's own error; with it, a missing file fails
at once and the error says which key to set instead (a local path, ``pretrained=false``, ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from urllib.parse import urlparse

TRUE = ("1", "true", "yes")
OFFLINE_HINT = (
    "the Hugging Face Hub did not answer from this machine, so only the local cache was read "
    "(HF_HUB_OFFLINE=1 skips the check)"
)


def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hub (``HF_ENDPOINT``) answers a TCP connection; no request is made. False at once when
    ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set."""
    if (
        os.environ.get("HF_HUB_OFFLINE", "0").lower() in TRUE
        or os.environ.get("HF_DATASETS_OFFLINE", "0").lower() in TRUE
    ):
        return False
    return endpoint_answers(timeout)


def endpoint_answers(timeout: float = 5.0) -> bool:
    """Whether the Hub's host (``HF_ENDPOINT``) answers a TCP connection, whatever the offline variables say."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


@contextmanager
def hub_offline(offline: bool):
    """The Hugging Face libraries in offline mode (the local cache only) while it lasts, when ``offline``."""
    if not offline:
        yield
        return
    import huggingface_hub.constants

    try:
        import datasets.config
    except ImportError:  # pragma: no cover - a dependency
        datasets = None
    saved = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE if datasets else None
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    if datasets:
        datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE = saved[0]
        if datasets:
            datasets.config.HF_HUB_OFFLINE = saved[1]
