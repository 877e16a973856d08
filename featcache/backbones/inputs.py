"""Dataset images as backbone inputs: decoded (as the reference does), resized, batched.

:class:`ImageRows` decodes with :func:`featcache.data.images.load_rgb` and resizes on the CPU
to uint8 in DataLoader workers; :class:`~featcache.backbones.transforms.Uint8Normalize` finishes
the transform on the device. The datasets never raise for a bad image: they return
``ok = False`` and the caller, in the main process and in row order, either stops with one
error naming the file or flags the row (stage one's ``--skip-bad``).

:class:`JpegBytesRows`, :class:`JpegBatch` and :class:`DeviceDecoder` are ``--gpu-decode``:
workers only read the files, packing a batch's JPEG bytes into one shared-memory buffer, and
the device decodes the whole batch at once (nvJPEG), resizes it there, and works ahead of the
forward pass on a stream of its own. :func:`loader_prefetch` bounds how many batches the workers
keep in shared memory and fails clearly when ``/dev/shm`` cannot hold them.
"""

from __future__ import annotations

import io
import math
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from featcache.backbones.preprocess import PROTOCOL, Preprocess
from featcache.backbones.transforms import resize_transform
from featcache.data.images import (
    DECODE_ERRORS,
    load_rgb,
    open_image,
    require_strict_pil,
    to_rgb,
)
from featcache.errors import FeatcacheError, plural
from featcache.interrupt import ignore_in_worker

_JPEG_START = b"\xff\xd8"
_JPEG_END = b"\xff\xd9"


class ImageRows(Dataset):
    """Images ``root / relpath`` for the given rows, resized on the CPU to uint8 (3, s, s).

    ``relpaths`` lists every image of the labels file (train then test); item ``i`` of the
    dataset is global row ``rows[i]`` and yields ``(image, row, ok)``. A bad image gives a zero
    tensor and ``ok = False``, never an exception (see the module docstring). ``preprocess``
    says how to resize (and crop): the protocol's squash by default.
    """

    def __init__(self, root: str | os.PathLike, relpaths, image_size: int, rows=None,
                 draft: bool = False, preprocess: Preprocess = PROTOCOL):
        self.root = Path(root)
        self.relpaths = relpaths
        self.rows = range(len(relpaths)) if rows is None else rows
        self.image_size = image_size
        self.draft = draft
        self.preprocess = preprocess
        self.resize = resize_transform(image_size, preprocess)

    def __len__(self) -> int:
        return len(self.rows)

    def path(self, row: int) -> Path:
        return self.root / str(self.relpaths[row])

    def __getitem__(self, index: int):
        row = int(self.rows[index])
        try:
            side = self.preprocess.draft_size(self.image_size)
            size = (side, side) if self.draft else None
            return self.resize(load_rgb(self.path(row), draft=size)), row, True
        except DECODE_ERRORS:
            return torch.zeros(3, self.image_size, self.image_size, dtype=torch.uint8), row, False


