"""NUS-WIDE: the official 81-concept ground truth and train/test image lists.

Official layout under ``<root>``: ``ImageList/TrainImagelist.txt`` and
``ImageList/TestImagelist.txt`` (one Windows-style path per line, ``actor\\0001_2124494179.jpg``;
turned into ``actor/0001_2124494179.jpg``), ``Concepts81.txt`` (the 81 concept names, one per
line; also found as ``ConceptsList/Concepts81.txt``) and
``Groundtruth/TrainTestLabels/Labels_<concept>_{Train,Test}.txt`` (one 0/1 per line, aligned with
the image list). Images are looked for in ``<root>/Flickr``.

Flickr images disappear over time, so every copy of NUS-WIDE lacks some: the protocol drops
missing images and counts them (the shared pipeline always does so for this dataset).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from featcache.data.formats import (
    SourceDataset,
    SourceSplit,
    check_unique,
    malformed,
    read_lines,
    require_dir,
    require_file,
)
from featcache.errors import InputError, plural
from featcache.progress import progress

#: official split name in the file names -> role in the protocol
NUS_SPLITS = {"Train": "train", "Test": "test"}
CONCEPT_FILES = ("Concepts81.txt", "ConceptsList/Concepts81.txt")


def read_nuswide(root: str | os.PathLike, images: str | os.PathLike | None = None) -> SourceDataset:
    """Read the official train (161,789) and test (107,859) lists with their 81 concepts."""
    root = require_dir(root, "NUS-WIDE root", "pass the folder that contains ImageList/, "
                       "Groundtruth/ and Concepts81.txt")
    concepts_path = next((root / name for name in CONCEPT_FILES if (root / name).is_file()), None)
    if concepts_path is None:
        raise InputError(f"NUS-WIDE concept list is missing: looked for "
                         f"{' and '.join(str(root / name) for name in CONCEPT_FILES)}")
    concept_lines = read_lines(concepts_path)
    classes = [text.strip() for _, text in concept_lines]
    if not classes:
        raise InputError(f"{concepts_path} lists no concepts")
    check_unique(classes, [line for line, _ in concept_lines], concepts_path, "concept")
    labels_dir = require_dir(root / "Groundtruth" / "TrainTestLabels", "NUS-WIDE label folder",
                             "--root must contain Groundtruth/TrainTestLabels/")
    files = [concepts_path]
    splits = {}
    for official, role in NUS_SPLITS.items():
        list_path = require_file(root / "ImageList" / f"{official}Imagelist.txt",
                                 "NUS-WIDE image list")
        image_list = _read_image_list(list_path)
        files.append(list_path)
        clean = np.zeros((len(image_list), len(classes)), dtype=np.uint8)
        for column, concept in enumerate(progress(classes, desc=f"NUS-WIDE {official} labels",
                                              unit=" concept", mininterval=0.5, leave=False)):
            path = require_file(labels_dir / f"Labels_{concept}_{official}.txt",
                                f"NUS-WIDE labels of concept {concept!r}",
                                f"every concept of {concepts_path.name} needs one per split")
            clean[:, column] = _read_label_column(path, len(image_list), list_path)
            files.append(path)
        splits[role] = SourceSplit(image_list, clean)
    return SourceDataset(
        name="nuswide",
        source_format="nuswide",
        classes=classes,
        train=splits["train"],
        test=splits["test"],
        image_root=Path(images) if images else root / "Flickr",
        source_files=files,
        details={"train_split": "TrainImagelist.txt", "test_split": "TestImagelist.txt"},
    )


def _read_image_list(path: Path) -> list[str]:
    lines, names = [], []
    for line, text in read_lines(path):
        name = text.strip().replace("\\", "/")
        if " " in name or "\t" in name:
            raise malformed(path, line, f"expected one image path, got {text.strip()!r}")
        lines.append(line)
        names.append(name)
    if not names:
        raise InputError(f"{path} lists no images")
    check_unique(names, lines, path, "image")
    return names


def _read_label_column(path: Path, expected: int, list_path: Path) -> np.ndarray:
    """One concept's 0/1 column: exactly one ``0`` or ``1`` per line, one line per image."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise InputError(f"{path} could not be read: {exc.strerror or exc}") from None
    if lines and not lines[-1].strip():
        lines.pop()  # the final line ending
    tokens = np.char.strip(np.array(lines, dtype=bytes))
    ones = tokens == b"1"
    bad = np.flatnonzero(~ones & (tokens != b"0"))
    if bad.size:
        token = tokens[bad[0]].decode("utf-8", "replace")
        raise malformed(path, int(bad[0]) + 1, f"expected 0 or 1, got {token!r}")
    if len(tokens) != expected:
        raise InputError(f"{path} has {plural(len(tokens), 'label')} but {list_path} lists {expected} "
                         "images; each label file must have one line per listed image")
    return ones.astype(np.uint8)
