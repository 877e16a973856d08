"""Finding backbone weights offline: ``--weights v1|v2|TAG|random|PATH``.

Order of search for torchvision weights (``v1`` = ``IMAGENET1K_V1``, the papers' choice):

1. the torch hub cache, ``torch.hub.get_dir()/checkpoints/<file>``, where ``<file>`` is the
   last part of the weights enum's url (``resnet50-0676ba61.pth`` for ResNet-50 V1);
2. a download through torch hub into that directory (skipped when ``$FEATCACHE_OFFLINE`` is set);
3. otherwise one error naming the file, the directory to put it in, and the url.

A file found by name is checked against the hash prefix in its name (as torch hub does), so a
truncated download is caught.

timm and open_clip weights are a pretrained tag of the library (``augreg2_in21k_ft_in1k``,
``openai``, ...), looked up the same way in the Hugging Face hub cache
(:mod:`featcache.backbones.hub`): the cached file, else a download into that cache (not with
``$FEATCACHE_OFFLINE``), else one error naming the file, where it goes and how to get it.

The identity recorded in features files is the weights name, the file name and its sha256 (and
the hub repository); ``random`` records the seed and a digest of the initial parameters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from featcache.backbones import hub
from featcache.errors import InputError, OptionError, plural
from featcache.fileio import sha256_file

OFFLINE_ENV = hub.OFFLINE_ENV
_HASH_IN_NAME = re.compile(r"-([a-f0-9]{6,})\.")


@dataclass(frozen=True)
class WeightsSource:
    """Where a backbone's weights come from.

    ``kind`` is ``torchvision`` (a named torchvision checkpoint), ``hub`` (a timm or open_clip
    pretrained tag, kept in the Hugging Face hub cache: ``repo`` and the file names ``files``
    tried in order), ``file`` (any other checkpoint file) or ``random``; ``name`` is the
    torchvision member name or library tag, ``file`` or ``random``; ``tag`` is the suffix that
    keeps features files of different weights apart ('' for the backbone's default weights).
    """

    kind: str
    name: str
    tag: str
    path: Path | None = None
    url: str = ""
    sha256: str = ""
    seed: int = 0
    repo: str = ""
    files: tuple[str, ...] = ()

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
        if self.repo:
            out["weights_repo"] = self.repo
        if self.kind == "random":
            out["weights_seed"] = self.seed
        return out


def url_file_name(url: str) -> str:
    """The file name torch hub stores a url under (its last path component)."""
    return os.path.basename(urlparse(url).path)


def hub_checkpoint_dir() -> Path:
    """``torch.hub.get_dir()/checkpoints`` (moved by ``$TORCH_HOME``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def describe_weights(spec, value: str | None = None, seed: int = 0) -> WeightsSource:
    """Parse ``--weights`` (None: the backbone's default) without touching the network or the
    hub cache.

    ``file`` sources are hashed here (a file that names a torchvision checkpoint and carries its
    hash counts as those torchvision weights); torchvision and hub sources get their sha256
    from :func:`locate_weights`.
    """
    value = spec.default_weights if value is None else str(value).strip()
    if not value:
        raise OptionError("--weights is empty; choose " + ", ".join(_choices(spec))
                          + " or a path to a checkpoint")
    if value.lower() == "random":
        return WeightsSource("random", "random", "random" if seed == 0 else f"random{seed}", seed=seed)
    if spec.library != "torchvision":
        return _describe_hub_weights(spec, value)
    member = spec.weights_member(value)
    if member is not None and not Path(value).exists():
        return WeightsSource("torchvision", member.name, _tag(spec, member.name), url=member.url)
    path = Path(value).expanduser()
    if not path.exists():
        if os.sep in value or path.suffix:
            raise InputError(f"weights file {path} does not exist; give the path to a checkpoint "
                             "(.pth) or one of " + ", ".join(_choices(spec)))
        raise OptionError(f"unknown --weights {value!r} for {spec.name}; choose "
                          + ", ".join(_choices(spec)) + " or a checkpoint path")
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

    Torchvision weights are looked up in the torch hub cache, timm and open_clip weights in the
    Hugging Face hub cache, then downloaded there (unless ``download`` is False or
    ``$FEATCACHE_OFFLINE`` is set); when neither works the error says which file to put where.
    """
    if source.kind == "hub" and source.path is None:
        return _locate_hub_weights(source, download)
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


def resolve_weights(spec, value: str | None = None, seed: int = 0, download: bool | None = None) -> WeightsSource:
    """:func:`describe_weights` then :func:`locate_weights`: a source ready to load."""
    return locate_weights(describe_weights(spec, value, seed), download=download)


def load_state_dict(net: nn.Module, path: Path) -> None:
    """Load the checkpoint ``path`` into the full torchvision network ``net``.

    Accepts a plain state dict or one under ``state_dict``/``model``, with or without a
    ``module.`` prefix (DataParallel); the classifier (``fc.*``) may be absent. Any other
    missing or unexpected key is an error naming the keys.
    """
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
            problems.append(f"missing {plural(len(missing), 'key')} (first: {', '.join(missing[:3])})")
        if result.unexpected_keys:
            extra = result.unexpected_keys
            problems.append(f"{plural(len(extra), 'unexpected key')} (first: {', '.join(extra[:3])})")
        raise InputError(f"weights file {path} does not fit the {type(net).__name__} backbone: "
                         + "; ".join(problems))


def _choices(spec) -> list[str]:
    if spec.library == "torchvision":
        return spec.weights_names() + ["random"]
    return [spec.default_weights, "random", "another pretrained tag of the library"]


def _describe_hub_weights(spec, value: str) -> WeightsSource:
    """A timm/open_clip pretrained tag, or a checkpoint file."""
    path = Path(value).expanduser()
    if path.is_file():
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("_") or "file"
        return WeightsSource("file", "file", stem, path=path, sha256=sha256_file(path))
    if os.sep in value or path.suffix in (".pt", ".pth", ".bin", ".safetensors", ".npz"):
        raise InputError(f"weights file {path} does not exist; give the path to a checkpoint or "
                         f"one of {spec.name}'s pretrained tags (default {spec.default_weights})")
    known = spec.weights_names()
    if value not in known:
        shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        raise OptionError(f"unknown --weights {value!r} for {spec.name} ({spec.library} "
                          f"{spec.model}); choose random, a checkpoint path or a pretrained tag: "
                          f"{shown or 'none published'}")
    repo, files = spec.family.hub_files(spec, value)
    tag = "" if value == spec.default_weights else re.sub(r"[^A-Za-z0-9._-]+", "_", value)
    return WeightsSource("hub", value, tag, url=hub.hub_url(repo, files[0]), repo=repo,
                         files=tuple(files))


def _locate_hub_weights(source: WeightsSource, download: bool | None) -> WeightsSource:
    """The hub cache's file for a pretrained tag (downloaded there when allowed)."""
    path = hub.cached_file(source.repo, source.files)
    offline = hub.offline_hub()
    if download is None:
        download = not offline
    if path is None:
        if not download:
            raise _missing_hub_weights(source, f"${OFFLINE_ENV} is set" if offline
                                       else "downloads are off")
        try:
            path = hub.download_file(source.repo, source.files)
        except OSError as exc:
            raise _missing_hub_weights(source, f"download failed: {exc}") from exc
    return WeightsSource(source.kind, source.name, source.tag, path=path,
                         url=hub.hub_url(source.repo, path.name), sha256=sha256_file(path),
                         seed=source.seed, repo=source.repo, files=source.files)


def _missing_hub_weights(source: WeightsSource, why: str) -> InputError:
    first = source.files[0]
    return InputError(
        f"weights {source.name!r} ({source.repo}) are not on this machine ({why}). Put {first} of "
        f"the Hugging Face repository {source.repo} into the hub cache, at "
        f"{hub.cache_location(source.repo, first)} (e.g. `hf download {source.repo} {first}` on "
        f"a machine with internet, then copy {hub.hub_cache_dir()}; $HF_HOME or $HF_HUB_CACHE "
        f"move it), or download {hub.hub_url(source.repo, first)} and pass --weights "
        f"/path/to/{first}"
    )


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
