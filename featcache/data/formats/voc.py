"""PASCAL VOC: ``VOCdevkit/VOC<year>/ImageSets/Main/<class>_<split>.txt``.

Each line of a class file is ``<image id> <flag>`` with flag 1 (present), 0 (only difficult
instances) or -1 (absent). As the protocol (and Cole et al.'s ``format_pascal.py``) says, a class
is positive only where the file says 1; 0 and -1 are negative. Rows are sorted by file name,
classes are in alphabetical order. Every class file of a split must list the same images.

With ``objects=True`` (the label-bias samplers) each image's ``Annotations/<id>.xml`` is read
too: the image size and every ``<object>``'s class and ``<bndbox>``, in file order, the box
turned into COCO's (x, y, w, h) and its area w * h (VOC has no segmentation area).
"""

from __future__ import annotations

import hashlib
import os
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np

from featcache.data.formats import (
    SourceDataset,
    SourceSplit,
    check_unique,
    first_few,
    malformed,
    parse_int,
    read_lines,
    require_dir,
    require_file,
)
from featcache.data.objects import ImageObjects, voc_box
from featcache.errors import InputError, OptionError

VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)


def read_voc(root: str | os.PathLike, year: str = "2012", train_split: str = "train",
             test_split: str = "val", images: str | os.PathLike | None = None,
             objects: bool = False) -> SourceDataset:
    """Read the VOC image-level labels of ``train_split`` (training) and ``test_split`` (test).

    ``root`` is the folder that holds ``VOCdevkit``, ``VOCdevkit`` itself or its
    ``VOC<year>`` folder; images are looked for in ``VOCdevkit/VOC<year>/JPEGImages`` unless
    ``images`` names another folder.
    ``objects`` also reads every image's boxes from ``Annotations/<id>.xml``.
    """
    if train_split == test_split:
        raise OptionError(f"--train-split and --test-split are both {train_split!r}; "
                          "the training and test sets must be different ImageSets")
    root = require_dir(root, "VOC root", "pass the folder that contains VOCdevkit/")
    year_dir = _year_dir(root, str(year))
    main = require_dir(year_dir / "ImageSets" / "Main", "VOC list folder",
                       f"is --year {year} right? --root is the VOC{year} folder, the VOCdevkit "
                       "folder holding it, or the folder holding VOCdevkit")
    splits, files = {}, []
    for split in (train_split, test_split):
        splits[split], read = _read_split(main, split)
        files += read
    details: dict[str, object] = {"year": str(year), "train_split": train_split,
                                  "test_split": test_split}
    if objects:
        folder = require_dir(year_dir / "Annotations", "VOC annotation folder",
                             "the label-bias samplers read the boxes of Annotations/<id>.xml")
        digest = hashlib.sha256()
        for split in (train_split, test_split):
            splits[split].objects = [read_annotation(folder / f"{image[:-len('.jpg')]}.xml", digest)
                                     for image in splits[split].images]
        details["annotations"] = {"folder": str(folder.resolve()),
                                  "files": sum(len(splits[s].images) for s in splits),
                                  "sha256": digest.hexdigest()}
    return SourceDataset(
        name="voc",
        source_format="voc",
        classes=list(VOC_CLASSES),
        train=splits[train_split],
        test=splits[test_split],
        image_root=Path(images) if images else year_dir / "JPEGImages",
        source_files=files,
        details=details,
    )


def _year_dir(root: Path, year: str) -> Path:
    """``VOC<year>`` from ``root``: the folder holding VOCdevkit, VOCdevkit, or VOC<year> itself."""
    if re.fullmatch(r"VOC\d{4}", root.name) and (root / "ImageSets").is_dir():
        if root.name != f"VOC{year}":
            raise InputError(f"--root {root} is the {root.name} folder but --year is {year}: pass "
                             f"--year {root.name[3:]}, or the VOC{year} folder")
        return root
    if (root / f"VOC{year}").is_dir() or root.name == "VOCdevkit":
        return root / f"VOC{year}"
    return root / "VOCdevkit" / f"VOC{year}"


def _read_split(main: Path, split: str) -> tuple[SourceSplit, list[Path]]:
    """Labels of one ImageSet: rows sorted by file name, 1 only where a class file says 1."""
    flags: dict[str, dict[str, int]] = {}
    files = []
    reference: tuple[Path, set[str]] | None = None
    for name in VOC_CLASSES:
        path = require_file(main / f"{name}_{split}.txt", f"VOC class list for split {split!r}",
                            f"every class needs <class>_{split}.txt in {main}")
        ids, lines, values = [], [], []
        for line, text in read_lines(path):
            fields = text.split()
            if len(fields) != 2:
                raise malformed(path, line, f"expected '<image id> <-1|0|1>', got {text.strip()!r}")
            ids.append(fields[0])
            lines.append(line)
            values.append(parse_int(fields[1], path, line, "flag", allowed=(-1, 0, 1)))
        if not ids:
            raise InputError(f"{path} lists no images")
        check_unique(ids, lines, path, "image id")
        if reference is None:
            reference = (path, set(ids))
        elif set(ids) != reference[1]:
            missing = sorted(reference[1] - set(ids))
            extra = sorted(set(ids) - reference[1])
            what = (f"lacks {first_few(missing)}" if missing else "") + \
                   ("; " if missing and extra else "") + \
                   (f"has {first_few(extra)} not in {reference[0].name}" if extra else "")
            raise InputError(f"{path} and {reference[0]} list different images: {path.name} "
                             f"{what}. Every class file of a split must list the same images.")
        flags[name] = dict(zip(ids, values, strict=True))
        files.append(path)
    assert reference is not None  # VOC_CLASSES is not empty
    images = sorted(f"{image_id}.jpg" for image_id in reference[1])
    clean = np.zeros((len(images), len(VOC_CLASSES)), dtype=np.uint8)
    for column, name in enumerate(VOC_CLASSES):
        flag_of = flags[name]
        clean[:, column] = [flag_of[image[: -len(".jpg")]] == 1 for image in images]
    return SourceSplit(images, clean), files


def read_annotation(path: Path, digest=None) -> ImageObjects:
    """One ``Annotations/<id>.xml``: the image size and its objects' classes and boxes.

    ``digest`` (a hashlib object) is fed the file's bytes, for the provenance.
    """
    path = require_file(path, "VOC annotation file",
                        "the label-bias samplers need Annotations/<id>.xml for every image")
    data = path.read_bytes()
    if digest is not None:
        digest.update(data)
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise InputError(f"{path}: not valid XML ({exc})") from None
    objects = ImageObjects(_number(path, root, "size/width"), _number(path, root, "size/height"))
    column = {name: i for i, name in enumerate(VOC_CLASSES)}
    for index, element in enumerate(root.findall("object"), start=1):
        name = (element.findtext("name") or "").strip()
        if name not in column:
            raise InputError(f"{path}: object {index} has class {name!r}, not a VOC class")
        corners = [_number(path, element, f"bndbox/{key}", index)
                   for key in ("xmin", "ymin", "xmax", "ymax")]
        box = voc_box(*corners)
        if box[2] <= 0 or box[3] <= 0:
            raise InputError(f"{path}: object {index} ({name}) has an empty box {corners}")
        objects.add(column[name], box, box[2] * box[3])
    return objects


def _number(path: Path, element, key: str, index: int | None = None) -> float:
    text = element.findtext(key)
    where = f"object {index} " if index is not None else ""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"{path}: {where}<{key}> is {text!r}, expected a number") from None
    return value
