"""Families whose weights are pretrained tags kept in the Hugging Face hub cache (timm and
open_clip): :class:`HubFamily`, the part they share.

``--weights TAG`` names a pretrained tag of the library: its file is looked up in the hub cache
(:mod:`featcache.backbones.hub`), else downloaded there (not with ``$FEATCACHE_OFFLINE``), else
one error names the file, where it goes and how to get it. A subclass says which tags exist
(``tags``), which hub repository and files hold one (``hub_files``) and how to build a trunk.
"""

from __future__ import annotations

import os
import re
from abc import abstractmethod
from pathlib import Path

from featcache.backbones import hub
from featcache.backbones.family import BackboneFamily, BackboneSpec
from featcache.backbones.preprocess import Preprocess
from featcache.backbones.weightsource import WeightsSource, file_sha256, file_source
from featcache.errors import InputError, OptionError

#: the kind of a pretrained tag's source (:class:`~featcache.backbones.weightsource.WeightsSource`)
HUB = "hub"
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz")


class HubFamily(BackboneFamily):
    """A library whose pretrained weights live in Hugging Face hub repositories."""

    @abstractmethod
    def hub_files(self, spec: BackboneSpec, tag: str) -> tuple[str, tuple[str, ...]]:
        """(hub repository, file names tried in order) of pretrained weights ``tag``."""

    def spec(self, name: str, model: str, weights: str, dim: int, preprocess: Preprocess,
             image_size: int, patch_size: int, pooling: str, summary: str,
             **extra) -> BackboneSpec:
        """One backbone of this library (channels-last only for convolutional nets)."""
        return BackboneSpec(
            name=name, dim=dim, library=self.name, model=model, default_weights=weights,
            preprocess=preprocess, default_image_size=image_size, patch_size=patch_size,
            pooling=pooling, channels_last=not patch_size, summary=summary, **extra,
        )

    def require(self, spec: BackboneSpec):
        """The library, imported now; one OptionError naming the extra when it is missing."""
        return hub.require(self.name, spec.name, self.package)

    def weights_choices(self, spec: BackboneSpec) -> list[str]:
        return [spec.default_weights, "random", "another pretrained tag of the library"]

    def describe_weights(self, spec: BackboneSpec, value: str) -> WeightsSource:
        """A pretrained tag, or a checkpoint file."""
        path = Path(value).expanduser()
        if path.is_file():
            return file_source(path, self.name)
        if os.sep in value or path.suffix in _CHECKPOINT_SUFFIXES:
            raise InputError(f"weights file {path} does not exist; give the path to a checkpoint or "
                             f"one of {spec.name}'s pretrained tags (default {spec.default_weights})")
        known = spec.weights_names()
        if value not in known:
            shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
            raise OptionError(f"unknown --weights {value!r} for {spec.name} ({spec.library} "
                              f"{spec.model}); choose random, a checkpoint path or a pretrained tag: "
                              f"{shown or 'none published'}")
        repo, files = self.hub_files(spec, value)
        tag = "" if value == spec.default_weights else re.sub(r"[^A-Za-z0-9._-]+", "_", value)
        return WeightsSource(HUB, value, tag, url=hub.hub_url(repo, files[0]), repo=repo,
                             files=tuple(files), library=self.name)

    def locate_weights(self, source: WeightsSource, download: bool | None) -> WeightsSource:
        """The hub cache's file for a pretrained tag (downloaded there when allowed)."""
        path = hub.cached_file(source.repo, source.files)
        offline = hub.offline_hub()
        if download is None:
            download = not offline
        if path is None:
            if not download:
                raise _missing_hub_weights(source, f"${hub.OFFLINE_ENV} is set" if offline
                                           else "downloads are off")
            try:
                path = hub.download_file(source.repo, source.files)
            except OSError as exc:
                raise _missing_hub_weights(source, f"download failed: {exc}") from exc
        return WeightsSource(source.kind, source.name, source.tag, path=path,
                             url=hub.hub_url(source.repo, path.name), sha256=file_sha256(path),
                             seed=source.seed, repo=source.repo, files=source.files,
                             library=source.library)

    def cache_entry(self, source: WeightsSource) -> dict:
        return {"hub_repo": source.repo, "hub_files": list(source.files)}

    def provenance(self, spec: BackboneSpec, preprocess: str) -> dict:
        return {
            "library": self.name, "library_model": spec.model,
            "library_version": hub.library_version(self.name),
            "preprocess": preprocess, "pooling": spec.pooling,
            "attention": "torch.nn.functional.scaled_dot_product_attention"
                         if spec.patch_size else "none (convolutional)",
        }


def pretrained_tag(source: WeightsSource | None) -> str | None:
    """The library's tag of a pretrained source (None: random weights or a checkpoint file)."""
    return source.name if source is not None and source.kind == HUB else None


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
