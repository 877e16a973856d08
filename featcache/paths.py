"""Where featcache keeps its outputs: ``<cache>/<dataset>/...``.

The cache root is ``./cache`` unless ``--cache`` or the ``FEATCACHE_CACHE`` environment
variable says otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from featcache.environment import CACHE
from featcache.errors import InputError, OptionError, OutputExistsError, did_you_mean

CACHE_ENV = "FEATCACHE_CACHE"
DEFAULT_CACHE = "cache"
#: the most characters of a name that becomes a folder or file name
MAX_NAME = 100
_NAME_CHARS = re.compile(r"[A-Za-z0-9._+=@-]")
NAME_RULE = ("a name is 1 to 100 letters, digits and . _ + = @ -, not starting with '.' or "
             "'-' (it becomes a folder or file name)")


def check_name(value: str, what: str) -> str:
    """``value`` as one path component (a run id, a dataset name, ...); anything else, a path
    above all, is refused with one line naming ``what`` (the option) and the rule."""
    text = str(value)
    bad = next((c for c in text if not _NAME_CHARS.fullmatch(c)), None)
    if not text:
        problem = "is empty"
    elif "/" in text or "\\" in text or os.sep in text or text in (".", ".."):
        problem = "is a path, not a name"
    elif len(text) > MAX_NAME:
        problem = f"is {len(text)} characters long (at most {MAX_NAME})"
    elif text[0] in ".-":
        problem = f"starts with {text[0]!r}"
    elif bad is not None:
        problem = f"holds {bad!r}"
    else:
        return text
    shown = repr(text if len(text) <= 60 else text[:40] + "...")
    raise OptionError(f"{what} {shown} {problem}: {NAME_RULE}")


def cache_root(cache: str | os.PathLike | None = None) -> Path:
    """The cache root: the argument, else ``$FEATCACHE_CACHE``, else ``./cache``; a root that
    exists as a file is refused."""
    from_env = CACHE.value()
    where = "--cache" if cache else f"${CACHE_ENV}" if from_env else ""
    root = Path(cache or from_env or DEFAULT_CACHE).expanduser()
    if root.exists() and not root.is_dir():
        raise OptionError(f"{where or 'the cache root'} {root} is a file, not a folder; give the "
                          "folder featcache keeps its outputs in")
    blocking = next((parent for parent in root.absolute().parents
                     if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise OptionError(f"{where or 'the cache root'} {root} is below {blocking}, a file, not "
                          "a folder: no folder can be made there; give the folder featcache "
                          "keeps its outputs in")
    return root


def dataset_dir(dataset: str, cache: str | os.PathLike | None = None) -> Path:
    """``<cache>/<dataset>``; ``dataset`` may also be a path to such a directory (with a
    folder separator or starting with '.'); a name is checked (:func:`check_name`)."""
    candidate = Path(dataset)
    if candidate.is_dir() and (candidate / "labels.h5").exists():
        return candidate
    if os.sep in dataset or "/" in dataset or dataset.startswith("."):
        return candidate
    return cache_root(cache) / check_name(dataset, "dataset")


def labels_path(dataset: str, cache: str | os.PathLike | None = None) -> Path:
    return dataset_dir(dataset, cache) / "labels.h5"


def prepared_datasets(cache: str | os.PathLike | None = None) -> list[str]:
    """Names of the datasets under the cache root that have a labels file."""
    root = cache_root(cache)
    return sorted(p.parent.name for p in root.glob("*/labels.h5")) if root.is_dir() else []


def existing_labels(dataset: str, cache: str | os.PathLike | None = None) -> Path:
    """The labels file of a prepared dataset; the error names the closest prepared datasets."""
    path = labels_path(dataset, cache)
    if path.is_file():
        return path
    prepared = prepared_datasets(cache)
    hint = did_you_mean(dataset, prepared)
    known = (f"; prepared datasets in {cache_root(cache)}: {', '.join(prepared)}"
             if prepared and not hint else "")
    if dataset in OFFICIAL_LAYOUTS and not hint:  # a benchmark: its own prepare command
        command = f"featcache prepare {dataset}" + (" --root DIR" if OFFICIAL_LAYOUTS[dataset]
                                                    else "")
        if cache is not None:
            command += f" --cache {cache}"
        where = (f", DIR being {OFFICIAL_LAYOUTS[dataset]} (`featcache prepare {dataset} --help`)"
                 if OFFICIAL_LAYOUTS[dataset] else "")
        raise InputError(f"no dataset {dataset!r}: {path} does not exist{known}. Prepare it "
                         f"with `{command}`{where}")
    raise InputError(f"no dataset {dataset!r}: {path} does not exist{known}. Prepare it with "
                     f"`featcache prepare` (see `featcache prepare --help`){hint}")


#: the datasets `featcache prepare NAME` reads from their official layout, with the folder its
#: --root names ("": no --root, shapes is generated)
OFFICIAL_LAYOUTS = {
    "voc": "the VOC folder (holding VOCdevkit or ImageSets/Main)",
    "coco": "the folder holding annotations/instances_{train,val}2014.json",
    "nuswide": "the folder holding ImageList/, Groundtruth/ and Concepts81.txt",
    "cub": "the folder holding attributes.txt and CUB_200_2011/",
    "l48": "the L48 folder format_ML48S.py writes",
    "shapes": "",
}


#: the folder of a dataset's stage-two runs
RUNS = "runs"
#: file name prefixes of the pooled and the spatial features files
POOLED, SPATIAL = "features", "spatial"


def feature_file_name(tag: str, spatial: bool = False) -> str:
    """``features-<tag>.h5`` (pooled) or ``spatial-<tag>.h5``; ``tag`` is
    ``<backbone>[-<weights>][-protocol]``."""
    return f"{SPATIAL if spatial else POOLED}-{tag}.h5"


#: the tag's suffix of features made with the protocol's transform on a backbone whose own
#: transform differs (``featcache features --preprocess protocol``)
PROTOCOL_SUFFIX = "-protocol"


def feature_tag(backbone: str, weights_tag: str | None = None, protocol: bool = False) -> str:
    """``<backbone>[-<weights>][-protocol]``: the tag a features file is named by (stage one
    names files with it, fine-tuning's linear phase looks them up with it)."""
    return backbone + (f"-{weights_tag}" if weights_tag else "") + (PROTOCOL_SUFFIX if protocol else "")


def features_path(dataset: str, backbone: str, cache: str | os.PathLike | None = None) -> Path:
    return dataset_dir(dataset, cache) / feature_file_name(backbone)


def feature_file_tag(path: Path) -> str:
    """The tag of a pooled or spatial features file: ``features-<tag>.h5`` -> ``<tag>``."""
    for prefix in (POOLED, SPATIAL):
        if path.stem.startswith(f"{prefix}-"):
            return path.stem[len(prefix) + 1:]
    return path.stem


def features_files_in(root: Path, spatial: bool = False) -> list[Path]:
    """The pooled (or spatial) features files in the dataset folder ``root``, sorted."""
    return sorted(root.glob(feature_file_name("*", spatial)))


@dataclass(frozen=True)
class FeaturesFolder:
    """A dataset folder's finished features files, listed once: the pooled and the spatial
    ones, each by its tag (in the order of their names)."""

    root: Path
    pooled: dict[str, Path]
    spatial: dict[str, Path]

    def path(self, tag: str, spatial: bool = False) -> Path:
        """Where the pooled (or spatial) file of ``tag`` is, or would be."""
        return self.root / feature_file_name(tag, spatial)


def features_folder(root: Path) -> FeaturesFolder:
    """The features files of the dataset folder ``root``."""
    return FeaturesFolder(root, {feature_file_tag(p): p for p in features_files_in(root)},
                          {feature_file_tag(p): p for p in features_files_in(root, True)})


@dataclass(frozen=True)
class DatasetFolder:
    """A prepared dataset's folder, resolved once: its labels file, its finished features
    files and the folder of its stage-two runs."""

    labels: Path
    features: FeaturesFolder

    @property
    def runs(self) -> Path:
        """``runs/``: a stage-two run of each loss is ``runs/<loss>/<run-id>``."""
        return self.labels.parent / RUNS


def prepared_dataset(dataset: str, cache: str | os.PathLike | None = None) -> DatasetFolder:
    """The folder of a prepared dataset (:func:`existing_labels`: the error names the closest
    prepared datasets), its features files listed."""
    labels = existing_labels(dataset, cache)
    return DatasetFolder(labels, features_folder(labels.parent))


def backbone_feature_files(dataset: str, backbone: str, spatial: bool = False,
                           cache: str | os.PathLike | None = None,
                           backbones: Collection[str] = ()) -> list[Path]:
    """Every finished pooled (or spatial) features file of ``backbone``, whatever its weights:
    ``features-<backbone>.h5`` and ``features-<backbone>-<weights...>.h5``, sorted. Pass the
    registered ``backbones``: a longer name that extends this one (``clip-vit-l14-336`` beside
    ``clip-vit-l14``) owns its files."""
    longer = [b for b in backbones if b.startswith(f"{backbone}-")]

    def owns(tag: str, name: str) -> bool:
        return tag == name or tag.startswith(f"{name}-")

    return [p for p in features_files_in(dataset_dir(dataset, cache), spatial)
            if owns(feature_file_tag(p), backbone)
            and not any(owns(feature_file_tag(p), other) for other in longer)]


def spatial_features_path(dataset: str, backbone: str,
                          cache: str | os.PathLike | None = None) -> Path:
    """The spatial features file (the trunk's last feature map per image) of ``backbone``.

    Named apart from ``features-*.h5`` so that a spatial file never makes the choice of the
    pooled features file ambiguous.
    """
    return dataset_dir(dataset, cache) / feature_file_name(backbone, spatial=True)


def pooled_twin(spatial_path: Path) -> Path:
    """The pooled features file written beside the spatial file ``spatial_path``."""
    return spatial_path.with_name(feature_file_name(feature_file_tag(spatial_path)))


def runs_root(dataset: str, cache: str | os.PathLike | None = None) -> Path:
    """The folder of every stage-two run of ``dataset`` (``runs/<loss>/<run-id>``)."""
    return dataset_dir(dataset, cache) / RUNS


def runs_dir(dataset: str, loss: str, cache: str | os.PathLike | None = None) -> Path:
    return runs_root(dataset, cache) / loss


def finetune_dir(dataset: str, loss: str, cache: str | os.PathLike | None = None) -> Path:
    return dataset_dir(dataset, cache) / "finetune" / loss


# ------------------------------------------------------------------------ output files (--out)
#: the longest file name most file systems accept (bytes of one path component)
MAX_FILE_NAME = 255


def check_out(value: str | os.PathLike, option: str, suffixes: Collection[str], writes: str,
              inputs: Collection[str | os.PathLike] = (), overwrite: bool = False) -> Path:
    """An output file option (``--out``) checked before any work: one line naming ``option``
    when it is empty, a folder, under a file, too long a name, of another suffix than
    ``suffixes`` (what the command ``writes``), one of the command's ``inputs``, or an existing
    file without ``overwrite``. Its folder may be missing: the atomic write creates it."""
    text = str(value)
    path = Path(text).expanduser()
    allowed = ", ".join(sorted(suffixes))
    if not text.strip():
        raise OptionError(f"{option} is empty: give a file name ending in {allowed}")
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise OptionError(f"{option} {text} is a folder: give a file in it, e.g. "
                          f"{path / ('name' + sorted(suffixes)[0])}")
    if len(os.fsencode(path.name)) > MAX_FILE_NAME:
        raise OptionError(f"{option}: the file name {path.name[:40]}... is longer than "
                          f"{MAX_FILE_NAME} bytes")
    if path.suffix.lower() not in suffixes:
        ending = f"ends in {path.suffix!r}" if path.suffix else "has no suffix"
        raise OptionError(f"{option} {text} {ending}: this command writes {writes}; give a "
                          f"name ending in {allowed}")
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise OptionError(f"{option} {text}: {parent} is a file, not a folder")
    for given in inputs:
        if Path(given).exists() and path.exists() and path.resolve() == Path(given).resolve():
            raise OptionError(f"{option} {text} is also an input of this command ({given}): "
                              "writing it would replace what is read; give another file")
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{text} already exists; pass --overwrite to replace it")
    return path
