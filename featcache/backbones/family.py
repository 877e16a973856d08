"""Backbone families: what one library module provides (:class:`BackboneFamily`), the entry of
one backbone (:class:`BackboneSpec`) and the trunk every family builds (:class:`Trunk`).

A family is one module of this package whose name ends in ``_nets`` and that defines
``FAMILY``, an instance of a :class:`BackboneFamily` subclass: ``torchvision_nets`` (the
ResNets), ``timm_nets`` (ViT, ConvNeXt, DINOv2) and ``openclip_nets`` (CLIP and SigLIP towers,
with their text towers). :func:`families` finds them by listing the package (a new library is
one new file); nothing outside a family's module compares library names: the registry, the
weights lookup, the rebuild of a run's backbone and stage one's provenance ask the spec's family.
A family imports its optional library only when it needs it (``hub.require``).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from featcache.backbones import hub
from featcache.backbones.preprocess import PROTOCOL, Preprocess
from featcache.backbones.weightsource import WeightsSource
from featcache.discovery import import_modules_of
from featcache.errors import OptionError

DEFAULT_IMAGE_SIZE = 448
#: the suffix of a family module's name (``featcache/backbones/<library>_nets.py``)
FAMILY_SUFFIX = "_nets"


class Trunk(nn.Module):
    """A backbone cut down to pooled features: ``trunk(x)`` maps a normalised batch
    (B, 3, s, s) to (B, D), :meth:`feature_map` gives (B, D, h, w) in the same space.

    :func:`~featcache.backbones.registry.create_backbone` sets ``weights_identity`` (what
    features files record), ``pooling`` (how the pooled feature relates to the map) and
    ``image_size``.
    """

    weights_identity: dict
    pooling: str
    image_size: int

    def feature_map(self, x: Tensor) -> Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class BackboneSpec:
    """What featcache needs to know about one backbone.

    ``library`` names its family (:class:`BackboneFamily`), which reads the fields it needs.
    torchvision entries: ``build`` makes the network with random weights, ``trunk`` cuts it
    down to pooled features (default: the family's), ``weights_enum`` is torchvision's weights
    enum (its urls name the checkpoint files) and ``weights_aliases`` maps short names (``v1``)
    to its members. timm and open_clip entries: ``model`` is the library's model name and
    ``default_weights`` its pretrained tag (``augreg2_in21k_ft_in1k``, ``openai``, ...;
    ``random`` for entries without published weights); ``model_kwargs`` go to the library's
    constructor.

    Every entry: ``dim`` (pooled width), ``preprocess`` (its evaluation transform),
    ``default_image_size``, ``patch_size`` (0, or the patch size the input size must be a
    multiple of), ``pooling`` (``avg``: the pooled feature is the average of
    ``feature_map``; ``token``/``map``: a class token or attention pooling, the map being the
    patch tokens; ``avg+norm``: a norm after the average), ``channels_last`` (whether that
    memory layout speeds it up), ``has_text`` (a text tower for class prompts).
    """

    name: str
    dim: int
    build: Callable[[], nn.Module] | None = None
    weights_enum: type | None = None
    weights_aliases: Mapping[str, str] = field(default_factory=dict)
    default_weights: str = "v1"
    trunk: Callable[[nn.Module], Trunk] | None = None
    library: str = "torchvision"
    model: str = ""
    preprocess: Preprocess = PROTOCOL
    default_image_size: int = DEFAULT_IMAGE_SIZE
    patch_size: int = 0
    pooling: str = "avg"
    channels_last: bool = True
    has_text: bool = False
    model_kwargs: Mapping[str, object] = field(default_factory=dict)
    summary: str = ""
    testing: bool = False

    @property
    def mean(self) -> tuple[float, float, float]:
        return self.preprocess.mean

    @property
    def std(self) -> tuple[float, float, float]:
        return self.preprocess.std

    @property
    def family(self) -> BackboneFamily:
        """The family that builds this entry's trunks and finds its weights."""
        return family_named(self.library)

    def weights_member(self, alias: str):
        """The torchvision weights enum member for ``alias`` (``v1`` or a member name), or None."""
        if self.weights_enum is None:
            return None
        member_name = self.weights_aliases.get(alias.lower(), alias.upper())
        return getattr(self.weights_enum, member_name, None)

    def weights_names(self) -> list[str]:
        """Names accepted by ``--weights`` besides ``random`` and a path."""
        return self.family.tags(self)

    def check_image_size(self, image_size: int) -> None:
        """OptionError when this backbone cannot take ``image_size`` x ``image_size`` inputs."""
        if self.patch_size and image_size % self.patch_size:
            lower = image_size - image_size % self.patch_size
            raise OptionError(f"--image-size {image_size} is not a multiple of {self.name}'s patch "
                              f"size {self.patch_size}; use {lower} or {lower + self.patch_size}")


class BackboneFamily(ABC):
    """One library of backbones: its specs, its weights (names, where their files are), its
    trunks and, where it has them, its text towers.

    ``name`` is the library's import name, which ``BackboneSpec.library`` and features files
    (``library``) record; ``package`` is what ``pip`` installs (for the error when it is
    missing).
    """

    name: str
    package: str = ""

    def installed(self) -> bool:
        """Whether the library can be imported here (looked up, not imported)."""
        return hub.library_installed(self.name)

    @abstractmethod
    def specs(self) -> Sequence[BackboneSpec]:
        """The backbones this family registers."""

    @abstractmethod
    def tags(self, spec: BackboneSpec) -> list[str]:
        """The names ``--weights`` accepts for ``spec`` besides ``random`` and a path."""

    @abstractmethod
    def weights_choices(self, spec: BackboneSpec) -> list[str]:
        """What an empty ``--weights`` is told to choose from (before "or a path")."""

    @abstractmethod
    def describe_weights(self, spec: BackboneSpec, value: str) -> WeightsSource:
        """``--weights value`` (a name or a path; not empty, not ``random``) without touching the
        network or a cache; a checkpoint file is hashed."""

    @abstractmethod
    def locate_weights(self, source: WeightsSource, download: bool | None) -> WeightsSource:
        """A named source with its file's path and sha256, downloaded into its cache unless
        ``download`` is False (None: unless ``$FEATCACHE_OFFLINE`` is set)."""

    @abstractmethod
    def build(self, spec: BackboneSpec, image_size: int, source: WeightsSource | None) -> Trunk:
        """The trunk of ``spec`` for ``image_size`` inputs: random weights from the global
        generator (``source`` None) or the located ``source``'s file."""

    @abstractmethod
    def cache_entry(self, source: WeightsSource) -> dict:
        """Where the cache keeps a named source's file, for ``featcache backbones`` to look
        without importing torch (``BackboneInfo.weights_cached``): ``{"torch_hub": file name}``
        or ``{"hub_repo": repo, "hub_files": [...]}``."""

    def empty_trunk(self, spec: BackboneSpec, image_size: int) -> Trunk:
        """A trunk of the right shape whose weights are about to be overwritten (a fine-tuned
        run's): built from seed 0, the global generator untouched."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return self.build(spec, image_size, None)

    def build_text(self, spec: BackboneSpec, path: Path | None = None,
                   image_size: int = 0) -> nn.Module:
        """The text tower of a ``has_text`` spec (same weights file as the image trunk)."""
        raise OptionError(f"backbone {spec.name!r} has no text tower")

    def provenance(self, spec: BackboneSpec, preprocess: str) -> dict:
        """What features files record about the library beside the backbone (none by default);
        ``preprocess`` is ``--preprocess``."""
        return {}


_FAMILIES: dict[str, BackboneFamily] = {}


def register_family(family: BackboneFamily) -> BackboneFamily:
    """Add (or replace) a family defined outside this package (register its specs with
    :func:`~featcache.backbones.registry.register_backbone`); returns ``family``."""
    _FAMILIES[family.name] = family
    return family


def families() -> list[BackboneFamily]:
    """Every family: the ``FAMILY`` of each ``*_nets`` module of this package (imported the
    first time; the optional libraries themselves are not), and any registered since."""
    _discover()
    return list(_FAMILIES.values())


@functools.cache
def _discover() -> None:
    for module in import_modules_of(__package__ or "featcache.backbones", FAMILY_SUFFIX):
        _FAMILIES.setdefault(module.FAMILY.name, module.FAMILY)


def family_named(library: str) -> BackboneFamily:
    """The family of ``library``; an OptionError names the known ones."""
    _discover()
    if library in _FAMILIES:
        return _FAMILIES[library]
    known = ", ".join(_FAMILIES)
    raise OptionError(f"no backbone family for library {library!r} (known: {known}); add "
                      f"featcache/backbones/<library>{FAMILY_SUFFIX}.py defining FAMILY")
