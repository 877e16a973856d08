"""Finding backbone weights offline: ``--weights NAME|random|PATH``.

``--weights`` takes the backbone's default (None), a name its family knows (torchvision's
``v1``/``v2``, a timm or open_clip pretrained tag), ``random`` (a seeded initialisation) or a
checkpoint file. :func:`describe_weights` parses it without touching the network or a cache;
:func:`locate_weights` finds the named weights' file in their family's cache (the torch hub
cache for ResNets, the Hugging Face hub cache for timm and open_clip:
:mod:`featcache.backbones.torchvision_nets`, :mod:`featcache.backbones.hubweights`), else
downloads it there (not with ``$FEATCACHE_OFFLINE``), else one error names the file, where it
goes and how to get it. A weights file is hashed once per command
(:func:`~featcache.backbones.weightsource.file_sha256`); :class:`WeightsChoice` is ``--weights``
resolved once per backbone, for a command that asks about several files.

The identity recorded in features files is the weights name, the file name and its sha256 (and
the hub repository); ``random`` records the seed and a digest of the initial parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from featcache.backbones.family import BackboneSpec, family_named
from featcache.backbones.hub import OFFLINE_ENV
from featcache.backbones.weightsource import WeightsSource, random_source, url_file_name
from featcache.errors import OptionError

__all__ = ["OFFLINE_ENV", "WeightsChoice", "WeightsSource", "describe_weights", "locate_weights",
           "resolve_weights", "url_file_name"]


def describe_weights(spec: BackboneSpec, value: str | None = None, seed: int = 0) -> WeightsSource:
    """Parse ``--weights`` (None: the backbone's default) without touching the network or the
    hub cache.

    ``file`` sources are hashed here (a file that names a torchvision checkpoint and carries its
    hash counts as those torchvision weights); named sources get their sha256 from
    :func:`locate_weights`.
    """
    value = spec.default_weights if value is None else str(value).strip()
    if not value:
        raise OptionError("--weights is empty; choose " + ", ".join(spec.family.weights_choices(spec))
                          + " or a path to a checkpoint")
    if value.lower() == "random":
        return random_source(seed, spec.library)
    return spec.family.describe_weights(spec, value)


def locate_weights(source: WeightsSource, download: bool | None = None) -> WeightsSource:
    """Return ``source`` with the checkpoint's path and sha256 filled in.

    Named weights are looked up in their family's cache, then downloaded there (unless
    ``download`` is False or ``$FEATCACHE_OFFLINE`` is set); when neither works the error says
    which file to put where. Random weights and files given by path are returned as they are.
    """
    if source.located:
        return source
    return family_named(source.library).locate_weights(source, download)


def resolve_weights(spec: BackboneSpec, value: str | None = None, seed: int = 0,
                    download: bool | None = None) -> WeightsSource:
    """:func:`describe_weights` then :func:`locate_weights`: a source ready to load."""
    return locate_weights(describe_weights(spec, value, seed), download=download)


@dataclass(frozen=True)
class WeightsChoice:
    """``--weights`` (``value``; None: each backbone's default) and the seed of random weights,
    described once per backbone.

    A command resolves it once and asks it about every backbone it meets (the features files
    and runs it considers): :meth:`source` (parsed, a file hashed, errors as
    :func:`describe_weights`'s), :meth:`located` (ready to load) and :meth:`recorded_in`
    (whether a file's attributes name these weights).
    """

    value: str | None = None
    seed: int = 0
    _described: dict[str, WeightsSource] = field(default_factory=dict, init=False, repr=False,
                                                 compare=False)

    @property
    def given(self) -> bool:
        """Whether ``--weights`` was given (not the backbones' defaults)."""
        return self.value is not None

    def source(self, spec: BackboneSpec) -> WeightsSource:
        """The weights for backbone ``spec``, described the first time."""
        if spec.name not in self._described:
            self._described[spec.name] = describe_weights(spec, self.value, self.seed)
        return self._described[spec.name]

    def located(self, spec: BackboneSpec, download: bool | None = None) -> WeightsSource:
        """:meth:`source` with its file found (:func:`locate_weights`)."""
        return locate_weights(self.source(spec), download)

    def recorded_in(self, spec: BackboneSpec, attrs: Mapping) -> bool:
        """Whether ``attrs`` (of a features file of ``spec``) name these weights: always when
        ``--weights`` was not given."""
        return not self.given or self.source(spec).recorded_in(attrs)
