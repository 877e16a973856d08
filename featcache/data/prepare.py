"""Stage zero's shared pipeline: from a read dataset to ``<cache>/<dataset>/labels.h5``.

Every format goes through :func:`prepare_dataset`, which follows ``shared/PROTOCOL.md``
section 1 in this order:

1. drop the rows without any positive label (counted and named in the provenance);
2. check that every image exists under the image root (unless ``labels_only``): missing
   images are an error listing the first few, or, with ``drop_missing``, dropped and recorded;
   then (``verify_images``, by default for sets of at most 50,000 images) decode every image:
   one line on their modes and sizes, one error naming those that cannot be read;
3. (NUS-WIDE ``--split merged`` only) merge both official splits and draw a seeded split;
4. observe single positives with a fresh ``RandomState(obs_seed)`` per matrix, the official
   train and test matrices separately (given single positives are kept as they are), or with
   a label-bias sampler (``observe``: size, location, semantic; :mod:`featcache.data.bias`);
5. split the official train set 80/20 with ``RandomState(split_seed)``;
6. write the labels file atomically with its provenance.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from featcache.data.bias import BIASED, OBSERVERS, Observer, observe_biased, read_class_weights
from featcache.data.classnames import check_class_names
from featcache.data.formats import SourceDataset, SourceSplit, first_few
from featcache.data.images import VERIFY_LIMIT, survey_images
from featcache.data.labelfile import LabelSet, SplitLabels, write_labels
from featcache.data.sampling import (
    PROTOCOL_SEED,
    VAL_FRACTION,
    observe_uniform,
    rows_without_positive,
    split_train_val,
)
from featcache.errors import FeatcacheWarning, InputError, OptionError, name_list, plural
from featcache.fileio import refuse_existing, require_space, sha256_file
from featcache.locks import OutputLock
from featcache.progress import progress

OFFICIAL = ("train", "test")


@dataclass
class MergedSplit:
    """Merge the official splits, then draw ``train_size`` training rows with ``seed``."""

    train_size: int = 150_000
    seed: int = PROTOCOL_SEED


@dataclass
class PrepareOptions:
    """How observed labels, splits and images are handled (the protocol's defaults)."""

    num_pos: int = 1
    num_neg: int = 0
    #: the observation sampler: uniform (the protocol), size, location or semantic
    observe: str = "uniform"
    #: semantic: a JSON file of one weight per class
    class_weights: str | os.PathLike | None = None
    obs_seed: int = PROTOCOL_SEED
    split_seed: int = PROTOCOL_SEED
    labels_only: bool = False
    drop_missing: bool = False
    #: decode every image now (None: when there are at most ``VERIFY_LIMIT``)
    verify_images: bool | None = None
    merge: MergedSplit | None = None
    overwrite: bool = False


@dataclass
class PrepareResult:
    """The labels file written and what became of the source rows.

    ``kept[split]`` holds, for each output row of an official split, its row in the source
    split (only without a merged split, where rows change splits).
    """

    path: Path
    labels: LabelSet
    kept: dict[str, np.ndarray]
    provenance: dict = field(default_factory=dict)


Notify = Callable[[str], None]


class _Report(TypedDict, total=False):
    """What preparing found and did, kept in the provenance."""

    #: per official split: rows listed, without positive, missing images, kept; "split": the
    #: training and validation rows
    counts: dict[str, dict[str, int]]
    dropped_no_positive: dict[str, list[str]]
    missing_images: dict[str, list[str]]
    images_verified: dict | bool
    merged_split: dict
    classes_without_train_positive: list[str]


def prepare_dataset(source: SourceDataset, path: str | os.PathLike,
                    options: PrepareOptions | None = None, extra: dict | None = None,
                    notify: Notify | None = None) -> PrepareResult:
    """Run the protocol on ``source`` and write the labels file to ``path``.

    ``extra`` (the command line and its options, ...) is added to the provenance; ``notify``
    receives one line for each thing the user should know (rows dropped, images missing).
    """
    options = options or PrepareOptions()
    notify = notify or (lambda message: None)
    path = Path(path)
    with OutputLock(path, "wait for it to finish"):
        return _prepare_locked(source, path, options, extra, notify)


def _provenance(source: SourceDataset, options: PrepareOptions, observer: Observer, parts: dict,
                report: _Report, extra: dict | None) -> dict:
    """The labels file's provenance: the source, how the observed labels were drawn, the
    seeds and splits, and what was dropped or checked."""
    return {
        "source_format": source.source_format,
        "sources": [_describe_file(file) for file in progress(
            source.source_files, desc="hashing source files", unit=" file", mininterval=0.5,
            leave=False, disable=_quick_to_hash(source.source_files))],
        "source_details": source.details,
        "observation": "given" if parts["train"].observed is not None else observer.rule,
        "observation_test": "given" if parts["test"].observed is not None else observer.rule,
        **({"observer": observer.record()} if observer.biased else {}),
        "num_pos": options.num_pos,
        "num_neg": options.num_neg,
        "obs_seed": options.obs_seed,
        "split_seed": options.split_seed,
        **({"val_fraction": VAL_FRACTION} if source.val_rows is None
           else {"val_split": "given by the source"}),
        "labels_only": options.labels_only,
        "images_checked": not options.labels_only,
        "drop_missing": options.drop_missing,
        "positives_per_class": {split: parts[split].labels.sum(axis=0).astype(int).tolist()
                                for split in OFFICIAL},
        **report,
        **(extra or {}),
    }


def _prepare_locked(source: SourceDataset, path: Path, options: PrepareOptions,
                    extra: dict | None, notify: Notify) -> PrepareResult:
    refuse_existing(path, options.overwrite)
    _check_options(source, options)
    check_class_names(source.classes, ", ".join(str(f) for f in source.source_files[:3])
                      or source.name)
    observer = make_observer(options, source.classes)
    if not options.labels_only and source.image_root is None:
        raise OptionError(f"{source.name} has no image folder; use --labels-only")

    kept: dict[str, np.ndarray] = {}
    report: _Report = {"counts": {}, "dropped_no_positive": {}, "missing_images": {}}
    for split in OFFICIAL:
        kept[split] = _kept_rows(source, split, options, report, notify)
    parts = {split: source.split(split).take(kept[split]) for split in OFFICIAL}
    report["images_verified"] = _verify_images(source, parts, options, notify)
    if options.merge is not None:
        parts, report["merged_split"] = _merge_and_split(parts, options.merge)
        kept = {}
        notify(f"merged both official splits ({plural(report['merged_split']['rows'], 'image')}) and "
               f"drew {plural(options.merge.train_size, 'training image')} with seed {options.merge.seed}")

    observed = {split: _observe(parts[split], options, observer, split) for split in OFFICIAL}
    if source.val_rows is None:
        train_index, val_index = split_train_val(len(parts["train"]), VAL_FRACTION,
                                                 options.split_seed)
    else:  # the source's own validation rows, among those kept
        given_val = np.isin(kept["train"], source.val_rows)
        train_index, val_index = np.flatnonzero(~given_val), np.flatnonzero(given_val)
        if not (train_index.size and val_index.size):
            raise InputError(f"{source.name}: {train_index.size} training and {val_index.size} "
                             "validation rows are left after dropping rows; both are needed")
    report["counts"]["split"] = {"train": int(train_index.size), "val": int(val_index.size)}
    report["classes_without_train_positive"] = _warn_unlearnable_classes(
        source.classes, parts["train"].labels[train_index], observed["train"][train_index])

    provenance = _provenance(source, options, observer, parts, report, extra)
    labels = LabelSet(
        dataset=source.name,
        classes=list(source.classes),
        train=SplitLabels(np.array(parts["train"].images, dtype=object), observed["train"],
                          parts["train"].clean),
        test=SplitLabels(np.array(parts["test"].images, dtype=object), observed["test"],
                         parts["test"].clean),
        train_index=train_index,
        val_index=val_index,
        image_root=str(Path(source.image_root).resolve()) if source.image_root else None,
        provenance=provenance,
    )
    write_labels(labels, path, overwrite=options.overwrite)
    labels.path, labels.sha256 = path, sha256_file(path)
    return PrepareResult(path=path, labels=labels, kept=kept, provenance=provenance)


def _warn_unlearnable_classes(classes: list[str], labels: np.ndarray,
                              observed: np.ndarray) -> list[str]:
    """Warn about classes no head can learn from the training rows (after the 80/20 split):
    no positive at all, or (single positives sampled from full labels) no observed positive.
    Returns the classes without any training positive (recorded in the provenance)."""
    absent = [c for c, n in zip(classes, labels.sum(axis=0), strict=True) if n == 0]
    rows = plural(len(labels), "training image")
    if absent:
        warnings.warn(f"{len(absent)} of {plural(len(classes), 'class', 'classes')} "
                      f"{'has' if len(absent) == 1 else 'have'} no "
                      f"positive among the {rows} ({name_list(absent)}): no loss can learn "
                      f"{'it' if len(absent) == 1 else 'them'} (a head's AP there is chance)",
                      FeatcacheWarning, stacklevel=4)
    unseen = [c for c, n, m in zip(classes, labels.sum(axis=0), (observed == 1).sum(axis=0),
                                   strict=True) if n > 0 and m == 0]
    if unseen:
        warnings.warn(f"{len(unseen)} of {plural(len(classes), 'class', 'classes')} "
                      f"{'has' if len(unseen) == 1 else 'have'} positives but no observed positive "
                      f"among the {rows} ({name_list(unseen)}): the single-positive losses never "
                      f"see {'it' if len(unseen) == 1 else 'them'} as positive", FeatcacheWarning,
                      stacklevel=4)
    return absent


def _verify_images(source: SourceDataset, parts: dict[str, SourceSplit], options: PrepareOptions,
                   notify: Notify) -> dict | bool:
    """Decode every image (``--verify-images``; by default below :data:`VERIFY_LIMIT` images):
    a line on their modes and sizes, and one error naming those that cannot be read."""
    if options.labels_only or source.image_root is None:
        return False
    names = [name for split in OFFICIAL for name in parts[split].images]
    verify = options.verify_images
    if verify is None:
        verify = len(names) <= VERIFY_LIMIT
        if not verify:
            notify(f"not decoding the {plural(len(names), 'image')} now (more than {VERIFY_LIMIT}): pass "
                   "--verify-images to check them here; stage one names any it cannot read "
                   "(features --skip-bad flags them instead)")
    if not verify:
        return False
    survey = survey_images(source.image_root, names, total=len(names))
    notify(survey.summary())
    if survey.bad:
        shown = first_few([f"{name} ({reason})" for name, reason in survey.bad])
        raise InputError(f"{len(survey.bad)} of {plural(len(names), 'image')} under {source.image_root} "
                         f"cannot be read: {shown}. Fix or remove them (or drop their rows), or "
                         "pass --no-verify-images and let `featcache features --skip-bad` flag "
                         "them")
    return survey.record()


def check_observe_options(options: PrepareOptions) -> None:
    """Refuse sampler options that cannot go together (before any file is read)."""
    if options.observe not in OBSERVERS:
        raise OptionError(f"--observe {options.observe!r}: choose one of {', '.join(OBSERVERS)}")
    if options.observe == "semantic" and options.class_weights is None:
        raise OptionError("--observe semantic needs --class-weights FILE: a JSON object with "
                          "one weight per class (docs/prepare.md, 'Label bias')")
    if options.observe != "semantic" and options.class_weights is not None:
        raise OptionError("--class-weights is only for --observe semantic")
    if options.observe in BIASED and (options.num_pos, options.num_neg) != (1, 0):
        raise OptionError(f"--observe {options.observe} observes one positive and no negative "
                          "per image (as Arroyo et al.); drop --num-pos/--num-neg")


def make_observer(options: PrepareOptions, classes: list[str]) -> Observer:
    """The sampler ``options`` name, with the semantic rule's class weights read and checked."""
    check_observe_options(options)
    if options.class_weights is not None:  # semantic (checked above)
        return read_class_weights(options.class_weights, classes)
    return Observer(options.observe)


def _observe(part: SourceSplit, options: PrepareOptions, observer: Observer,
             split: str) -> np.ndarray:
    """The observed labels of one official split: given, uniform, or biased."""
    if part.observed is not None:  # given observations (real single positives) stay as given
        return part.observed
    clean = part.labels  # no given observations: the clean labels
    if not observer.biased:
        return observe_uniform(clean, options.num_pos, options.num_neg, options.obs_seed)
    return observe_biased(clean, observer, options.obs_seed, part.objects, part.images, split)


def _kept_rows(source: SourceDataset, split: str, options: PrepareOptions, report: _Report,
               notify: Notify) -> np.ndarray:
    """Rows of an official split that have a positive and (unless labels-only) an image.

    Records the counts and the dropped names in ``report``; missing images are an error
    unless ``options.drop_missing``.
    """
    part = source.split(split)
    empty = rows_without_positive(part.labels)
    dropped = [part.images[i] for i in empty]
    if empty.size:
        notify(f"{split}: dropped {empty.size} of {plural(len(part), 'image')} with no positive label "
               f"({first_few(dropped)})")
    rows = np.setdiff1d(np.arange(len(part)), empty)
    missing: list[str] = []
    if not options.labels_only and source.image_root is not None:  # (one is needed: checked)
        absent = _missing_images(source.image_root, [part.images[i] for i in rows], split)
        missing = [part.images[rows[i]] for i in absent]
        if absent.size and not options.drop_missing:
            raise InputError(
                f"{absent.size} of the {plural(rows.size, f'{split} image')} are missing from "
                f"{source.image_root} ({first_few(missing)}); point --images at the image "
                "folder, pass --drop-missing to drop (and record) them, or --labels-only to "
                "write the labels without checking images"
            )
        if absent.size:
            notify(f"{split}: dropped {plural(absent.size, 'missing image')} ({first_few(missing)})")
            rows = np.delete(rows, absent)
    if rows.size == 0:
        raise InputError(f"no {split} images are left after dropping images without positives "
                         "and missing images")
    report["counts"][split] = {"listed": len(part), "no_positive": int(empty.size),
                               "missing_images": len(missing), "rows": int(rows.size)}
    report["dropped_no_positive"][split] = dropped
    report["missing_images"][split] = missing
    return rows


def _check_options(source: SourceDataset, options: PrepareOptions) -> None:
    for name, value in (("--num-pos", options.num_pos), ("--num-neg", options.num_neg)):
        if value < -1:
            raise OptionError(f"{name} must be -1 (all) or >= 0, got {value}")
    if options.num_pos == 0:
        raise OptionError("--num-pos 0 would observe no positive at all; use 1 (the protocol) "
                          "or more, or -1 for all")
    given = [split for split in OFFICIAL if source.split(split).observed is not None]
    if given and (options.num_pos, options.num_neg) != (1, 0):
        raise OptionError(f"the {' and '.join(given)} labels are given observations; "
                          "--num-pos/--num-neg apply only to clean (full) labels, which featcache "
                          "observes itself")
    if options.merge is not None and any(source.split(s).clean is None for s in OFFICIAL):
        raise OptionError("a merged split needs clean labels in both official splits")
    if options.merge is not None and source.val_rows is not None:
        raise OptionError(f"{source.name} defines its own validation split; it cannot be merged")
    if options.observe in BIASED:
        if given:
            raise OptionError(f"--observe {options.observe} draws from clean labels; the "
                              f"{' and '.join(given)} labels are given single positives")
        if options.observe != "semantic" and any(source.split(split).objects is None
                                                 for split in OFFICIAL):
            raise OptionError(f"--observe {options.observe} needs object boxes, which "
                              f"{source.name} ({source.source_format}) does not have; voc, coco "
                              "and shapes have them (--observe semantic needs none)")


def _missing_images(root: Path, images: list[str], split: str) -> np.ndarray:
    """Positions in ``images`` of the files that do not exist under ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"image folder {root} does not exist; point --images at the folder "
                         "that holds the images, or pass --labels-only")
    absent = [i for i, name in enumerate(progress(images, desc=f"checking {split} images",
                                              unit=" img", mininterval=0.5, leave=False))
              if not (root / name).is_file()]
    return np.array(absent, dtype=np.int64)


def _merge_and_split(parts: dict[str, SourceSplit],
                     merge: MergedSplit) -> tuple[dict[str, SourceSplit], dict]:
    """Concatenate train and test rows, then draw ``merge.train_size`` training rows."""
    images = parts["train"].images + parts["test"].images
    clean = np.concatenate([parts["train"].clean, parts["test"].clean])
    total = len(images)
    if not 0 < merge.train_size < total:
        raise OptionError(f"--merged-train-size {merge.train_size} must be between 1 and "
                          f"{total - 1}: {plural(total, 'image is', 'images are')} left after dropping images "
                          "without positives and missing images")
    perm = np.random.RandomState(merge.seed).permutation(total)
    rows = {"train": np.sort(perm[: merge.train_size]), "test": np.sort(perm[merge.train_size:])}
    merged = SourceSplit(images, clean)
    details = {"train_size": merge.train_size, "seed": merge.seed, "rows": total,
               "test_size": total - merge.train_size}
    return {split: merged.take(rows[split]) for split in OFFICIAL}, details


def labels_file_bytes(source: SourceDataset) -> int:
    """About how large the labels file of ``source`` will be (an upper bound: no compression)."""
    rows = len(source.train) + len(source.test)
    names = sum(len(str(name).encode()) + 16 for name in source.train.images + source.test.images)
    return rows * 2 * len(source.classes) + names + (256 << 10)


#: source files that add up to less than this are hashed without a progress bar (a bar for a
#: moment's work, such as two label files, says nothing)
HASH_PROGRESS_BYTES = 256 * 2**20


def _quick_to_hash(files: list[Path]) -> bool:
    return sum(Path(file).stat().st_size for file in files) < HASH_PROGRESS_BYTES


def _describe_file(path: Path) -> dict:
    path = Path(path)
    return {"file": str(path.resolve()), "sha256": sha256_file(path), "bytes": path.stat().st_size}


def import_feature_set(npz: str | os.PathLike, name: str, labels_path: str | os.PathLike,
                       features_path: str | os.PathLike, backbone: str = "imported",
                       options: PrepareOptions | None = None, extra: dict | None = None,
                       notify: Notify | None = None) -> tuple[PrepareResult, Path]:
    """Write the labels of an ``.npz`` feature set, then its features in the stage-one format.

    The labels go through :func:`prepare_dataset` (``labels_only``: there are no images); rows
    dropped there are dropped from the features too. Both outputs are refused up front if
    they exist (unless ``overwrite``).
    """
    from featcache.data.featurewrite import features_file_bytes, write_features
    from featcache.data.formats.npz import read_npz

    options = options or PrepareOptions()
    options.labels_only = True
    for path in (labels_path, features_path):
        refuse_existing(path, options.overwrite)
    source, features = read_npz(npz, name)
    size = features_file_bytes(source.train.images + source.test.images,
                               features["train"].shape[1])
    require_space(Path(features_path).parent, size + labels_file_bytes(source),
                  f"to import {Path(npz).name}", size)
    result = prepare_dataset(source, labels_path, options, extra, notify)
    npz_file = source.source_files[0]
    attrs = {
        "backbone": backbone,
        "weights": "none",
        "source": "imported from a precomputed feature set",
        "source_npz": str(Path(npz_file).resolve()),
        "source_npz_sha256": result.provenance["sources"][0]["sha256"],
        "feature_names": source.details["feature_names"],
    }
    rows = {split: features[split][result.kept[split]] for split in OFFICIAL}
    with OutputLock(features_path, "wait for it to finish"):
        path = write_features(features_path, result.labels, rows, attrs,
                              overwrite=options.overwrite)
    return result, path
