"""In-progress work of stage one: fixed chunks of rows, each saved as its own shard file.

While ``<cache>/<ds>/features-<tag>.h5`` is being built, finished chunks live in the hidden
sibling directory ``<cache>/<ds>/.features-<tag>.parts/``::

    manifest.json         the identity of the run (labels sha256, backbone, weights sha256,
                          transform, dtype, precision, device, batch size, chunk size, ...)
    chunk-000000.npz      rows [0, chunk_rows): features, bad flags, reasons for bad rows
                          (and extras such as ``--crops``' tile embeddings of its training rows)
    chunk-000001.npz      ...

The run holds the lock of the features file (``<cache>/<ds>/.features-<tag>.h5.lock``,
:mod:`featcache.locks`) from :meth:`ChunkStore.open` until the file is written: a second run
on the same file is refused, naming the one that holds it.

Each shard is written atomically (temporary name, then rename), so a shard under its final
name is complete; a run that finds a manifest of another identity says so and starts fresh,
a damaged shard is recomputed. The directory is removed once the features file is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from featcache.errors import DiskFullError, FeatcacheError
from featcache.fileio import atomic_output, write_json_atomic
from featcache.locks import OutputLock
from featcache.protocol.runs import describe_differences

SHARD_FORMAT = 1
MANIFEST = "manifest.json"


@dataclass
class ShardFlags:
    """One finished chunk without its features: rows ``[start, start + len(bad))`` of
    train-then-test, which of them are bad and why, and the extras."""

    start: int
    bad: np.ndarray
    reasons: dict[int, str] = field(default_factory=dict)  # global row -> why it is bad
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (rows with it, ...)


@dataclass
class Shard(ShardFlags):
    """One finished chunk with its features."""

    features: np.ndarray = field(kw_only=True)


_Read = TypeVar("_Read", bound=ShardFlags)
#: a further per-row array of the chunks: (rows with it, trailing shape[, dtype])
Extra = tuple[int, tuple[int, ...]] | tuple[int, tuple[int, ...], str]


def parts_dir(final: Path) -> Path:
    """``<dir>/.<final stem>.parts``: where the chunks of ``final`` are kept until it is written."""
    return final.with_name(f".{final.stem}.parts")


def read_manifest(final: Path) -> dict | None:
    """The identity of the unfinished work of ``final`` (None: none, or unreadable)."""
    try:
        return json.loads((parts_dir(final) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class ChunkStore:
    """The shard directory of one features file, for one run identity.

    ``extras`` maps the name of a further per-row array to ``(rows, shape)`` or ``(rows, shape,
    dtype)``: the first ``rows`` rows of the file carry it (``crops``: the official training
    rows), each of trailing ``shape``, in ``dtype`` (default: the features' dtype; ``--spatial``
    keeps the pooled features beside the maps in float32).
    """

    def __init__(self, final: Path, identity: dict, num_rows: int, chunk_rows: int, dim: int,
                 extras: dict[str, Extra] | None = None):
        self.final = Path(final)
        self.dir = parts_dir(self.final)
        self.identity = dict(identity, shard_format=SHARD_FORMAT, num_rows=num_rows,
                             chunk_rows=chunk_rows)
        self.digest = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()
        self.num_rows = num_rows
        self.chunk_rows = chunk_rows
        self.dim = dim
        self.num_chunks = math.ceil(num_rows / chunk_rows)
        self.extras = dict(extras or {})
        self.lock = OutputLock(self.final, "wait for it to finish, or stop it first (its "
                                           "finished chunks are kept for the next run)")

    # -- layout ---------------------------------------------------------------------------
    def rows(self, chunk: int) -> range:
        start = chunk * self.chunk_rows
        return range(start, min(start + self.chunk_rows, self.num_rows))

    def extra_rows(self, chunk: int, name: str) -> range:
        """Rows of ``chunk`` that carry extra ``name``."""
        rows = self.rows(chunk)
        limit = self.extras[name][0]
        return range(rows.start, max(rows.start, min(rows.stop, limit)))

    def extra_shape(self, chunk: int, name: str) -> tuple[int, ...]:
        return (len(self.extra_rows(chunk, name)), *self.extras[name][1])

    def extra_dtype(self, name: str, dtype: str) -> np.dtype:
        spec = self.extras[name]
        return np.dtype(spec[2] if len(spec) > 2 else dtype)

    def path(self, chunk: int) -> Path:
        return self.dir / f"chunk-{chunk:06d}.npz"

    @property
    def manifest(self) -> Path:
        return self.dir / MANIFEST

    # -- ownership ------------------------------------------------------------------------
    def open(self, say) -> None:
        """Lock the directory, clear leftovers of killed runs, and check or write the manifest.

        A manifest of another identity means the chunks belong to other settings: they are
        deleted (after saying which settings differ) and the run starts fresh.
        """
        self.lock.acquire()
        self.dir.mkdir(parents=True, exist_ok=True)
        for leftover in self.dir.glob(".*.tmp-*"):
            leftover.unlink(missing_ok=True)
        for leftover in self.final.parent.glob(f".{self.final.name}.tmp-*"):
            leftover.unlink(missing_ok=True)  # a killed assembly; we hold the lock, so it is ours
        old = self._read_manifest()
        if old != self.identity:
            chunks = sorted(self.dir.glob("chunk-*.npz"))
            if old is not None or chunks:
                say(f"{self.dir}: unfinished work from other settings "
                    f"({describe_differences(old or {}, self.identity)}); starting fresh")
            for chunk in chunks:
                chunk.unlink()
            write_json_atomic(self.manifest, self.identity)

    def close(self) -> None:
        """Release the lock (the chunks stay for the next run)."""
        self.lock.release()

    def remove(self) -> None:
        """Delete the directory (after the features file is written)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.close()

    def _read_manifest(self) -> dict | None:
        return read_manifest(self.final)

    # -- shards ---------------------------------------------------------------------------
    def write(self, chunk: int, features: np.ndarray, bad: np.ndarray, reasons: dict[int, str],
              extras: dict[str, np.ndarray] | None = None) -> Path:
        """Save one finished chunk atomically."""
        rows = self.rows(chunk)
        if features.shape != (len(rows), self.dim) or bad.shape != (len(rows),):
            raise ValueError(f"chunk {chunk}: features {features.shape}, bad {bad.shape}, "
                             f"expected ({len(rows)}, {self.dim})")
        extras = extras or {}
        for name in self.extras:
            if name not in extras or extras[name].shape != self.extra_shape(chunk, name):
                got = extras[name].shape if name in extras else None
                raise ValueError(f"chunk {chunk}: {name} {got}, expected {self.extra_shape(chunk, name)}")
        path = self.path(chunk)
        try:
            with atomic_output(path, overwrite=True) as tmp, open(tmp, "wb") as handle:
                np.savez(handle, allow_pickle=False, features=features, bad=bad.astype(np.uint8),
                         start=np.int64(rows.start), digest=np.str_(self.digest),
                         reasons=np.str_(json.dumps({str(k): v for k, v in reasons.items()})),
                         **{f"extra_{name}": extras[name] for name in self.extras})
        except DiskFullError as exc:
            raise DiskFullError(f"{exc} (chunks saved so far are kept in {self.dir} and the "
                                "next run resumes from them)") from exc.__cause__
        except OSError as exc:
            raise FeatcacheError(
                f"could not save {path}: {exc}. Chunks saved so far are kept; fix the problem "
                "and run the same command again to resume"
            ) from exc
        return path

    def require(self, chunk: int, dtype: str) -> Shard:
        """:meth:`read` for a chunk the assembly needs: missing or damaged is an error that
        says how to recompute it."""
        return self._required(chunk, self.read(chunk, dtype))

    def require_flags(self, chunk: int, dtype: str) -> ShardFlags:
        """:meth:`read_flags` for a chunk the assembly needs (missing or damaged: an error)."""
        return self._required(chunk, self.read_flags(chunk, dtype))

    def _required(self, chunk: int, shard: _Read | None) -> _Read:
        if shard is None:
            raise FeatcacheError(f"chunk {chunk} of {self.dir} is missing or damaged; run the "
                                 "same command again to recompute it")
        return shard

    def read(self, chunk: int, dtype: str) -> Shard | None:
        """The saved chunk, or None when it is missing or damaged (a damaged one is deleted)."""
        shard = self._load(chunk, dtype, features=True)
        return shard if isinstance(shard, Shard) else None

    def read_flags(self, chunk: int, dtype: str) -> ShardFlags | None:
        """:meth:`read` leaving the features unread, checking only the rest: for a second look
        at a chunk already checked in full (the bad flags and extras of wide spatial rows, read
        before the rows themselves are streamed)."""
        return self._load(chunk, dtype, features=False)

    def _load(self, chunk: int, dtype: str, features: bool) -> ShardFlags | None:
        path = self.path(chunk)
        if not path.exists():
            return None
        rows = self.rows(chunk)
        try:
            with np.load(path, allow_pickle=False) as data:
                start, bad = int(data["start"]), data["bad"].astype(bool)
                reasons = {int(k): v for k, v in json.loads(str(data["reasons"])).items()}
                extras = {name: data[f"extra_{name}"] for name in self.extras}
                shard = (Shard(start, bad, reasons, extras, features=data["features"])
                         if features else ShardFlags(start, bad, reasons, extras))
                digest = str(data["digest"])
        except Exception:  # zip, CRC, key and JSON errors all mean "damaged: recompute"
            path.unlink(missing_ok=True)
            return None
        valid = (
            digest == self.digest and shard.start == rows.start
            and (not isinstance(shard, Shard) or (
                shard.features.shape == (len(rows), self.dim)
                and shard.features.dtype == np.dtype(dtype)
                and np.isfinite(shard.features[~shard.bad]).all()))
            and shard.bad.shape == (len(rows),)
            and all(shard.extras[name].shape == self.extra_shape(chunk, name)
                    and shard.extras[name].dtype == self.extra_dtype(name, dtype)
                    for name in self.extras)
        )
        if not valid:
            path.unlink(missing_ok=True)
            return None
        return shard

    def missing(self, chunks, dtype: str, accept_bad: bool) -> list[int]:
        """Of ``chunks``, those still to compute: not saved, damaged, or (unless ``accept_bad``)
        holding rows flagged bad, which are recomputed so that the error names the file."""
        todo = []
        for chunk in chunks:
            shard = self.read(chunk, dtype)
            if shard is None or (shard.bad.any() and not accept_bad):
                todo.append(chunk)
        return todo


def stored_blocks(store: ChunkStore, start: int, stop: int, dtype: str) -> Iterator[np.ndarray]:
    """Rows ``[start, stop)`` of train-then-test as row blocks read from the saved chunks one
    at a time (what the assembly hands :func:`featcache.data.featurewrite.write_features`, so
    that the features are never all in memory next to the file being built)."""
    if stop <= start:
        yield np.zeros((0, store.dim), dtype=dtype)
        return
    for chunk in range(start // store.chunk_rows, (stop - 1) // store.chunk_rows + 1):
        shard = store.require(chunk, dtype)
        rows = store.rows(chunk)
        yield shard.features[max(start, rows.start) - rows.start:min(stop, rows.stop) - rows.start]
