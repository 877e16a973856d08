"""MS-COCO 2014: ``annotations/instances_{train,val}2014.json``.

As the protocol (and Cole et al.'s ``format_coco.py``) says: a class is positive for an image
when the image has at least one annotation of it; classes follow the order of the
``categories`` list; rows are ordered by image id sorted **as strings** ("10" < "9"); the image
path is ``<split>2014/COCO_<split>2014_<id zero-padded to 12>.jpg``. Images listed without any
annotation are read as rows without positives (the shared pipeline drops and counts them).

With ``objects=True`` (the label-bias samplers) each image's annotations are also kept, in file
order: category, ``bbox`` (x, y, w, h) and ``area`` (the segmentation area, as Arroyo et al.
use it), with the image's ``width`` and ``height``; crowd annotations count like the others.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from featcache.data.formats import (
    SourceDataset,
    SourceSplit,
    check_same_classes,
    require_dir,
    require_file,
)
from featcache.data.objects import ImageObjects
from featcache.errors import InputError

#: official split -> its role in the protocol
COCO_SPLITS = {"train": "train", "val": "test"}


def read_coco(root: str | os.PathLike, images: str | os.PathLike | None = None,
              objects: bool = False) -> SourceDataset:
    """Read train2014 (training) and val2014 (test) from ``<root>/annotations``.

    Images are looked for under ``<root>`` (``train2014/``, ``val2014/``) unless ``images``
    names another folder with the same two subfolders. ``objects`` also reads every image's
    boxes (``SourceSplit.objects``).
    """
    root = require_dir(root, "COCO root", "pass the folder that contains annotations/")
    annotations = require_dir(root / "annotations", "COCO annotation folder",
                              "--root must contain annotations/instances_train2014.json")
    splits, files, categories = {}, [], {}
    for split in COCO_SPLITS:
        path = require_file(annotations / f"instances_{split}2014.json", "COCO annotation file")
        categories[split], splits[split] = _read_split(path, split, objects)
        files.append(path)
    check_same_classes([f"{i}:{n}" for i, n in categories["train"]],
                       [f"{i}:{n}" for i, n in categories["val"]],
                       files[0].name, files[1].name)
    return SourceDataset(
        name="coco",
        source_format="coco",
        classes=[name for _, name in categories["train"]],
        train=splits["train"],
        test=splits["val"],
        image_root=Path(images) if images else root,
        source_files=files,
        details={"train_split": "train2014", "test_split": "val2014"},
    )


def _load_json(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}, line {exc.lineno} column {exc.colno}: not valid JSON "
                         f"({exc.msg}); the file may be truncated or damaged") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 JSON (a binary or damaged file?)") from None
    except OSError as exc:
        raise InputError(f"{path} could not be read: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object with 'images', 'annotations' and "
                         f"'categories', found a {type(data).__name__}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise InputError(f"{path}: the key {key!r} is missing or not a list; is this a COCO "
                             "instances_*.json file?")
    return data


def _field(path: Path, key: str, index: int, entry, name: str):
    """``entry[name]`` as an int; the error names the file, list and entry index."""
    if not isinstance(entry, dict) or name not in entry:
        raise InputError(f"{path}: {key}[{index}] has no {name!r}")
    value = entry[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{path}: {key}[{index}].{name} is {value!r}, expected an integer")
    return value


def _number(path: Path, key: str, index: int, entry: dict, name: str) -> float:
    """``entry[name]`` as a finite number >= 0; the error names the file, list and entry index."""
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise InputError(f"{path}: {key}[{index}].{name} is {value!r}, expected a number >= 0 "
                         "(the label-bias samplers read the boxes)")
    return float(value)


def _box(path: Path, index: int, entry: dict) -> tuple[float, float, float, float]:
    bbox = entry.get("bbox")
    if (not isinstance(bbox, list) or len(bbox) != 4 or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            for v in bbox)):
        raise InputError(f"{path}: annotations[{index}].bbox is {bbox!r}, expected "
                         "[x, y, width, height]")
    x, y, width, height = bbox
    return float(x), float(y), float(width), float(height)


def _read_split(path: Path, split: str,
                objects: bool = False) -> tuple[list[tuple[int, str]], SourceSplit]:
    data = _load_json(path)
    categories: list[tuple[int, str]] = []
    column: dict[int, int] = {}
    for index, entry in enumerate(data["categories"]):
        category_id = _field(path, "categories", index, entry, "id")
        if category_id in column:
            raise InputError(f"{path}: categories[{index}] repeats category id {category_id}")
        if not isinstance(entry.get("name"), str):
            raise InputError(f"{path}: categories[{index}] has no 'name'")
        column[category_id] = len(categories)
        categories.append((category_id, entry["name"]))
    if not categories:
        raise InputError(f"{path}: the 'categories' list is empty")
    row_of: dict[int, int] = {}
    boxes: dict[int, ImageObjects] = {}
    for index, entry in enumerate(data["images"]):
        image_id = _field(path, "images", index, entry, "id")
        if image_id in row_of:
            raise InputError(f"{path}: images[{index}] repeats image id {image_id}; image ids "
                             "must be unique")
        row_of[image_id] = -1
        if objects:
            boxes[image_id] = ImageObjects(_number(path, "images", index, entry, "width"),
                                           _number(path, "images", index, entry, "height"))
    # Rows in the order of the ids sorted as strings, as the reference formatter does.
    ids = sorted(row_of, key=str)
    for row, image_id in enumerate(ids):
        row_of[image_id] = row
    clean = np.zeros((len(ids), len(categories)), dtype=np.uint8)
    for index, entry in enumerate(data["annotations"]):
        image_id = _field(path, "annotations", index, entry, "image_id")
        category_id = _field(path, "annotations", index, entry, "category_id")
        if image_id not in row_of:
            raise InputError(f"{path}: annotations[{index}] refers to image id {image_id}, "
                             "which the 'images' list does not hold")
        if category_id not in column:
            raise InputError(f"{path}: annotations[{index}] refers to category id "
                             f"{category_id}, which the 'categories' list does not hold")
        clean[row_of[image_id], column[category_id]] = 1
        if objects:
            boxes[image_id].add(column[category_id], _box(path, index, entry),
                                _number(path, "annotations", index, entry, "area"))
    images = [f"{split}2014/COCO_{split}2014_{image_id:012d}.jpg" for image_id in ids]
    return categories, SourceSplit(images, clean,
                                   objects=[boxes[i] for i in ids] if objects else None)