def grid_tiles(image: Image.Image, grid: int) -> list[Image.Image]:
    """AEVLP's local views: ``grid`` x ``grid`` non-overlapping tiles, row-major.

    Tile (row y, column x) is the box ``[x*tw, y*th, (x+1)*tw, (y+1)*th]`` with
    ``tw = W // grid`` and ``th = H // grid`` (at least 1 pixel): the last ``W % grid`` columns
    and ``H % grid`` rows are not in any tile, as in the reference's ``datasets.py``.
    """
    width, height = image.size
    tile_w, tile_h = max(1, width // grid), max(1, height // grid)
    return [image.crop((x * tile_w, y * tile_h, (x + 1) * tile_w, (y + 1) * tile_h))
            for y in range(grid) for x in range(grid)]


class CropRows(ImageRows):
    """:class:`ImageRows` plus, for the first ``crop_rows`` rows (the official training images),
    each tile of :func:`grid_tiles` resized like the image: ``(image, crops, row, ok)`` with
    crops uint8 (grid*grid, 3, s, s), or (0, 3, s, s) for the other rows."""

    def __init__(self, root, relpaths, image_size: int, rows=None,
                 preprocess: Preprocess = PROTOCOL, grid: int = 4, crop_rows: int = 0):
        super().__init__(root, relpaths, image_size, rows, preprocess=preprocess)
        self.grid = grid
        self.crop_rows = crop_rows

    def __getitem__(self, index: int):
        row = int(self.rows[index])
        views = self.grid * self.grid if row < self.crop_rows else 0
        try:
            image = load_rgb(self.path(row))
            crops = [self.resize(tile) for tile in grid_tiles(image, self.grid)] if views else []
            return (self.resize(image),
                    torch.stack(crops) if crops else self._blank(0), row, True)
        except DECODE_ERRORS:
            return self._blank(), self._blank(views), row, False

    def _blank(self, count: int | None = None) -> torch.Tensor:
        size = self.image_size
        if count is None:
            return torch.zeros(3, size, size, dtype=torch.uint8)
        return torch.zeros(count, 3, size, size, dtype=torch.uint8)


def collate_crop_rows(items):
    """Collate :class:`CropRows` items: images stacked, every item's crops concatenated."""
    images, crops, rows, ok = zip(*items, strict=True)
    return torch.stack(images), torch.cat(crops), torch.tensor(rows), torch.tensor(ok)


def any_jpeg(paths) -> bool:
    """Whether any of ``paths`` starts with the JPEG start-of-image marker (unreadable files
    count as not JPEGs)."""
    for path in paths:
        try:
            with open(path, "rb") as handle:
                if handle.read(len(_JPEG_START)) == _JPEG_START:
                    return True
        except OSError:
            continue
    return False


class JpegBytesRows(ImageRows):
    """For ``--gpu-decode``: plain JPEG files come back as their bytes, decoded later on the device.

    Item: ``(payload, row, ok, is_jpeg)``. A JPEG that PIL reads as RGB or L and that ends with
    the end-of-image marker is sent as its bytes; everything else (PNG, CMYK or truncated JPEG,
    ...) is decoded here with PIL and resized, exactly like :class:`ImageRows` (a uint8 tensor).
    """

    def __getitem__(self, index: int):
        row = int(self.rows[index])
        try:
            data = self.path(row).read_bytes()
        except OSError:
            data = b""
        if data.startswith(_JPEG_START) and data.rstrip(b"\x00").endswith(_JPEG_END):
            try:
                with open_image(io.BytesIO(data), self.path(row)) as image:  # the header only
                    plain = image.format == "JPEG" and image.mode in ("RGB", "L")
            except DECODE_ERRORS:
                plain = False
            if plain:
                return data, row, True, True
        image, row, ok = super().__getitem__(index)
        return image, row, ok, False


class JpegBatch(NamedTuple):
    """One ``--gpu-decode`` batch as the workers send it: a handful of tensors, whatever its size
    (one shared-memory segment per tensor, and one pinned copy each on a GPU).

    Item i's JPEG bytes are ``data[offsets[i]:offsets[i + 1]]`` (empty when ``is_jpeg[i]`` is
    False); the items PIL decoded in the worker are ``decoded``, in row order.
    """

    data: torch.Tensor  # uint8 (n,): the batch's JPEG files back to back
    offsets: torch.Tensor  # int64 (B + 1,)
    is_jpeg: torch.Tensor  # bool (B,)
    decoded: torch.Tensor  # uint8 (k, 3, s, s), k = number of items that are not plain JPEGs
    rows: torch.Tensor
    ok: torch.Tensor

    def jpeg_views(self) -> list[torch.Tensor]:
        """Each plain JPEG's bytes as a 1-D view of :attr:`data` (no copy)."""
        offsets = self.offsets.tolist()
        return [self.data[offsets[i]:offsets[i + 1]] for i in self.jpeg_index()]

    def jpeg_index(self) -> list[int]:
        return [i for i, flag in enumerate(self.is_jpeg.tolist()) if flag]


def collate_jpeg_rows(items) -> JpegBatch:
    """Pack :class:`JpegBytesRows` items into one :class:`JpegBatch`: the JPEG bytes back to back
    in one buffer, allocated in shared memory when this runs in a DataLoader worker (the bytes
    then reach the main process without another copy)."""
    payloads, rows, ok, is_jpeg = zip(*items, strict=True)
    sizes = [len(p) if flag else 0 for p, flag in zip(payloads, is_jpeg, strict=True)]
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    data = _byte_buffer(int(offsets[-1]))
    view = data.numpy()
    for payload, start, size in zip(payloads, offsets, sizes, strict=False):
        if size:
            view[start:start + size] = np.frombuffer(payload, dtype=np.uint8)
    decoded = [p for p, flag in zip(payloads, is_jpeg, strict=True) if not flag]
    side = decoded[0].shape[-1] if decoded else 0
    return JpegBatch(data, torch.from_numpy(offsets), torch.tensor(is_jpeg, dtype=torch.bool),
                     torch.stack(decoded) if decoded else torch.zeros(0, 3, side, side, dtype=torch.uint8),
                     torch.tensor(rows), torch.tensor(ok))


def _byte_buffer(size: int) -> torch.Tensor:
    """An uninitialised uint8 buffer, in shared memory inside a DataLoader worker (as PyTorch's
    own collate allocates its batches there)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if get_worker_info() is None or new_shared is None or size == 0:
        return torch.empty(size, dtype=torch.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(size))


def worker_init(_worker_id: int) -> None:
    """DataLoader worker setup: strict PIL in every worker, whatever the start method; Ctrl-C
    left to the main process (a terminal sends it to the workers too), which stops the loader
    at a safe point (:mod:`featcache.interrupt`)."""
    require_strict_pil()
    ignore_in_worker()


def decode_on_device(batch: JpegBatch, image_size: int, device: torch.device,
                     preprocess: Preprocess = PROTOCOL) -> tuple[torch.Tensor, torch.Tensor]:
    """A :class:`JpegBatch` -> (resized uint8 (B, 3, s, s) on ``device``, bool mask of the images
    that decoded).

    The batch's JPEGs are decoded by one ``torchvision.io.decode_jpeg`` call on the device
    (nvJPEG's batched decoder on CUDA), RGB, no EXIF rotation (as PIL); images of the same size
    are then resized (and cropped) together as ``preprocess`` says, antialiased (the protocol's:
    bilinear, no crop), and every piece lands in its row with one ``index_copy_``: no step waits
    for the device, and the launches do not grow with the batch. The result is close to, not
    bit-identical with, PIL's decode and resize. A JPEG the device decoder refuses is decoded
    with PIL instead; one that PIL cannot read either is not ok.
    """
    count = len(batch.rows)
    ok = torch.ones(count, dtype=torch.bool)
    order: list[int] = []
    pieces: list[torch.Tensor] = []
    jpeg_index = batch.jpeg_index()
    if jpeg_index:
        by_shape: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
        for i, image in zip(jpeg_index, _decode_all(batch.jpeg_views(), device), strict=True):
            if image is None:
                ok[i] = False
            else:  # shapes are known on the host: grouping waits for nothing
                by_shape.setdefault(tuple(image.shape), []).append((i, image))
        for members in by_shape.values():
            stacked = torch.stack([image for _, image in members])
            pieces.append(_resize(stacked, image_size, preprocess))
            order += [i for i, _ in members]
    others = [i for i, flag in enumerate(batch.is_jpeg.tolist()) if not flag]
    if others:
        pieces.append(batch.decoded.to(device, non_blocking=True))
        order += others
    if order == list(range(count)):
        return torch.cat(pieces), ok
    out = torch.zeros(count, 3, image_size, image_size, dtype=torch.uint8, device=device)
    if pieces:
        index = torch.tensor(order, dtype=torch.int64)
        if device.type == "cuda":
            index = index.pin_memory()  # an asynchronous copy: the host does not wait
        out.index_copy_(0, index.to(device, non_blocking=True), torch.cat(pieces))
    return out, ok


def _decode_all(views: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """One batched ``decode_jpeg`` call; one by one (PIL for what the device refuses) if it fails."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return list(decode_jpeg(views, mode=ImageReadMode.RGB, device=device))
    except RuntimeError:  # one bad file fails the whole batch: retry one by one
        return [_decode_one(view, device) for view in views]


def _resize(batch: torch.Tensor, image_size: int,
            preprocess: Preprocess = PROTOCOL) -> torch.Tensor:
    """uint8 (B, 3, h, w) -> (B, 3, s, s) as ``preprocess`` resizes (and crops), antialiased
    (one call per batch; the protocol's: bilinear squash)."""
    return preprocess.resize_tensor(batch, image_size)


class DeviceDecoder:
    """``--gpu-decode``'s pipeline: iterate a loader of :class:`JpegBatch` and yield ``(images on
    the device, rows, ok)``, decoding up to ``ahead`` batches ahead of the one being computed.

    A helper thread decodes (nvJPEG's host-side work and its waits run there, not on the thread
    that launches the forward pass) on a CUDA stream of its own; the consumer's stream waits for
    the batch's event before using it, so decoding overlaps the forward pass on the GPU too. The
    loader's pin-memory thread has put each batch's bytes in pinned memory. On the CPU the same
    pipeline runs without streams.
    """

    def __init__(self, loader, image_size: int, device: torch.device,
                 preprocess: Preprocess = PROTOCOL, ahead: int = 2):
        self.loader = loader
        self.image_size = image_size
        self.device = device
        self.preprocess = preprocess
        self.ahead = max(1, ahead)
        # high priority: the decoder's few small kernels go before the forward's queued ones
        self.stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None

    def _decode(self, batch: JpegBatch):
        if self.stream is None:
            images, decoded = decode_on_device(batch, self.image_size, self.device, self.preprocess)
            return images, batch.rows, batch.ok & decoded, None
        # decode_jpeg's outputs are allocated on this stream but written on torchvision's own:
        # the previous batch's kernels must be done with the memory it may hand out again
        self.stream.synchronize()
        with torch.cuda.stream(self.stream):
            images, decoded = decode_on_device(batch, self.image_size, self.device, self.preprocess)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return images, batch.rows, batch.ok & decoded, ready

    def __iter__(self):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="featcache-decode") as pool:
            batches = iter(self.loader)
            pending: deque = deque()
            for batch in batches:
                pending.append(pool.submit(self._decode, batch))
                if len(pending) == self.ahead:
                    break
            while pending:
                images, rows, ok, ready = pending.popleft().result()
                following = next(batches, None)
                if following is not None:
                    pending.append(pool.submit(self._decode, following))
                if ready is not None:
                    consumer = torch.cuda.current_stream(self.device)
                    consumer.wait_event(ready)
                    images.record_stream(consumer)  # allocated on the decode stream
                yield images, rows, ok


#: at most this share of the free space of /dev/shm is planned for batches in flight
SHM_SHARE = 0.5


def loader_prefetch(batch_bytes: int, workers: int, wanted: int, ranks_here: int = 1,
                    shm: str | os.PathLike = "/dev/shm", what: str = "batches") -> int | None:
    """``prefetch_factor`` for a DataLoader whose ``workers`` send batches of ``batch_bytes``
    through shared memory: ``wanted``, lowered so that every worker's queued batches (of every
    rank on this machine) fit in half the free space of ``shm``; None without workers.

    Raises a :class:`~featcache.errors.FeatcacheError` naming the sizes and the fixes when even
    one batch per worker does not fit: PyTorch would otherwise die later with a bus error.
    """
    if workers <= 0:
        return None
    try:
        free = shutil.disk_usage(shm).free
    except OSError:  # no /dev/shm (not Linux): nothing to plan against
        return wanted
    budget = free * SHM_SHARE / max(1, ranks_here)
    fits = int(budget // max(1, workers * batch_bytes))
    if fits >= 1:
        return min(wanted, fits)
    need = workers * batch_bytes * max(1, ranks_here) / SHM_SHARE
    raise FeatcacheError(
        f"{shm} has {free / 1e6:.0f} MB free, too little for the DataLoader's {what}: "
        f"{plural(workers, 'worker')} x {plural(max(1, ranks_here), 'rank')} x {batch_bytes / 1e6:.0f} MB per batch need "
        f"about {need / 1e6:.0f} MB. Enlarge it (docker run --shm-size={max(1, math.ceil(need / 1e9))}g, "
        "or mount a larger tmpfs), or pass a smaller --batch-size or fewer --workers"
    )


def uint8_batch_bytes(batch_size: int, image_size: int) -> int:
    """Bytes of one batch of uint8 (3, s, s) images."""
    return batch_size * 3 * image_size * image_size


def jpeg_batch_bytes(paths, batch_size: int, image_size: int, sample: int = 64) -> int:
    """Estimated bytes of one ``--gpu-decode`` batch: the files' mean size (of up to ``sample``
    of them, doubled for safety), capped by the decoded size (non-JPEGs travel decoded)."""
    sizes = []
    for path in list(paths)[:sample]:
        try:
            sizes.append(Path(path).stat().st_size)
        except OSError:
            continue
    mean = (sum(sizes) / len(sizes)) if sizes else 3 * image_size * image_size
    return batch_size * int(min(2 * mean, 3 * image_size * image_size))


def _decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """One JPEG on the device; with PIL when the device decoder refuses it; None if neither can."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        pass
    try:
        with open_image(io.BytesIO(data.numpy().tobytes()), "a JPEG") as image:
            array = np.asarray(to_rgb(image))
    except DECODE_ERRORS:
        return None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(device)
