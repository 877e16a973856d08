"""The Merlin L48 spectrogram benchmark (Sun, Maji, Van Horn, NeurIPS 2025 D&B), as its
benchmarking code reads it (``cvl-umass/l48-benchmarking``: ``datasets/format_ML48S.py`` writes
the layout, ``datasets/dataset.py`` loads it).

The layout, one folder (the code's ``data/ml48s``)::

    formatted_metadata.json                 {"category_list": [100 species codes], ...}
    {train,val,test}_images.npy             (n,) image paths relative to the folder
                                            (images/<asset id>/<clip>.jpg)
    {train,val,test}_labels.npy             (n, 100) 1 = species present in the clip
    <variant>_{train,val,test}_mask.npy     (n, 100) 1 = this entry's label is known

with the variants ``full`` (every species but the clip's unknown ones), ``target`` (the
recording's target species, only where it is present: real single positives), ``checklist``
(the target, plus negatives for every species missing from the recording's eBird checklist)
and ``geo`` (the target, plus negatives for every species outside the range prior). A known
entry is an observed positive where the label is 1 and an observed **negative** where it is 0:
L48's negatives are real, not assumed.

What featcache makes of it (docs/prepare.md):

- the official train set is L48's ``train`` and ``val`` clips; the validation split is L48's
  own (10 training assets per species, ``val_split.npy``), not a seeded 80/20 draw;
- observed training labels: the chosen variant's known entries (1, -1, 0 unknown), kept as
  given; clean labels: ``labels.npy`` (present species; an unknown species counts as absent,
  as in that matrix);
- as the benchmark's ``train.py``: training clips whose variant mask is all zero are dropped
  (``--remove-unannotated``, its default), and validation and test clips are scored only when
  fully annotated (its ``run_stats`` keeps the rows whose full mask is all ones); the
  protocol then drops clips without any present species (counted in the provenance).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featcache.data.formats import (
    SourceDataset,
    SourceSplit,
    first_few,
    require_dir,
    require_file,
)
from featcache.data.formats.npz import load_numpy
from featcache.errors import InputError, plural

VARIANTS = ("target", "checklist", "geo", "full")
SPLITS = ("train", "val", "test")
METADATA = "formatted_metadata.json"
HINT = ("run the benchmark's `python datasets/format_ML48S.py --load-path <L48 download> "
        "--save-path <folder>` first (github.com/cvl-umass/l48-benchmarking)")


def read_l48(root: str | os.PathLike, variant: str = "target",
             images: str | os.PathLike | None = None, name: str = "l48") -> SourceDataset:
    """Read the formatted L48 folder ``root`` with the observed labels of ``variant``."""
    if variant not in VARIANTS:
        raise InputError(f"unknown L48 variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    root = require_dir(root, "L48 folder", HINT)
    classes = _classes(require_file(root / METADATA, "L48 metadata file", HINT))
    files, parts = [root / METADATA], {}
    for split in SPLITS:
        paths = {kind: require_file(root / f"{kind}.npy", f"L48 {split} file", HINT) for kind in
                 (f"{split}_images", f"{split}_labels", f"{variant}_{split}_mask",
                  f"full_{split}_mask")}
        files += list(dict.fromkeys(paths.values()))
        parts[split] = _split(paths, split, variant, len(classes))
    train, val, test = (parts[split].rows for split in SPLITS)
    return SourceDataset(
        name=name, source_format="l48", classes=classes,
        train=SourceSplit(train.images + val.images,
                          np.concatenate([train.clean, val.clean]),
                          np.concatenate([train.observed, val.observed])),
        test=test, image_root=Path(images) if images is not None else root,
        source_files=files,
        details={"variant": variant, "layout": "cvl-umass/l48-benchmarking format_ML48S.py",
                 "clips": {split: parts[split].listed for split in SPLITS},
                 "dropped_unannotated_train": parts["train"].dropped,
                 "dropped_not_fully_annotated": {"val": parts["val"].dropped,
                                                 "test": parts["test"].dropped},
                 "validation": "L48's val clips (val_split.npy assets)"},
        val_rows=np.arange(len(train), len(train) + len(val)))


@dataclass
class _Part:
    """One L48 split after the benchmark's own row rules, with what they dropped."""

    rows: SourceSplit
    listed: int
    dropped: int


def _split(paths: dict[str, Path], split: str, variant: str, classes: int) -> _Part:
    images = _load(paths[f"{split}_images"], 1)
    labels = _load(paths[f"{split}_labels"], 2, classes, len(images), (0, 1))
    mask = _load(paths[f"{variant}_{split}_mask"], 2, classes, len(images), (0, 1))
    full = _load(paths[f"full_{split}_mask"], 2, classes, len(images), (0, 1))
    labels, mask, full = (a.astype(bool) for a in (labels, mask, full))
    if split == "train":  # train.py: --remove-unannotated (its default)
        keep = mask.any(axis=1)
    else:  # run_stats: only clips whose full mask is all ones are scored
        keep = full.all(axis=1)
    observed = np.where(mask, np.where(labels, 1, -1), 0).astype(np.int8)
    return _Part(SourceSplit([str(p) for p in images[keep]], labels[keep].astype(np.uint8),
                             observed[keep]), len(images), int((~keep).sum()))


def _load(path: Path, ndim: int, classes: int | None = None, rows: int | None = None,
          values: tuple[int, ...] | None = None) -> np.ndarray:
    """One ``.npy`` array, checked: its rank, columns, rows and values (the error names the file)."""
    try:
        array = load_numpy(path, ".npy array")
    except InputError as exc:
        raise InputError(f"{exc}; {HINT}") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"{path} is a .npz archive, not a .npy array; {HINT}")
    if array.ndim != ndim:
        raise InputError(f"{path} holds a {array.ndim}-d array of shape {array.shape}; expected "
                         f"{'one image path per clip' if ndim == 1 else '(clips, classes)'}")
    if rows is not None and array.shape[0] != rows:
        raise InputError(f"{path} has {plural(array.shape[0], 'row')} but its split lists "
                         f"{plural(rows, 'image')}")
    if classes is not None and array.shape[1] != classes:
        raise InputError(f"{path} has {plural(array.shape[1], 'column')} but {METADATA} lists "
                         f"{plural(classes, 'class', 'classes')}")
    if values is not None:
        bad = ~np.isin(array, values)
        if bad.any():
            row, column = np.argwhere(bad)[0]
            value = array[row, column].item()
            raise InputError(f"{path}: row {row}, column {column} holds {value!r}; expected "
                             f"{' or '.join(map(str, values))}")
    if ndim == 1 and array.dtype.kind not in "US":
        raise InputError(f"{path} holds values of dtype {array.dtype}, not image paths")
    return array


def _classes(path: Path) -> list[str]:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not readable JSON ({exc})") from None
    names = meta.get("category_list") if isinstance(meta, dict) else None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"{path} has no 'category_list' of species codes")
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"{path}: species codes repeated in 'category_list' "
                         f"({first_few(repeated)})")
    return names
