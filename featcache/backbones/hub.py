"""The optional libraries (timm, open_clip) and the Hugging Face hub cache their weights live in.

``timm`` and ``open_clip_torch`` are the ``backbones`` extra (``pip install
featcache[backbones]``); :func:`require` imports one or raises one error that says so, and
:func:`library_installed` looks one up without importing it (``featcache backbones``).

Weights of timm and open_clip models are files in Hugging Face hub repositories
(``timm/<model>.<tag>``: ``model.safetensors``; open_clip: ``open_clip_model.safetensors``).
:func:`cached_file` finds them in the hub cache without touching the network
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when called);
:func:`download_file` fetches one into that cache with a progress bar, and is never called when
``$FEATCACHE_OFFLINE`` is set. :func:`offline_hub` sets ``HF_HUB_OFFLINE=1`` whenever
``$FEATCACHE_OFFLINE`` is set, so that no library call waits on retries (46 s) to learn that
there is no network.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from featcache.environment import OFFLINE
from featcache.errors import OptionError

OFFLINE_ENV = "FEATCACHE_OFFLINE"
EXTRA = "backbones"
INSTALL_HINT = f"pip install 'featcache[{EXTRA}]'"


def offline_hub() -> bool:
    """True when downloads are off (``$FEATCACHE_OFFLINE``); then ``HF_HUB_OFFLINE=1`` is set too."""
    offline = bool(OFFLINE.value(False))
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    return offline


def require(library: str, backbone: str = "", package: str = ""):
    """Import ``library`` (``timm`` or ``open_clip``); one OptionError naming the extra (and the
    ``package`` that provides it) if absent."""
    offline_hub()  # before the first import of huggingface_hub, which reads it once
    try:
        return importlib.import_module(library)
    except ImportError as exc:
        who = f"backbone {backbone!r} needs" if backbone else "this needs"
        raise OptionError(f"{who} the {package or library} package, which is not "
                          f"installed ({exc}); install the optional backbones with: {INSTALL_HINT}") from None


def library_installed(library: str) -> bool:
    """Whether ``library`` can be imported here (looked up, not imported)."""
    return importlib.util.find_spec(library) is not None


def library_version(library: str) -> str:
    """The installed version of ``library``, or '' when it is not installed."""
    try:
        return str(importlib.import_module(library).__version__)
    except ImportError:
        return ""


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def torch_hub_dir() -> Path:
    """torch hub's directory as ``torch.hub.get_dir()`` gives it in a process that never called
    ``torch.hub.set_dir`` (``$TORCH_HOME/hub``, ``$TORCH_HOME`` defaulting to
    ``$XDG_CACHE_HOME/torch``), without importing torch: for listings that only look."""
    cache = os.environ.get("XDG_CACHE_HOME", os.path.join("~", ".cache"))
    return Path(os.path.expanduser(os.environ.get("TORCH_HOME", os.path.join(cache, "torch")))) / "hub"


def hub_url(repo: str, filename: str) -> str:
    return f"https://huggingface.co/{repo}/resolve/main/{filename}"


def cached_file(repo: str, filenames: tuple[str, ...]) -> Path | None:
    """The first of ``filenames`` of hub repository ``repo`` present in the hub cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        found = try_to_load_from_cache(repo, filename, cache_dir=str(hub_cache_dir()))
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    return None


#: proxies that only a request through them can test (then :func:`hub_unreachable` does not probe)
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the hub's host (``$HF_ENDPOINT``, else huggingface.co) cannot be reached, or None
    when it accepts a connection within ``timeout`` seconds (or a proxy is set). Asked before a
    download, so that a machine without network fails at once, not after the library's
    retries (tens of seconds)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"{host} cannot be reached: {exc.strerror or exc}"
    return None


def download_file(repo: str, filenames: tuple[str, ...]) -> Path:
    """Download the first of ``filenames`` that ``repo`` has into the hub cache (with progress);
    OSError at once when the hub cannot be reached."""
    from huggingface_hub import hf_hub_download

    unreachable = hub_unreachable()
    if unreachable is not None:
        raise OSError(f"{unreachable} (no network? set ${OFFLINE_ENV}=1 to never try)")
    errors = []
    for filename in filenames:
        try:
            return Path(hf_hub_download(repo, filename, cache_dir=str(hub_cache_dir())))
        except Exception as exc:  # missing entry, no network, HTTP errors: try the next name
            errors.append(f"{filename}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise OSError("; ".join(errors))


def cache_location(repo: str, filename: str) -> Path:
    """Where the hub cache keeps ``filename`` of ``repo`` (for messages)."""
    return hub_cache_dir() / f"models--{repo.replace('/', '--')}" / "snapshots" / "<revision>" / filename
