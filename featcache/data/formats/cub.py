"""CUB-200-2011 attributes: 312 binary attributes per image as multi-label classes.

Official archive layout: ``<root>/attributes.txt`` (``<id> <name>``, next to the
``CUB_200_2011`` folder) and, in ``<root>/CUB_200_2011``, ``images.txt`` (``<id> <path>``),
``train_test_split.txt`` (``<id> <1 train | 0 test>``) and
``attributes/image_attribute_labels.txt`` (``<image id> <attribute id> <is_present>
<certainty id> <time>``). ``is_present`` is the label, certainty is ignored. A handful of label
lines carry one extra field before the time; only the first three fields are used. Labels are
indexed by (image id, attribute id), not by line order, and every pair must be present.
Rows follow the order of ``images.txt``; classes follow ``attributes.txt``.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import numpy as np

from featcache.data.formats import (
    SourceDataset,
    SourceSplit,
    check_unique,
    iter_lines,
    malformed,
    parse_int,
    read_lines,
    require_dir,
    require_file,
)
from featcache.errors import InputError, plural
from featcache.progress import progress

#: fields of a label line: image id, attribute id, is_present, certainty id, [extra,] time
LABEL_FIELDS = (5, 6)


def read_cub(root: str | os.PathLike, images: str | os.PathLike | None = None) -> SourceDataset:
    """Read the official train/test split and the 312 attribute labels of every image.

    ``root`` is the folder that holds ``attributes.txt`` and ``CUB_200_2011/``; images are
    looked for in ``<root>/CUB_200_2011/images`` unless ``images`` names another folder.
    """
    root = require_dir(root, "CUB root", "pass the folder that contains CUB_200_2011/ and "
                       "attributes.txt (the top folder of the official archive)")
    base = require_dir(root / "CUB_200_2011", "CUB folder",
                       "--root must contain CUB_200_2011/ (as unpacked from CUB_200_2011.tgz)")
    names_path = require_file(root / "attributes.txt", "CUB attribute list",
                              "the official archive has it next to the CUB_200_2011 folder")
    images_path = require_file(base / "images.txt", "CUB image list")
    split_path = require_file(base / "train_test_split.txt", "CUB train/test split")
    labels_path = require_file(base / "attributes" / "image_attribute_labels.txt",
                               "CUB attribute labels")

    attribute_ids, classes = _read_id_table(names_path, "attribute id")
    image_ids, paths = _read_id_table(images_path, "image id")
    is_train = _read_split(split_path, image_ids)
    clean = _read_labels(labels_path, image_ids, attribute_ids)
    train_rows = np.flatnonzero(is_train)
    test_rows = np.flatnonzero(~is_train)
    if train_rows.size == 0 or test_rows.size == 0:
        raise InputError(f"{split_path} puts every image in the "
                         f"{'test' if train_rows.size == 0 else 'training'} set")
    return SourceDataset(
        name="cub",
        source_format="cub",
        classes=classes,
        train=SourceSplit([paths[i] for i in train_rows], clean[train_rows]),
        test=SourceSplit([paths[i] for i in test_rows], clean[test_rows]),
        image_root=Path(images) if images else base / "images",
        source_files=[names_path, images_path, split_path, labels_path],
        details={"train_split": "train_test_split.txt is_training_image=1",
                 "test_split": "train_test_split.txt is_training_image=0"},
    )


def _read_id_table(path: Path, what: str) -> tuple[list[int], list[str]]:
    """Lines ``<integer id> <text>``: the ids and texts in file order (ids unique)."""
    ids, texts, lines = [], [], []
    for line, text in read_lines(path):
        fields = text.split(maxsplit=1)
        if len(fields) != 2:
            raise malformed(path, line, f"expected '<{what}> <name>', got {text.strip()!r}")
        ids.append(parse_int(fields[0], path, line, what))
        texts.append(fields[1].strip())
        lines.append(line)
    if not ids:
        raise InputError(f"{path} is empty")
    check_unique([str(i) for i in ids], lines, path, what)
    return ids, texts


def _read_split(path: Path, image_ids: list[int]) -> np.ndarray:
    """A boolean per image of ``images.txt``: True for the training set."""
    flag: dict[int, bool] = {}
    for line, text in read_lines(path):
        fields = text.split()
        if len(fields) != 2:
            raise malformed(path, line, f"expected '<image id> <0|1>', got {text.strip()!r}")
        image_id = parse_int(fields[0], path, line, "image id")
        if image_id in flag:
            raise malformed(path, line, f"image id {image_id} is listed twice")
        flag[image_id] = parse_int(fields[1], path, line, "is_training_image", (0, 1)) == 1
    absent = [i for i in image_ids if i not in flag]
    if absent:
        raise InputError(f"{path} has no entry for image id {absent[0]} of images.txt "
                         f"({plural(len(absent), 'image lacks', 'images lack')} one)")
    return np.array([flag[i] for i in image_ids], dtype=bool)


def _read_labels(path: Path, image_ids: list[int], attribute_ids: list[int]) -> np.ndarray:
    """The (images x attributes) 0/1 matrix, indexed by (image id, attribute id)."""
    columns = {name: array("q") for name in ("line", "image", "attribute", "present")}
    for line, text in progress(iter_lines(path), desc="CUB labels", unit=" line",
                           mininterval=0.5, leave=False):
        fields = text.split()
        if len(fields) not in LABEL_FIELDS:
            raise malformed(path, line, "expected '<image id> <attribute id> <is_present> "
                            f"<certainty id> <time>', got {plural(len(fields), 'field')}")
        try:
            values = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            for token, what in zip(fields[:3], ("image id", "attribute id", "is_present"),
                                   strict=True):
                parse_int(token, path, line, what)  # raises, naming the bad field
            raise
        columns["line"].append(line)
        columns["image"].append(values[0])
        columns["attribute"].append(values[1])
        columns["present"].append(values[2])
    lines, image, attribute, present = (np.frombuffer(columns[name], dtype=np.int64)
                                        for name in ("line", "image", "attribute", "present"))
    rows = _positions(image, image_ids)
    cols = _positions(attribute, attribute_ids)
    for bad, what, value, source in ((rows < 0, "image id", image, "images.txt"),
                                     (cols < 0, "attribute id", attribute, "attributes.txt")):
        if bad.any():
            first = np.argmax(bad)
            raise malformed(path, int(lines[first]), f"{what} {value[first]} is not in {source}")
    bad = (present != 0) & (present != 1)
    if bad.any():
        first = np.argmax(bad)
        raise malformed(path, int(lines[first]), f"is_present is {present[first]}; expected 0 or 1")
    # Which line labels each (image, attribute) pair: 0 where none does.
    line_of = np.zeros((len(image_ids), len(attribute_ids)), dtype=np.int64)
    flat = rows * len(attribute_ids) + cols
    order = np.argsort(flat, kind="stable")
    repeated = np.flatnonzero(np.diff(flat[order]) == 0)
    if repeated.size:
        first, second = order[repeated[0]], order[repeated[0] + 1]
        raise malformed(path, int(lines[second]), f"image {image[second]}, attribute "
                        f"{attribute[second]} is labelled twice (first on line {lines[first]})")
    line_of.flat[flat] = lines
    missing = np.argwhere(line_of == 0)
    if missing.size:
        row, col = missing[0]
        raise InputError(f"{path} has no label for image id {image_ids[row]}, attribute id "
                         f"{attribute_ids[col]} ({plural(len(missing), '(image, attribute) pair lacks', '(image, attribute) pairs lack')} "
                         "one); the file may be truncated")
    clean = np.zeros(line_of.shape, dtype=np.uint8)
    clean.flat[flat] = present
    return clean


def _positions(values: np.ndarray, ids: list[int]) -> np.ndarray:
    """The index of each value in ``ids``, -1 where it is not there."""
    known = np.asarray(ids, dtype=np.int64)
    order = np.argsort(known)
    found = np.searchsorted(known, values, sorter=order)
    found = np.clip(found, 0, len(known) - 1)
    index = order[found]
    return np.where(known[index] == values, index, -1)
