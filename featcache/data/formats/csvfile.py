"""Users' own data: one CSV file per official split.

Two label styles, told apart by the header:

- full labels: ``image,<class 1>,<class 2>,...`` with a 0 or 1 per class;
- real single positives: ``image,label`` with one class name per row. No clean labels exist
  then; the observed labels are taken as given.

Image paths are relative to the ``--images`` folder. The class order is the header's (full
labels), else that of ``--classes FILE`` (one name per line), else the sorted names of the
training file's single positives. Both files must agree on the classes.
"""

from __future__ import annotations

import csv
import io
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featcache.data.formats import (
    SourceDataset,
    SourceSplit,
    check_same_classes,
    check_unique,
    first_few,
    malformed,
    read_lines,
    require_file,
)
from featcache.errors import InputError, did_you_mean, plural

SINGLE_HEADER = ["image", "label"]


@dataclass
class _CsvFile:
    """One parsed file: its images and the line of each."""

    path: Path
    images: list[str]
    lines: list[int]


@dataclass
class _FullLabels(_CsvFile):
    """A file of full labels: the ``header`` classes, a 0/1 ``matrix`` row per image."""

    header: list[str]
    matrix: np.ndarray


@dataclass
class _SinglePositives(_CsvFile):
    """A file of single positives: one class name per image."""

    positives: list[str]


_CsvLabels = _FullLabels | _SinglePositives


def read_csv_dataset(train: str | os.PathLike, test: str | os.PathLike, images: str | os.PathLike,
                     name: str, classes_file: str | os.PathLike | None = None) -> SourceDataset:
    """Read a training and a test CSV file (either label style each) into one dataset."""
    parsed = {"train": _read_file(require_file(train, "training CSV file")),
              "test": _read_file(require_file(test, "test CSV file"))}
    files = [parsed["train"].path, parsed["test"].path]
    if classes_file is not None:
        path = require_file(classes_file, "class list")
        entries = read_lines(path)
        classes = [text.strip() for _, text in entries]
        check_unique(classes, [line for line, _ in entries], path, "class")
        files.append(path)
        where = path.name
    else:
        full = [part for part in parsed.values() if isinstance(part, _FullLabels)]
        single = [part for part in parsed.values() if isinstance(part, _SinglePositives)]
        if full:
            classes, where = full[0].header, full[0].path.name
        else:  # both files hold single positives: the training file's names
            classes = sorted(set(single[0].positives))
            where = f"the labels of {single[0].path.name}"
    for part in parsed.values():
        if isinstance(part, _SinglePositives):
            _check_known(part, classes, where)
        else:
            check_same_classes(classes, part.header, where, part.path.name)
    if not classes:
        raise InputError(f"{where} names no classes")
    _check_disjoint(parsed["train"], parsed["test"])
    splits = {role: _to_split(part, classes) for role, part in parsed.items()}
    return SourceDataset(
        name=name,
        source_format="csv",
        classes=list(classes),
        train=splits["train"],
        test=splits["test"],
        image_root=Path(images),
        source_files=files,
        details={"label_style": {
            role: "single positive" if isinstance(part, _SinglePositives) else "full"
            for role, part in parsed.items()}},
    )


def _read_file(path: Path) -> _CsvLabels:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text (save it as UTF-8 CSV)") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = [cell.strip() for cell in next(reader)]
    except StopIteration:
        raise InputError(f"{path} is empty; expected a header 'image,<class>,...' or "
                         "'image,label'") from None
    except csv.Error as exc:
        raise malformed(path, reader.line_num, f"not valid CSV ({exc})") from None
    if len(header) < 2 or header[0] != "image":
        raise malformed(path, 1, "the header must be 'image,<class 1>,<class 2>,...' (full "
                        f"labels) or 'image,label' (single positives), got {','.join(header)!r}")
    single = header == SINGLE_HEADER
    if not single:
        check_unique(header[1:], [1] * (len(header) - 1), path, "class in the header")
    images: list[str] = []
    lines: list[int] = []
    positives: list[str] = []  # single positives
    rows: list[list[bool]] = []  # full labels
    try:
        for record in reader:
            if not any(cell.strip() for cell in record):
                continue
            line = reader.line_num
            if len(record) != len(header):
                raise malformed(path, line, f"{plural(len(record), 'field')}, but the header has "
                                f"{len(header)}")
            image = record[0].strip()
            if not image:
                raise malformed(path, line, "the image path is empty")
            images.append(image)
            lines.append(line)
            if single:
                positives.append(record[1].strip())
            else:
                rows.append(_binary_row(record, header, path, line))
    except csv.Error as exc:
        raise malformed(path, reader.line_num, f"not valid CSV ({exc})") from None
    if not images:
        raise InputError(f"{path} has a header but no rows")
    check_unique(images, lines, path, "image")
    if single:
        empty = [line for line, label in zip(lines, positives, strict=True) if not label]
        if empty:
            raise malformed(path, empty[0], "the label is empty")
        return _SinglePositives(path, images, lines, positives=positives)
    return _FullLabels(path, images, lines, header=header[1:],
                       matrix=np.array(rows, dtype=np.uint8))


def _binary_row(record: list[str], header: list[str], path: Path, line: int) -> list[bool]:
    values = []
    for cell, column in zip(record[1:], header[1:], strict=True):
        cell = cell.strip()
        if cell not in ("0", "1"):
            raise malformed(path, line, f"column {column!r} holds {cell!r}; full labels must be "
                            "0 or 1 (use the 'image,label' style for single positives)")
        values.append(cell == "1")
    return values


def _check_known(part: _SinglePositives, classes: list[str], where: str) -> None:
    known = set(classes)
    unknown = [(line, label) for line, label in zip(part.lines, part.positives, strict=True)
               if label not in known]
    if unknown:
        line, label = unknown[0]
        names = sorted({label for _, label in unknown})
        guess = did_you_mean(label, classes)
        fix = (" If not, pass" if guess else "; pass") + " --classes FILE to give the full class list"
        raise malformed(part.path, line, f"label {label!r} is not a class of {where} (unknown "
                        f"labels: {first_few(names)}){guess}{fix}")


def _check_disjoint(train: _CsvLabels, test: _CsvLabels) -> None:
    """Refuse images listed in both files: test mAP would be measured on training images."""
    train_lines = {posixpath.normpath(image): line
                   for image, line in zip(train.images, train.lines, strict=True)}
    shared = [(image, line) for image, line in zip(test.images, test.lines, strict=True)
              if posixpath.normpath(image) in train_lines]
    if shared:
        image, line = shared[0]
        raise malformed(test.path, line, f"{image} is also in {train.path} (line "
                        f"{train_lines[posixpath.normpath(image)]}); "
                        f"{plural(len(shared), 'image')} of the test file "
                        f"{'is' if len(shared) == 1 else 'are'} training images "
                        f"({first_few([name for name, _ in shared])}), so test mAP would be "
                        "measured on images the heads trained on: list each image in one file")


def _to_split(part: _CsvLabels, classes: list[str]) -> SourceSplit:
    if isinstance(part, _FullLabels):
        return SourceSplit(part.images, part.matrix)
    column = {name: index for index, name in enumerate(classes)}
    observed = np.zeros((len(part.images), len(classes)), dtype=np.int8)
    observed[np.arange(len(part.images)), [column[label] for label in part.positives]] = 1
    return SourceSplit(part.images, None, observed)
