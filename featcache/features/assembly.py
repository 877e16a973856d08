"""Disk planning before the work (the size printed, the free space checked) and the assembly
of the finished chunk shards into the features file (atomic, streamed chunk by chunk)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from featcache.backbones import BackboneSpec
from featcache.data.featurewrite import features_file_bytes, write_features
from featcache.errors import DiskFullError, FeatcacheError, plural
from featcache.features.bad_images import BadImages
from featcache.features.class_text import ClassText
from featcache.features.shards import ChunkStore, stored_blocks
from featcache.fileio import disk_full_message, free_bytes, human_bytes, is_disk_full, require_space


class Assembly(BadImages, ClassText):
    """The output side of an :class:`~featcache.features.extraction.Extraction`."""

    final: Path
    say: Callable[[str], None]
    spec: BackboneSpec
    crops: int
    dtype: str

    def write_options(self) -> dict:
        """Further arguments of ``write_features`` (none here: pooled files keep their layout)."""
        return {}

    def crop_bytes(self) -> int:
        """``--crops``' tile embeddings of the training images, in bytes (0 without crops)."""
        itemsize = np.dtype(self.dtype).itemsize
        return self.num_train * self.crops * self.crops * self.spec.dim * itemsize if self.crops else 0

    def check_space(self, store: ChunkStore, todo: list[int]) -> None:
        """Say how large the output will be, and refuse now when the disk cannot hold it: the
        chunks still to compute plus the features file, which is assembled beside them."""
        itemsize = np.dtype(self.dtype).itemsize
        _, share = self.unsaved(store, todo)
        chunk_bytes = int(share * (len(self.images) * store.dim * itemsize + self.crop_bytes()))
        file_bytes = self.file_bytes(store)
        free = free_bytes(self.final.parent)
        self.say(f"output: about {human_bytes(file_bytes)} for {self.final.name}, plus "
                 f"{human_bytes(chunk_bytes)} of chunks until it is assembled; "
                 f"{human_bytes(free)} free in {self.final.parent}")
        require_space(self.final.parent, chunk_bytes + file_bytes,
                      f"to extract the features of {plural(len(self.images), 'image')}", file_bytes)

    def unsaved(self, store: ChunkStore, todo: list[int]) -> tuple[set[int], float]:
        """The chunks still to compute (or not yet on disk), and their share of the images."""
        chunks = {c for c in range(store.num_chunks) if not store.path(c).exists()} | set(todo)
        return chunks, sum(len(store.rows(c)) for c in chunks) / max(1, len(self.images))

    def file_bytes(self, store: ChunkStore) -> int:
        return features_file_bytes(self.images, store.dim, self.dtype) + self.crop_bytes()

    def assemble(self, store: ChunkStore, attrs: dict,
                 text: tuple[np.ndarray, dict] | None = None) -> list[dict]:
        """Write the features file from all shards (their features read chunk by chunk, never
        all in memory beside the file being built); returns the bad images recorded."""
        n_train, n_test = len(self.labels.train), len(self.labels.test)
        extra = {}
        if self.crops:
            crops = np.empty((n_train, self.crops * self.crops, store.dim), dtype=self.dtype)
            extra["train/crops"] = crops
            attrs = dict(attrs, crops_grid=self.crops,
                         crops="tiles of a GxG grid of each training image (AEVLP's local views)")
        if text is not None:
            extra["text/embeddings"], attrs = text[0], dict(attrs, text=text[1])
            extra["text/classes"] = np.asarray(self.prompt_names(), dtype=object)
        flags = np.zeros(n_train + n_test, dtype=bool)
        bad = []
        for chunk in range(store.num_chunks):
            # the features are read (and checked) once more when they are streamed into the file
            shard = store.require_flags(chunk, self.dtype)
            rows = store.rows(chunk)
            flags[rows.start:rows.stop] = shard.bad
            if self.crops:
                part = store.extra_rows(chunk, "crops")
                crops[part.start:part.stop] = shard.extras["crops"]
            bad += self.bad_entries(shard.reasons)
        attrs = dict(attrs, bad_images=bad, num_bad_images=len(bad))
        kept = (f"the previous {self.final.name} (if any) is untouched and the computed chunks "
                f"are kept in {store.dir}")
        try:
            write_features(
                self.final, self.labels,
                {"train": stored_blocks(store, 0, n_train, self.dtype),
                 "test": stored_blocks(store, n_train, n_train + n_test, self.dtype)}, attrs,
                bad={"train": flags[:n_train], "test": flags[n_train:]},
                overwrite=True, dtype=self.dtype, extra=extra, **self.write_options(),
            )
        except OSError as exc:
            if is_disk_full(exc):
                message = str(exc) if isinstance(exc, DiskFullError) else disk_full_message(
                    exc, self.final)
                raise DiskFullError(f"{message} ({kept}: only the assembly is left to do)") from exc
            raise FeatcacheError(f"could not write {self.final}: {exc}. {kept[0].upper()}{kept[1:]}"
                                 "; fix the problem and run the same command again") from exc
        return bad
