"""The features files a ``train-linear`` call trains on, opened: the pooled one and the spatial
one of the same backbone and weights, each only when a chosen loss reads it. Which files they
are is a :class:`~featcache.protocol.feature_source.FeatureSource`, resolved here once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from featcache.data.featurefile import FeatureFile, open_features
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError
from featcache.paths import feature_file_tag, find_spatial_features
from featcache.protocol.feature_source import (
    FeatureSource,
    came_from_images,
    only_spatial_tag,
    pooled_features_path,
    reads_maps,
    reads_pooled,
    spatial_sibling,
)


@dataclass(frozen=True)
class FeatureFiles:
    """The features files a ``train-linear`` call trains on: the pooled one (every loss but
    those that read feature maps) and the spatial one, each opened only when a chosen loss
    needs it; ``source`` says which files they are."""

    source: FeatureSource
    pooled: FeatureFile | None
    spatial: FeatureFile | None

    @property
    def first(self) -> FeatureFile:
        """The pooled file, else the spatial one (the split rows are read from it)."""
        found = self.pooled if self.pooled is not None else self.spatial
        if found is None:
            raise LookupError("no features file was opened")
        return found


def requested_losses(spec: str | Sequence[str]) -> list[str]:
    """The names ``--loss`` gives (``["all"]`` for all)."""
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    return [n for n in names if n]


def feature_files(dataset: str, backbone: str | None, cache: str | None,
                  losses: str | Sequence[str], labels: LabelSet,
                  say: Callable[[str], None] = lambda _: None) -> FeatureFiles:
    """Open the pooled features file of ``--backbone`` unless only losses that read feature
    maps are named, and its spatial sibling when it exists and ``--loss all`` or such a loss is
    named (a named one without a spatial file is refused by its need, naming the command that
    makes one)."""
    names = requested_losses(losses)
    images = came_from_images(labels)
    pooled = None
    if reads_pooled(names, images):
        pooled = open_features(pooled_features_path(dataset, backbone, cache, say), labels)
    tag = (feature_file_tag(pooled.path) if pooled is not None
           else backbone or only_spatial_tag(dataset, cache))
    path = spatial_sibling(dataset, tag, cache, pooled)
    spatial = None
    if reads_maps(names) and path is not None:
        spatial = open_features(path, labels)
        if spatial.spatial_shape is None:
            raise InputError(f"{path} holds pooled features (no layout 'spatial' and "
                             "spatial_shape attributes); BoostLU and IGNORE train on feature maps: "
                             f"extract it again with `featcache features --dataset "
                             f"{dataset} --backbone {tag} --spatial`")
    if pooled is not None and pooled.spatial_shape is not None:
        raise InputError(f"{pooled.path} holds spatial feature maps, not pooled features; a "
                         "spatial file is named spatial-<backbone>.h5")
    if pooled is None and spatial is None:
        find_spatial_features(dataset, tag or "resnet50", cache)
    source = FeatureSource(tag, None if pooled is None else pooled.path,
                           None if spatial is None else spatial.path, images)
    return FeatureFiles(source, pooled, spatial)
