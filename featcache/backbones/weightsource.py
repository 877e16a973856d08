"""Where a backbone's weights come from (:class:`WeightsSource`), and checkpoint files hashed
once.

A source is made by the backbone's family (:meth:`BackboneFamily.describe_weights
<featcache.backbones.family.BackboneFamily.describe_weights>`) and completed by it (the file's
path and sha256: :meth:`~featcache.backbones.family.BackboneFamily.locate_weights`); ``random``
and checkpoint files (``file``) are the same for every family. :func:`file_sha256` hashes a file
once per path, size and modification time, however often a command asks.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from featcache.fileio import sha256_file

#: the kinds every family shares: random weights, and a checkpoint file given by path
RANDOM = "random"
FILE = "file"

_HASHES: dict[tuple[str, int, int, int], str] = {}
_HASHES_LOCK = threading.Lock()


@dataclass(frozen=True)
class WeightsSource:
    """Where a backbone's weights come from.

    ``kind`` is ``random``, ``file`` (any checkpoint file) or the family's kind of named
    weights: ``torchvision`` (a named torchvision checkpoint) or ``hub`` (a timm or open_clip
    pretrained tag, kept in the Hugging Face hub cache: ``repo`` and the file names ``files``
    tried in order); ``name`` is the torchvision member name or library tag, ``file`` or
    ``random``; ``tag`` is the suffix that keeps features files of different weights apart (''
    for the backbone's default weights); ``library`` is the family that described it.
    """

    kind: str
    name: str
    tag: str
    path: Path | None = None
    url: str = ""
    sha256: str = ""
    seed: int = 0
    repo: str = ""
    files: tuple[str, ...] = ()
    library: str = ""

    @property
    def file_name(self) -> str:
        if self.path is not None:
            return self.path.name
        return url_file_name(self.url) if self.url else ""

    @property
    def located(self) -> bool:
        """Whether the source is ready to load: random weights, or a checkpoint path."""
        return self.kind == RANDOM or self.path is not None

    def identity(self) -> dict:
        """Attributes recorded in a features file (no None values: HDF5 cannot store them)."""
        out: dict[str, str | int] = {"weights": self.name, "weights_file": self.file_name,
                                     "weights_sha256": self.sha256}
        if self.url:
            out["weights_url"] = self.url
        if self.repo:
            out["weights_repo"] = self.repo
        if self.kind == RANDOM:
            out["weights_seed"] = self.seed
        return out

    def recorded_in(self, attrs) -> bool:
        """Whether a features file (or run) with attributes ``attrs`` was made with these weights:
        the same file (sha256) for a checkpoint file, the same weights name otherwise."""
        if self.kind == FILE:
            return attrs.get("weights_sha256") == self.sha256
        return attrs.get("weights") == self.name


def random_source(seed: int = 0, library: str = "") -> WeightsSource:
    """``--weights random``: a seeded initialisation (tag ``random``, or ``random<seed>``)."""
    return WeightsSource(RANDOM, RANDOM, RANDOM if seed == 0 else f"random{seed}", seed=seed,
                         library=library)


def file_source(path: Path, library: str = "", sha256: str = "") -> WeightsSource:
    """A checkpoint file given by path, hashed (tag: its stem with unusual characters replaced)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem).strip("_") or "file"
    return WeightsSource(FILE, FILE, stem, path=path, sha256=sha256 or file_sha256(path),
                         library=library)


def url_file_name(url: str) -> str:
    """The file name torch hub stores a url under (its last path component)."""
    return os.path.basename(urlparse(url).path)


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a weights file, computed once per (path, size, modification time, inode)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    with _HASHES_LOCK:
        known = _HASHES.get(key)
    if known is None:
        known = sha256_file(path)
        with _HASHES_LOCK:
            _HASHES[key] = known
    return known
