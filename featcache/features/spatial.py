"""Stage one with ``--spatial``: every image's last feature map, cached for BoostLU.

Writes ``<cache>/<ds>/spatial-<tag>.h5``, an ordinary features file (same format, readers and
labels checks) whose row i is image i's map of the trunk's ``feature_map`` laid out (H, W, D) in
C order (``rows.reshape(N, H * W, D)`` gives one D-vector per position ``u * W + v``), with the
root attributes ``spatial_shape`` = [H, W, D] and ``layout`` = ``spatial``. Float16 by default,
HDF5 chunks of whole rows of about :data:`CHUNK_BYTES`, compressed (lzf with the byte shuffle by
default: see docs/features.md for the measured choice).

The engine is the pooled extraction's (:class:`~featcache.features.extraction.Extraction`): the same
chunk shards, locks, resume, progress bar, bad-image handling and ``torchrun`` sharding; the
shards are smaller (about :data:`SHARD_BYTES` each) and the file is assembled by streaming them,
never holding the maps of the whole dataset in memory. Backbones whose pooled output is the
average of the map (ResNets: ``pool_map``) also store the pooled features with each chunk and
write ``features-<tag>.h5`` in the same pass when it does not exist yet: both files from one
backbone pass, the pooled one identical to a plain ``featcache features`` run's.

Before any work the size is printed (the uncompressed size: an upper bound, which the free-space
check uses); after the first chunk the compression ratio measured on it refines the estimate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import h5py
import numpy as np
import torch

from featcache.backbones import Trunk
from featcache.data.featurefile import SPATIAL
from featcache.data.featurewrite import (
    chunk_rows,
    features_file_bytes,
    hdf5_filters,
    write_features,
)
from featcache.errors import plural
from featcache.features.extraction import Extraction
from featcache.features.shards import ChunkStore
from featcache.fileio import free_bytes, human_bytes, require_space
from featcache.paths import feature_file_tag, pooled_twin
from featcache.runtime import autocast

CHUNK_BYTES = 4 << 20  # HDF5 chunks of whole rows of about this size (5 rows at 14 x 14 x 2048 f16)
SHARD_BYTES = 128 << 20  # in-progress chunks of about this size (a whole number of batches)


@runtime_checkable
class PoolsItsMap(Protocol):
    """A trunk whose pooled output is the average of its map (ResNets), computed from it."""

    def pool_map(self, fmap: torch.Tensor) -> torch.Tensor: ...


def file_bytes(images, width: int, dtype: str, ratio: float = 1.0) -> int:
    """Estimated size of a features file of ``images`` rows ``width`` wide whose features are
    stored in ``ratio`` of their bytes (1: uncompressed, an upper bound for a compressed file)."""
    values = len(images) * width * np.dtype(dtype).itemsize
    return features_file_bytes(images, width, dtype) - int(values * (1 - ratio))


def compression_ratio(rows: np.ndarray, compression: str | None) -> float:
    """Stored / raw bytes of ``rows`` written with the filters and chunking the file will use
    (in memory, nothing touches the disk)."""
    if compression is None or not rows.size:
        return 1.0
    height = chunk_rows(len(rows), rows.shape[1], rows.dtype, CHUNK_BYTES)
    with h5py.File(f"ratio-{id(rows)}.h5", "w", driver="core", backing_store=False) as h5:
        data = h5.create_dataset("rows", data=rows, chunks=(height, rows.shape[1]),
                                 **hdf5_filters(compression))
        stored = data.id.get_storage_size()
    return stored / rows.nbytes


class SpatialExtraction(Extraction):
    """:class:`Extraction` whose rows are whole feature maps (see the module docstring)."""

    def __init__(self, options, labels, job, final: Path, say):
        super().__init__(options, labels, job, final, say)
        self.compression = None if options.compression == "none" else options.compression
        self.pooled_final = pooled_twin(final)
        self.map_shape: tuple[int, int, int] | None = None
        self.with_pooled = False
        self.ratio: float | None = None

    # -- layout -----------------------------------------------------------------------------
    def row_width(self, model: Trunk) -> int:
        """Run one blank image through the trunk for the map's shape; choose the shard size."""
        size = self.image_size
        with torch.inference_mode():
            fmap = model.feature_map(torch.zeros(1, 3, size, size))
        _, depth, height, cols = fmap.shape
        self.map_shape = (int(height), int(cols), int(depth))
        width = height * cols * depth
        if self.options.chunk_rows is None:
            row = width * np.dtype(self.dtype).itemsize
            self.chunk_rows = self.batch_size * max(1, round(SHARD_BYTES / (self.batch_size * row)))
        self.with_pooled = isinstance(model, PoolsItsMap) and (self.options.overwrite
                                                               or not self.pooled_final.exists())
        return int(width)

    def store_extras(self, identity: dict, extras: dict) -> None:
        identity["with_pooled"] = self.with_pooled  # spatial_shape, compression: in the attributes
        if self.with_pooled:
            extras["pooled"] = (len(self.images), (self.spec.dim,), "float32")

    def wanted(self, source) -> dict:
        return dict(super().wanted(source), layout=SPATIAL, compression=self.options.compression)

    def attributes(self, model: Trunk) -> dict:
        out = super().attributes(model)
        assert self.map_shape is not None  # measured by row_width, which chunk_store calls first
        height, cols, depth = self.map_shape
        out.update(
            layout=SPATIAL,
            spatial_shape=[height, cols, depth],
            spatial_order="rows are (H, W, D) in C order: reshape(N, H*W, D); position u*W + v",
            compression=self.options.compression, hdf5_chunk_bytes=CHUNK_BYTES,
        )
        return out

    # -- size -------------------------------------------------------------------------------
    def check_space(self, store: ChunkStore, todo: list[int]) -> None:
        """Print the size and refuse now when the disk cannot hold the chunks still to compute,
        the file (uncompressed: its upper bound) and the pooled file written beside it."""
        width, dtype = store.dim, self.dtype
        assert self.map_shape is not None  # measured by row_width, which chunk_store calls first
        height, cols, depth = self.map_shape
        upper = file_bytes(self.images, width, dtype)
        pooled = features_file_bytes(self.images, self.spec.dim) if self.with_pooled else 0
        unsaved, share = self.unsaved(store, todo)
        row = width * np.dtype(dtype).itemsize + (4 * self.spec.dim if self.with_pooled else 0)
        chunks = int(share * len(self.images) * row)
        self.say(f"spatial features: {height} x {cols} x {depth} {dtype} per image, "
                 f"{plural(len(self.images), 'image')} -> {self.final.name}: at most {human_bytes(upper)} "
                 f"(uncompressed; {self.options.compression} only shrinks it), plus "
                 f"{human_bytes(chunks)} of chunks until it is assembled"
                 + (f" and {human_bytes(pooled)} for {self.pooled_final.name}" if pooled else "")
                 + f"; {human_bytes(free_bytes(self.final.parent))} free in {self.final.parent}")
        require_space(self.final.parent, upper + chunks + pooled,
                      f"to extract the spatial features of {plural(len(self.images), 'image')} (or store "
                      "less: --image-size, --compression gzip)", upper)
        first = next((c for c in range(store.num_chunks) if c not in unsaved), None)
        if first is not None:
            shard = store.read(first, dtype)
            if shard is not None:
                self.measure(shard.features)

    def measure(self, rows: np.ndarray) -> float:
        """Refine the estimate with the compression ratio of one chunk's rows (returned)."""
        ratio = self.ratio = compression_ratio(rows[np.isfinite(rows).all(axis=1)],
                                               self.compression)
        if self.compression is not None:
            estimate = file_bytes(self.images, rows.shape[1], self.dtype, ratio)
            self.say(f"{self.options.compression} stores a chunk in {ratio:.0%} of its bytes: "
                     f"{self.final.name} will be about {human_bytes(estimate)}")
        return ratio

    # -- compute ----------------------------------------------------------------------------
    def forward(self, model: Trunk, images: torch.Tensor) -> torch.Tensor:
        """(B, H*W*D) maps as float32, the pooled features appended when ``with_pooled``."""
        with autocast(self.device, self.precision):
            fmap = model.feature_map(images)
            pooled = (model.pool_map(fmap)  # float32 already
                      if self.with_pooled and isinstance(model, PoolsItsMap) else None)
        rows = fmap.float().permute(0, 2, 3, 1).reshape(len(images), -1)
        return rows if pooled is None else torch.cat([rows, pooled], 1)

    def save(self, store: ChunkStore, chunk: int, parts, oks, root: Path, crops=(),
             extras=None) -> None:
        rows = torch.cat(parts)
        extras = {}
        if self.with_pooled:
            pooled = rows[:, store.dim:].cpu().numpy().astype(np.float32)
            pooled[~torch.cat(oks).numpy().astype(bool)] = np.nan
            extras["pooled"], rows = pooled, rows[:, :store.dim]
        super().save(store, chunk, [rows], oks, root, extras=extras)
        if self.ratio is None and self.job.is_main:
            self.measure(rows.cpu().numpy().astype(self.dtype))

    # -- assembly ---------------------------------------------------------------------------
    def write_options(self) -> dict:
        return {"compression": self.compression, "chunk_bytes": CHUNK_BYTES}

    def assemble(self, store: ChunkStore, attrs: dict, text=None) -> list[dict]:
        """The pooled file first (when this pass computed it), then the spatial file, streamed
        from the shards by the engine's assembly with this file's filters and chunks."""
        if self.with_pooled:
            self.write_pooled(store, attrs)
        return super().assemble(store, dict(attrs, **self.estimates(store)), text)

    def write_pooled(self, store: ChunkStore, attrs: dict) -> None:
        """``features-<tag>.h5`` from the pooled features saved beside each chunk's maps."""
        if self.pooled_final.exists() and not self.options.overwrite:
            self.say(f"{self.pooled_final} appeared meanwhile; left as it is")
            return
        n_train, total = len(self.labels.train), len(self.images)
        flags = np.zeros(total, dtype=bool)
        pooled = np.empty((total, self.spec.dim), np.float32)
        bad = []
        for chunk in range(store.num_chunks):
            shard = store.require_flags(chunk, self.dtype)
            rows = store.rows(chunk)
            flags[rows.start:rows.stop] = shard.bad
            pooled[rows.start:rows.stop] = shard.extras["pooled"]
            bad += self.bad_entries(shard.reasons)
        spatial_only = ("layout", "spatial_shape", "spatial_order", "compression",
                        "hdf5_chunk_bytes")
        attrs = {k: v for k, v in attrs.items() if k not in spatial_only}
        attrs.update(backbone_tag=feature_file_tag(self.pooled_final),
                     extracted_with=f"featcache features --spatial (the average of each map of "
                                    f"{self.final.name}, in float32, as the trunk pools it)",
                     bad_images=bad, num_bad_images=len(bad))
        write_features(self.pooled_final, self.labels,
                       {"train": pooled[:n_train], "test": pooled[n_train:]}, attrs,
                       bad={"train": flags[:n_train], "test": flags[n_train:]}, overwrite=True,
                       dtype="float32")
        self.say(f"pooled features written in the same pass: {self.pooled_final}")

    def estimates(self, store: ChunkStore) -> dict:
        """The printed size estimates, recorded in the file (so that they can be checked)."""
        ratio = self.ratio
        if ratio is None:  # every chunk was done before this run: measure one now
            ratio = self.measure(store.require(0, self.dtype).features)
        return {"size_upper_bound_bytes": file_bytes(self.images, store.dim, self.dtype),
                "size_estimate_bytes": file_bytes(self.images, store.dim, self.dtype, ratio),
                "size_estimate_ratio": round(float(ratio), 4)}
