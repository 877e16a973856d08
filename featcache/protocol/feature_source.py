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
from featcache.paths import FeaturesFolder
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
def open_feature_files(dataset: str, backbone: str | None, folder: FeaturesFolder,
                       losses: str | Sequence[str], labels: LabelSet,
                       say: Callable[[str], None] = lambda _: None) -> FeatureFiles:
    """Stage two's features files, resolved from the files of ``dataset``'s ``folder``
    (listed once, :func:`~featcache.paths.prepared_dataset`) and opened once: the pooled file
    of ``--backbone`` unless only losses that read feature maps are named, and its spatial
    sibling when it exists and ``--loss all`` or such a loss is named (a named one without a
    spatial file is refused, naming the command that makes one)."""
    names = requested_losses(losses)
    images = came_from_images(labels)
    tag: str | None
    pooled: FeatureFile | None = None
    if reads_pooled(names, images):
        tag, pooled_path = _pooled_file(folder, dataset, backbone, say)
        pooled = open_features(pooled_path, labels)
    else:
        tag = backbone or _only_spatial_tag(folder)
    path = _spatial_sibling(folder, tag, pooled)
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
        named = tag or DEFAULT_BACKBONE
        raise InputError(f"no spatial features file {folder.path(named, spatial=True)}; BoostLU "
                         f"and IGNORE train on feature maps: run `featcache features --dataset "
                         f"{dataset} --backbone {named} --spatial` first")
    source = FeatureSource(tag, None if pooled is None else pooled.path,
                           None if spatial is None else spatial.path, images)
    return FeatureFiles(source, pooled, spatial)


def _pooled_file(folder: FeaturesFolder, dataset: str, backbone: str | None,
                 say: Callable[[str], None]) -> tuple[str, Path]:
    """``--backbone``'s pooled features file and its tag: ``features-<backbone>.h5``, else the
    only file made with that backbone (whatever its weights: said); with no ``--backbone``,
    the only file there is. When none or several fit, the error lists every features file with
    the ``--backbone`` value that picks it."""
    root, present = folder.root, folder.pooled
    if backbone is None:
        if not present:
            raise InputError(f"no features file in {root}; run `featcache features --dataset "
                             f"{dataset}` (or `featcache prepare features --npz FILE --name "
                             f"{dataset}`) first")
        if len(present) > 1:
            raise InputError(f"{root} holds several features files ({', '.join(present)}); "
                             "choose one with --backbone")
        return next(iter(present.items()))
    tag = backbone  # a name: LinearOptions.validate checked it
    if tag in present:
        return tag, present[tag]
    made_with = [(t, p) for t, p in present.items()
                 if read_feature_attrs(p).get("backbone") == backbone]
    if len(made_with) == 1:
        say(f"--backbone {backbone}: using {made_with[0][1].name}, the only features file "
            f"of that backbone in {root}")
        return made_with[0]
    if not present:
        raise InputError(f"no features file {folder.path(tag)}; run `featcache features "
                         f"--dataset {dataset} --backbone {backbone}` first")
    listed = ", ".join(f"{p.name} (--backbone {t})" for t, p in present.items())
    what = (f"several features files of backbone {backbone}" if made_with
            else f"no features file features-{backbone}.h5")
    raise OptionError(f"{root} holds {what}; choose one of its features files: {listed}")


def _only_spatial_tag(folder: FeaturesFolder) -> str | None:
    """The tag of the folder's only spatial features file, else of its only pooled one (whose
    spatial file is then missing); None when neither says."""
    if len(folder.spatial) > 1:
        raise InputError(f"{folder.root} holds several spatial features files "
                         f"({', '.join(folder.spatial)}); choose one with --backbone")
    if folder.spatial:
        return next(iter(folder.spatial))
    return next(iter(folder.pooled)) if len(folder.pooled) == 1 else None


def _spatial_sibling(folder: FeaturesFolder, tag: str | None,
                     pooled: FeatureFile | None) -> Path | None:
    """The spatial file of the same backbone and weights as ``tag``'s (``pooled``: its pooled
    file, when open): ``spatial-<tag>.h5``, else the one named by the pooled file's backbone
    alone when its weights are the same; None when there is none."""
    if tag is None:
        return None
    path = folder.spatial.get(tag)
    if path is None and pooled is not None and pooled.backbone != tag:
        named = folder.spatial.get(pooled.backbone)
        if named is not None and (read_feature_attrs(named).get("weights_sha256")
                                  == pooled.attrs.get("weights_sha256")):
            path = named
    return path
