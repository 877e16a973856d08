"""Which features files a training run reads: one :class:`FeatureSource`, for both stages.

A dataset folder holds pooled files (``features-<tag>.h5``) and spatial ones
(``spatial-<tag>.h5``), the tag being ``<backbone>[-<weights>][-protocol]``. Stage two's
``--backbone`` names a tag (or a backbone whose only file it then takes); stage three's linear
phase names a backbone, ``--weights`` and ``--image-size``
(:mod:`featcache.protocol.linear_phase_source`). Each answer is resolved once, while
the command's options are checked, into a :class:`FeatureSource`: the tag, the pooled file,
its spatial sibling (the same backbone and weights) and whether the set came from images (a set
imported from features has no feature maps to look for); stage two opens its files here too
(:func:`open_feature_files`, :class:`FeatureFiles`), and every later part reads them from
there. The errors name the files there are and the command that makes a missing one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from featcache.data.featurefile import FeatureFile, open_features, read_feature_attrs
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError, OptionError
from featcache.paths import (
    dataset_dir,
    feature_file_tag,
    features_files_in,
    find_features,
    find_spatial_features,
    spatial_features_path,
)
from featcache.protocol.loss_choice import WITHOUT_IMAGES, needs_spatial, requested_losses

#: the backbone fine-tuning and its linear phase take when none is named
DEFAULT_BACKBONE = "resnet50"


@dataclass(frozen=True)
class FeatureSource:
    """The features files a run trains on, resolved once."""

    #: ``<backbone>[-<weights>][-protocol]`` (None: no file names one)
    tag: str | None
    #: ``features-<tag>.h5``, when a chosen loss reads pooled features
    pooled: Path | None
    #: the spatial file of the same backbone and weights, when it exists and a loss reads maps
    spatial: Path | None
    #: False for a set imported from features (no images: no maps, no pseudo-labels)
    from_images: bool = True

    def file(self, spatial: bool) -> Path:
        """The file a loss trains on: the spatial one for a loss that reads feature maps."""
        path = self.spatial if spatial else self.pooled
        if path is None:
            raise LookupError(f"no {'spatial' if spatial else 'pooled'} features file resolved")
        return path


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


def came_from_images(labels: LabelSet) -> bool:
    """Whether the labels file's set has images (else it was imported from features)."""
    return labels.provenance.get("source_format") not in WITHOUT_IMAGES


def reads_pooled(names: Sequence[str], from_images: bool) -> bool:
    """Whether losses ``names`` (``--loss``) need the pooled file: unless only losses that read
    feature maps are named (a set imported from features has only its pooled file, whose facts
    say why the others cannot train)."""
    return (names == ["all"] or not names or not from_images
            or any(not needs_spatial(name) for name in names))


def reads_maps(names: Sequence[str]) -> bool:
    """Whether losses ``names`` (``--loss``) may read the spatial file (``all``, or a loss that
    reads feature maps)."""
    return names == ["all"] or any(needs_spatial(name) for name in names)


# ------------------------------------------------------------------------- stage two's --backbone
def open_feature_files(dataset: str, backbone: str | None, cache: str | None,
                       losses: str | Sequence[str], labels: LabelSet,
                       say: Callable[[str], None] = lambda _: None) -> FeatureFiles:
    """Stage two's features files, resolved and opened once: the pooled file of ``--backbone``
    unless only losses that read feature maps are named, and its spatial sibling when it exists
    and ``--loss all`` or such a loss is named (a named one without a spatial file is refused by
    its need, naming the command that makes one)."""
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


def pooled_features_path(dataset: str, backbone: str | None, cache: str | None,
                         say: Callable[[str], None]) -> Path:
    """``--backbone``'s pooled features file: ``features-<backbone>.h5``, else the only file
    made with that backbone (whatever its weights: said). When none or several fit, the error
    lists every features file with the ``--backbone`` value that picks it."""
    try:
        return find_features(dataset, backbone, cache)
    except InputError as exc:
        if backbone is None:
            raise
        missing = exc
    root = dataset_dir(dataset, cache)
    present = features_files_in(root)
    made_with = [p for p in present if read_feature_attrs(p).get("backbone") == backbone]
    if len(made_with) == 1:
        say(f"--backbone {backbone}: using {made_with[0].name}, the only features file "
            f"of that backbone in {root}")
        return made_with[0]
    if not present:
        raise missing
    listed = ", ".join(f"{p.name} (--backbone {feature_file_tag(p)})" for p in present)
    what = (f"several features files of backbone {backbone}" if made_with
            else f"no features file features-{backbone}.h5")
    raise OptionError(f"{root} holds {what}; choose one of its features files: {listed}")


def only_spatial_tag(dataset: str, cache: str | None) -> str | None:
    """The tag of the dataset's only spatial features file, else of its only pooled one
    (whose spatial file is then missing); None when neither says."""
    root = dataset_dir(dataset, cache)
    found = features_files_in(root, spatial=True)
    if len(found) > 1:
        names = ", ".join(feature_file_tag(p) for p in found)
        raise InputError(f"{root} holds several spatial features files ({names}); choose one "
                         "with --backbone")
    if found:
        return feature_file_tag(found[0])
    pooled = features_files_in(root)
    return feature_file_tag(pooled[0]) if len(pooled) == 1 else None


def spatial_sibling(dataset: str, tag: str | None, cache: str | None,
                    pooled: FeatureFile | None) -> Path | None:
    """The spatial file of the same backbone and weights as ``tag``'s (``pooled``: its pooled
    file, when open): ``spatial-<tag>.h5``, else the one named by the pooled file's backbone
    alone when its weights are the same; None when there is none."""
    if tag is None:
        return None
    path = spatial_features_path(dataset, tag, cache)
    if not path.exists() and pooled is not None and pooled.backbone != tag:
        named = spatial_features_path(dataset, pooled.backbone, cache)
        if named.exists() and (read_feature_attrs(named).get("weights_sha256")
                               == pooled.attrs.get("weights_sha256")):
            path = named
    return path if path.exists() else None
