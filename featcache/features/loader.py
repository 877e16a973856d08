"""The images of a run's chunks as batches on the device: PIL decoding in DataLoader workers
(or JPEG bytes decoded on the device, or AEVLP's tiles beside each image), batches that never
straddle a chunk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from featcache.backbones import BackboneSpec, Preprocess, inputs
from featcache.errors import plural
from featcache.features.options import ExtractOptions
from featcache.features.shards import ChunkStore
from featcache.runtime import Ranks, default_workers


class ImageBatches:
    """The input side of an :class:`~featcache.features.extraction.Extraction`."""

    options: ExtractOptions
    job: Ranks
    device: torch.device
    spec: BackboneSpec
    preprocess: Preprocess
    images: np.ndarray
    num_train: int
    batch_size: int
    crops: int
    image_size: int
    normalize: torch.nn.Module
    decode: str  # pil, pil-draft or device (featcache.features.decoder)

    def loader(self, root: Path, rows: list[int], store: ChunkStore, todo: list[int]) -> DataLoader:
        """Batches never straddle chunks: each chunk is cut into batches from its first row."""
        batches, position = [], 0
        for chunk in todo:
            size = len(store.rows(chunk))
            batches += [list(range(position + i, position + min(i + self.batch_size, size)))
                        for i in range(0, size, self.batch_size)]
            position += size
        size = self.image_size
        workers = self.options.workers
        if workers is None:
            workers = default_workers(self.device, self.job.local_world)
        dataset: inputs.ImageRows
        if self.crops:
            dataset = inputs.CropRows(root, self.images, size, rows, preprocess=self.preprocess,
                                      grid=self.crops, crop_rows=self.num_train)
            collate = inputs.collate_crop_rows
            batch_bytes = inputs.uint8_batch_bytes(self.batch_size, size) * (1 + self.crops ** 2)
        elif self.decode == "device":
            dataset = inputs.JpegBytesRows(root, self.images, size, rows, preprocess=self.preprocess)
            collate = inputs.collate_jpeg_rows
            batch_bytes = inputs.jpeg_batch_bytes((root / str(self.images[r]) for r in rows[:64]),
                                                  self.batch_size, size)
        else:
            dataset = inputs.ImageRows(root, self.images, size, rows, draft=self.decode == "pil-draft",
                                       preprocess=self.preprocess)
            collate, batch_bytes = None, inputs.uint8_batch_bytes(self.batch_size, size)
        # two batches in flight per worker, fewer when /dev/shm is small (an error if none fits)
        prefetch = inputs.loader_prefetch(batch_bytes, workers, 2, self.job.local_world,
                                          what=f"batches of {plural(self.batch_size, 'image')} at {size} px")
        return DataLoader(
            dataset, batch_sampler=batches, num_workers=workers, collate_fn=collate,
            pin_memory=self.device.type == "cuda", worker_init_fn=inputs.worker_init,
            prefetch_factor=prefetch,
        )

    def batches(self, loader: DataLoader
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """(uint8 images on the device, rows, ok flags, normalised tiles or None) per batch."""
        if self.decode == "device":
            for images, batch_rows, ok in inputs.DeviceDecoder(loader, self.image_size,
                                                               self.device, self.preprocess):
                yield images, batch_rows, ok, None
            return
        if self.crops:
            for images, views, batch_rows, ok in loader:
                views = self.layout(self.normalize(views.to(self.device, non_blocking=True)))
                yield images.to(self.device, non_blocking=True), batch_rows, ok, views
            return
        for images, batch_rows, ok in loader:
            yield images.to(self.device, non_blocking=True), batch_rows, ok, None

    def layout(self, images: torch.Tensor) -> torch.Tensor:
        if self.spec.channels_last:
            return images.contiguous(memory_format=torch.channels_last)
        return images
