"""Readers of the datasets' official layouts, one module per source format.

Every reader turns its layout into a :class:`SourceDataset`: class names in protocol order,
image paths relative to an image root, the clean label matrices of the official train and test
sets, and the files it read (for provenance). Readers validate as they go: a missing or
malformed file raises :class:`~featcache.errors.InputError` naming the file and the line.
Everything after reading (dropping rows, checking images, sampling, splitting, writing) is
shared by all formats in :mod:`featcache.data.prepare`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featcache.data.objects import ImageObjects
from featcache.errors import InputError

#: how many names an error message or a report lists before "..."
SHOW_FIRST = 5


@dataclass
class SourceSplit:
    """One official split as read from the source: image paths and labels.

    ``clean`` is the (N, L) 0/1 label matrix; it is None when the source holds only single
    positive labels, which are then given in ``observed`` (int8, 1 observed positive, 0 not).
    A source may give both (L48: real observations, -1 for an observed negative, beside its
    full labels); given observations are kept as they are.
    ``objects`` holds each image's object boxes when the reader was asked for them (for the
    label-bias samplers, :mod:`featcache.data.bias`).
    """

    images: list[str]
    clean: np.ndarray | None
    observed: np.ndarray | None = None
    objects: list[ImageObjects] | None = None

    def __post_init__(self) -> None:
        if self.clean is None and self.observed is None:
            raise ValueError("a SourceSplit holds clean labels, given observed labels or both")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def labels(self) -> np.ndarray:
        """The matrix that says which classes are positive: clean labels, else the given ones."""
        if self.clean is not None:
            return self.clean
        assert self.observed is not None  # __post_init__ refuses a split with neither
        return (self.observed == 1).astype(np.uint8)

    def take(self, rows: np.ndarray) -> SourceSplit:
        return SourceSplit(
            [self.images[i] for i in rows],
            None if self.clean is None else self.clean[rows],
            None if self.observed is None else self.observed[rows],
            None if self.objects is None else [self.objects[i] for i in rows],
        )


@dataclass
class SourceDataset:
    """What a reader found: classes, both official splits, the image root and the files read."""

    name: str
    #: the reader: voc, coco, cub, nuswide, csv, npz or shapes
    source_format: str
    classes: list[str]
    train: SourceSplit
    test: SourceSplit
    image_root: Path | None
    source_files: list[Path]
    #: reader-specific provenance (year, split names, file layout, ...)
    details: dict = field(default_factory=dict)
    #: rows of ``train`` that form the validation split when the source defines one (L48);
    #: None: the protocol's seeded 80/20 split
    val_rows: np.ndarray | None = None

    def split(self, name: str) -> SourceSplit:
        return self.train if name == "train" else self.test


def first_few(names: Sequence[str], count: int = SHOW_FIRST) -> str:
    """``'a, b, c'`` or ``'a, b, c, ... (9 more)'``, for error messages and reports."""
    shown = ", ".join(str(name) for name in names[:count])
    return shown if len(names) <= count else f"{shown}, ... ({len(names) - count} more)"


def require_dir(path: str | os.PathLike, what: str, hint: str = "") -> Path:
    """``path`` as a Path; InputError naming ``what`` (and ``hint``) if it is not a directory."""
    return _require(Path(path), what, hint, Path.is_dir, "is not a directory", "does not exist")


def require_file(path: str | os.PathLike, what: str, hint: str = "") -> Path:
    """``path`` as a Path; InputError naming ``what`` (and ``hint``) if it is not a file."""
    return _require(Path(path), what, hint, Path.is_file, "is not a file", "is missing")


def _require(path: Path, what: str, hint: str, test, wrong_kind: str, absent: str) -> Path:
    if not test(path):
        state = wrong_kind if path.exists() else absent
        raise InputError(f"{what} {path} {state}" + (f"; {hint}" if hint else ""))
    return path


def malformed(path: Path, line: int, message: str) -> InputError:
    """The error for a bad line: ``<file>, line <n>: <message>``."""
    return InputError(f"{path}, line {line}: {message}")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a UTF-8 text file as (1-based line number, text without ending).

    Streams the file, so that a large label list is never held twice in memory.
    """
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path} could not be read: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise malformed(path, number, "is not UTF-8 text (a binary or damaged file?)") from None
            if text.strip():
                yield number, text


def read_lines(path: Path) -> list[tuple[int, str]]:
    """All non-blank lines of a UTF-8 text file (see :func:`iter_lines`)."""
    return list(iter_lines(path))


def parse_int(token: str, path: Path, line: int, what: str,
              allowed: Iterable[int] | None = None) -> int:
    """``int(token)``; a malformed-line error naming ``what`` otherwise (or if not ``allowed``)."""
    try:
        value = int(token)
    except ValueError:
        raise malformed(path, line, f"{what} {token!r} is not an integer") from None
    if allowed is not None:
        allowed = tuple(allowed)
        if value not in allowed:
            choices = ", ".join(str(a) for a in allowed)
            raise malformed(path, line, f"{what} is {value}; expected one of {choices}")
    return value


def check_unique(names: Sequence[str], lines: Sequence[int], path: Path, what: str) -> None:
    """InputError naming both lines when a name occurs twice in ``path``."""
    seen: dict[str, int] = {}
    for name, line in zip(names, lines, strict=True):
        if name in seen:
            raise malformed(path, line, f"duplicate {what} {name!r} (first on line {seen[name]})")
        seen[name] = line


def check_same_classes(first: Sequence[str], second: Sequence[str], first_where: str,
                       second_where: str) -> None:
    """InputError listing the differences when two class lists are not the same, in order."""
    if list(first) == list(second):
        return
    only_first = [c for c in first if c not in set(second)]
    only_second = [c for c in second if c not in set(first)]
    parts = []
    if only_first:
        parts.append(f"only in {first_where}: {first_few(only_first)}")
    if only_second:
        parts.append(f"only in {second_where}: {first_few(only_second)}")
        guesses = [f"{close[0]!r} for {name!r}" for name in only_second
                   if (close := difflib.get_close_matches(name, only_first, n=1, cutoff=0.6))]
        if guesses:
            parts[-1] += f"; did you mean {first_few(guesses)}?"
    if not parts:
        parts.append("the same classes in a different order")
    raise InputError(
        f"the class lists of {first_where} and {second_where} differ ({'; '.join(parts)}); "
        "both splits must use the same classes in the same order"
    )
