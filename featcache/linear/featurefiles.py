"""The features files a ``train-linear`` call trains on: the pooled one, the spatial one of the
same backbone and weights, each opened only when a chosen loss needs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from featcache.data.featurefile import FeatureFile, open_features, read_feature_attrs
from featcache.errors import InputError, OptionError
from featcache.linear.options import LinearOptions
from featcache.paths import (
    dataset_dir,
    feature_file_tag,
    features_files_in,
    find_features,
    find_spatial_features,
    spatial_features_path,
)
from featcache.protocol.loss_choice import needs_spatial


@dataclass
class FeatureFiles:
    """The features files a ``train-linear`` call trains on: the pooled one (every loss but
    BoostLU's) and the spatial one (BoostLU's), each opened only when a chosen loss needs it."""

    pooled: FeatureFile | None
    spatial: FeatureFile | None
    backbone: str | None

    @property
    def first(self) -> FeatureFile:
        return self.pooled if self.pooled is not None else self.spatial


def requested_losses(spec: str | Sequence[str]) -> list[str]:
    """The names ``--loss`` gives (``["all"]`` for all)."""
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    return [n for n in names if n]


def feature_files(options: LinearOptions, labels,
                  say: Callable[[str], None] = lambda _: None) -> FeatureFiles:
    """Open the pooled features file unless only BoostLU losses are named, and the spatial one
    when it exists and ``--loss all`` or a BoostLU loss is named (a named BoostLU loss without
    a spatial file is refused by its need, naming the command that makes one)."""
    names = requested_losses(options.losses)
    every = names == ["all"]
    spatial_named = every or any(needs_spatial(name) for name in names)
    pooled = None
    # a set imported from features has no spatial file to look for: its pooled file's facts
    # say why BoostLU is not available on it
    imported = labels.provenance.get("source_format") == "npz"
    if every or not names or imported or any(not needs_spatial(name) for name in names):
        pooled = open_features(pooled_features_path(options, say), labels)
    # the spatial file of the same backbone and weights: spatial-<tag>.h5 beside features-<tag>.h5
    backbone = (feature_file_tag(pooled.path) if pooled is not None
                else options.backbone or _only_spatial_backbone(options))
    path = (spatial_features_path(options.dataset, backbone, options.cache)
            if backbone is not None else None)
    if (path is not None and not path.exists() and pooled is not None
            and pooled.backbone != backbone):
        # a spatial file named by the backbone alone, of the same weights as the pooled file
        named = spatial_features_path(options.dataset, pooled.backbone, options.cache)
        if named.exists() and (read_feature_attrs(named).get("weights_sha256")
                               == pooled.attrs.get("weights_sha256")):
            path = named
    spatial = None
    if spatial_named and path is not None and path.exists():
        spatial = open_features(path, labels)
        if spatial.spatial_shape is None:
            raise InputError(f"{path} holds pooled features (no layout 'spatial' and "
                             "spatial_shape attributes); BoostLU and IGNORE train on feature maps: "
                             f"extract it again with `featcache features --dataset "
                             f"{options.dataset} --backbone {backbone} --spatial`")
    if pooled is not None and pooled.spatial_shape is not None:
        raise InputError(f"{pooled.path} holds spatial feature maps, not pooled features; a "
                         "spatial file is named spatial-<backbone>.h5")
    if pooled is None and spatial is None:
        find_spatial_features(options.dataset, backbone or "resnet50", options.cache)
    return FeatureFiles(pooled, spatial, backbone)


def pooled_features_path(options: LinearOptions, say: Callable[[str], None]) -> Path:
    """``--backbone``'s pooled features file: ``features-<backbone>.h5``, else the only file
    made with that backbone (whatever its weights: said). When none or several fit, the error
    lists every features file with the ``--backbone`` value that picks it."""
    try:
        return find_features(options.dataset, options.backbone, options.cache)
    except InputError as exc:
        if options.backbone is None:
            raise
        missing = exc
    root = dataset_dir(options.dataset, options.cache)
    present = features_files_in(root)
    made_with = [p for p in present if read_feature_attrs(p).get("backbone") == options.backbone]
    if len(made_with) == 1:
        say(f"--backbone {options.backbone}: using {made_with[0].name}, the only features file "
            f"of that backbone in {root}")
        return made_with[0]
    if not present:
        raise missing
    listed = ", ".join(f"{p.name} (--backbone {feature_file_tag(p)})" for p in present)
    what = (f"several features files of backbone {options.backbone}" if made_with
            else f"no features file features-{options.backbone}.h5")
    raise OptionError(f"{root} holds {what}; choose one of its features files: {listed}")


def _only_spatial_backbone(options: LinearOptions) -> str | None:
    """The backbone of the dataset's only spatial features file, else of its only pooled one
    (whose spatial file is then missing); None when neither says."""
    root = dataset_dir(options.dataset, options.cache)
    found = features_files_in(root, spatial=True)
    if len(found) > 1:
        names = ", ".join(feature_file_tag(p) for p in found)
        raise InputError(f"{root} holds several spatial features files ({names}); choose one "
                         "with --backbone")
    if found:
        return feature_file_tag(found[0])
    pooled = features_files_in(root)
    return feature_file_tag(pooled[0]) if len(pooled) == 1 else None
