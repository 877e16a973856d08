"""Finding backbone weights offline: ``--weights v1|v2|random|PATH``.

Order of search for torchvision weights (``v1`` = ``IMAGENET1K_V1``, the papers' choice):

1. the torch hub cache, ``torch.hub.get_dir()/checkpoints/<file>``, where ``<file>`` is the
   last part of the weights enum's url (``resnet50-0676ba61.pth`` for ResNet-50 V1);
2. a download through torch hub into that directory (skipped when ``$FEATCACHE_OFFLINE`` is set);
3. otherwise one error naming the file, the directory to put it in, and the url.

A file found by name is checked against the hash prefix in its name (as torch hub does), so a
truncated download is caught. The identity recorded in features files is the weights name, the
file name and its sha256; ``random`` records the seed and a digest of the initial parameters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from featcache.errors import InputError, OptionError
from featcache.fileio import sha256_file

OFFLINE_ENV = "FEATCACHE_OFFLINE"
_HASH_IN_NAME = re.compile(r"-([a-f0-9]{6,})\.")


@dataclass(frozen=True)
class WeightsSource:
    """Where a backbone's weights come from.

    ``kind`` is ``torchvision`` (a named torchvision checkpoint), ``file`` (any other checkpoint
    file) or ``random``; ``name`` is the torchvision member name, ``file`` or ``random``;
    ``tag`` is the suffix that keeps features files of different weights apart ('' for the
    backbone's default weights).
    """

    kind: str
    name: str
    tag: str
    path: Path | None = None
    url: str = ""
    sha256: str = ""
    seed: int = 0

    @property
    def file_name(self) -> str:
        if self.path is not None:
            return self.path.name
        return url_file_name(self.url) if self.url else ""

    def identity(self) -> dict:
        """Attributes recorded in a features file (no None values: HDF5 cannot store them)."""
        out = {"weights": self.name, "weights_file": self.file_name, "weights_sha256": self.sha256}
        if self.url:
            out["weights_url"] = self.url
        if self.kind == "random":
            out["weights_seed"] = self.seed
        return out


def url_file_name(url: str) -> str:
    """The file name torch hub stores a url under (its last path component)."""
    return os.path.basename(urlparse(url).path)


def hub_checkpoint_dir() -> Path:
    """``torch.hub.get_dir()/checkpoints`` (moved by ``$TORCH_HOME``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def describe_weights(spec, value: str, seed: int = 0) -> WeightsSource:
    """Parse ``--weights`` without touching the network or the hub cache.

    ``file`` sources are hashed here (a file that names a torchvision checkpoint and carries its
    hash counts as those torchvision weights); torchvision sources get their sha256 from
    :func:`locate_weights`.
    """
    value = str(value).strip()
    if not value:
        raise OptionError("--weights is empty; choose v1, v2, random or a path to a checkpoint")
    if value.lower() == "random":
        return WeightsSource("random", "random", "random" if seed == 0 else f"random{seed}", seed=seed)
    member = spec.weights_member(value)
    if member is not None and not Path(value).exists():
        return WeightsSource("torchvision", member.name, _tag(spec, member.name), url=member.url)
    path = Path(value).expanduser()
    if not path.exists():
        if os.sep in value or path.suffix:
            raise InputError(f"weights file {path} does not exist; give the path to a checkpoint "
                             "(.pth) or one of " + ", ".join(spec.weights_names() + ["random"]))
        raise OptionError(f"unknown --weights {value!r} for {spec.name}; choose "
                          + ", ".join(spec.weights_names() + ["random"]) + " or a checkpoint path")
    if not path.is_file():
        raise InputError(f"weights path {path} is not a file")
    digest = sha256_file(path)
    known = _torchvision_member_for(spec, path.name, digest)
    if known is not None:
        return WeightsSource("torchvision", known.name, _tag(spec, known.name), path=path,
                             url=known.url, sha256=digest)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("_") or "file"
    return WeightsSource("file", "file", stem, path=path, sha256=digest)


def locate_weights(source: WeightsSource, download: bool | None = None) -> WeightsSource:
    """Return ``source`` with the checkpoint's path and sha256 filled in.

    Torchvision weights are looked up in the hub cache, then downloaded there (unless
    ``download`` is False or ``$FEATCACHE_OFFLINE`` is set); when neither works the error says
    which file to put where.
    """
    if source.kind != "torchvision" or source.path is not None:
        return source
    name = url_file_name(source.url)
    target = hub_checkpoint_dir() / name
    if download is None:
        download = not os.environ.get(OFFLINE_ENV)
    if not target.exists():
        if not download:
            raise _missing_weights(source, target, f"${OFFLINE_ENV} is set" if os.environ.get(
                OFFLINE_ENV) else "downloads are off")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(source.url, str(target), hash_prefix=_hash_prefix(name),
                                           progress=True)
        except Exception as exc:  # URLError, HTTPError, OSError, hash mismatch: all mean "not here"
            raise _missing_weights(source, target, f"download failed: {exc}") from exc
    digest = sha256_file(target)
    prefix = _hash_prefix(name)
    if prefix and not digest.startswith(prefix):
        raise InputError(
            f"weights file {target} is corrupt or truncated (its sha256 starts with {digest[:8]}, "
            f"its name says {prefix}); delete it and download {source.url} again"
        )
    return WeightsSource(source.kind, source.name, source.tag, path=target, url=source.url,
                         sha256=digest, seed=source.seed)


def resolve_weights(spec, value: str, seed: int = 0, download: bool | None = None) -> WeightsSource:
    """:func:`describe_weights` then :func:`locate_weights`: a source ready to load."""
    return locate_weights(describe_weights(spec, value, seed), download=download)


def load_state_dict(net: nn.Module, source: WeightsSource) -> None:
    """Load ``source``'s checkpoint into the full torchvision network ``net``.

    Accepts a plain state dict or one under ``state_dict``/``model``, with or without a
    ``module.`` prefix (DataParallel); the classifier (``fc.*``) may be absent. Any other
    missing or unexpected key is an error naming the keys.
    """
    path = source.path
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and tensor errors all mean an unreadable checkpoint
        raise InputError(f"cannot read weights file {path}: {exc}") from exc
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not state:
        raise InputError(f"weights file {path} holds no state dict (got {type(state).__name__})")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    result = net.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("fc.")]
    if missing or result.unexpected_keys:
        problems = []
        if missing:
            problems.append(f"missing {len(missing)} keys (first: {', '.join(missing[:3])})")
        if result.unexpected_keys:
            extra = result.unexpected_keys
            problems.append(f"{len(extra)} unexpected keys (first: {', '.join(extra[:3])})")
        raise InputError(f"weights file {path} does not fit the {type(net).__name__} backbone: "
                         + "; ".join(problems))


def _tag(spec, member_name: str) -> str:
    default = spec.weights_member(spec.default_weights)
    if default is not None and default.name == member_name:
        return ""
    for alias, name in spec.weights_aliases.items():
        if name == member_name:
            return alias
    return member_name.lower()


def _hash_prefix(file_name: str) -> str:
    match = _HASH_IN_NAME.search(file_name)
    return match.group(1) if match else ""


def _torchvision_member_for(spec, file_name: str, digest: str):
    """The torchvision member whose checkpoint ``file_name`` (with matching hash) is, or None."""
    for member in spec.weights_enum:
        if url_file_name(member.url) == file_name:
            prefix = _hash_prefix(file_name)
            if prefix and digest.startswith(prefix):
                return member
    return None


def _missing_weights(source: WeightsSource, target: Path, why: str) -> InputError:
    return InputError(
        f"{source.name} weights are not on this machine ({why}). Download {source.url} "
        f"and put it at {target} (the torch hub cache; $TORCH_HOME moves it), or pass "
        f"--weights /path/to/{target.name}"
    )
