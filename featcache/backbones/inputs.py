"""Dataset images as backbone inputs: decoded (as the reference does), resized, batched.

:class:`ImageRows` decodes with :func:`featcache.data.images.load_rgb` and resizes on the CPU
to uint8 in DataLoader workers; :class:`~featcache.backbones.transforms.Uint8Normalize` finishes
the transform on the device. The datasets never raise for a bad image: they return
``ok = False`` and the caller, in the main process and in row order, either stops with one
error naming the file or flags the row (stage one's ``--skip-bad``).

:class:`JpegBytesRows` and :class:`DeviceDecoder` are ``--gpu-decode``: workers only read the
files, and the device decodes a whole batch at once (nvJPEG), resizes it there, and works one
batch ahead of the forward pass. :func:`loader_prefetch` bounds how many batches the workers
keep in shared memory and fails clearly when ``/dev/shm`` cannot hold them.
"""

from __future__ import annotations

import io
import math
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from featcache.backbones.preprocess import PROTOCOL, Preprocess
from featcache.backbones.transforms import resize_transform
from featcache.data.images import DECODE_ERRORS, load_rgb, require_strict_pil, to_rgb
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


class JpegBytesRows(ImageRows):
    """For ``--gpu-decode``: plain JPEG files come back as their bytes, decoded later on the device.

    Item: ``(payload, row, ok, is_jpeg)``. A JPEG that PIL reads as RGB or L and that ends with
    the end-of-image marker is sent as bytes (uint8, 1-D); everything else (PNG, CMYK or
    truncated JPEG, ...) is decoded here with PIL and resized, exactly like :class:`ImageRows`.
    """

    def __getitem__(self, index: int):
        row = int(self.rows[index])
        path = self.path(row)
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        if data.startswith(_JPEG_START) and data.rstrip(b"\x00").endswith(_JPEG_END):
            try:
                with Image.open(path) as image:  # reads the header only
                    plain = image.format == "JPEG" and image.mode in ("RGB", "L")
            except DECODE_ERRORS:
                plain = False
            if plain:
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), row, True, True
        image, row, ok = super().__getitem__(index)
        return image, row, ok, False


def collate_jpeg_rows(items):
    """Collate :class:`JpegBytesRows` items into lists (payloads differ in size)."""
    payloads, rows, ok, is_jpeg = zip(*items, strict=True)
    return list(payloads), torch.tensor(rows), torch.tensor(ok), list(is_jpeg)


def worker_init(_worker_id: int) -> None:
    """DataLoader worker setup: strict PIL in every worker, whatever the start method; Ctrl-C
    left to the main process (a terminal sends it to the workers too), which stops the loader
    at a safe point (:mod:`featcache.interrupt`)."""
    require_strict_pil()
    ignore_in_worker()


def decode_on_device(payloads, is_jpeg, image_size: int, device: torch.device,
                     preprocess: Preprocess = PROTOCOL):
    """Batch of :class:`JpegBytesRows` payloads -> (resized uint8 (B, 3, s, s) on ``device``,
    bool mask of the images that decoded).

    The batch's JPEG bytes are decoded by one ``torchvision.io.decode_jpeg`` call on the device
    (nvJPEG's batched decoder on CUDA), RGB, no EXIF rotation (as PIL); images of the same size
    are then resized (and cropped) together as ``preprocess`` says, antialiased (the
    protocol's: bilinear, no crop). The result is close to,
    not bit-identical with, PIL's decode and resize. A JPEG the device decoder refuses is
    decoded with PIL instead; one that PIL cannot read either is not ok.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    out = torch.zeros(len(payloads), 3, image_size, image_size, dtype=torch.uint8, device=device)
    ok = torch.ones(len(payloads), dtype=torch.bool)
    jpeg_index = [i for i, flag in enumerate(is_jpeg) if flag]
    if jpeg_index:
        data = [payloads[i] for i in jpeg_index]
        try:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:  # one bad file fails the whole batch: retry one by one
            decoded = [_decode_one(d, device) for d in data]
        by_shape: dict[tuple, list[int]] = {}
        for i, image in zip(jpeg_index, decoded, strict=True):
            if image is None:
                ok[i] = False
            else:
                by_shape.setdefault(tuple(image.shape), []).append(i)
        position = {i: k for k, i in enumerate(jpeg_index)}
        for members in by_shape.values():
            stacked = torch.stack([decoded[position[i]] for i in members])
            out[members] = _resize(stacked, image_size, preprocess)
    for i, flag in enumerate(is_jpeg):
        if not flag:
            out[i] = payloads[i].to(device, non_blocking=True)
    return out, ok


def _resize(batch: torch.Tensor, image_size: int,
            preprocess: Preprocess = PROTOCOL) -> torch.Tensor:
    """uint8 (B, 3, h, w) -> (B, 3, s, s) as ``preprocess`` resizes (and crops), antialiased
    (one call per batch; the protocol's: bilinear squash)."""
    return preprocess.resize_tensor(batch, image_size)


class DeviceDecoder:
    """``--gpu-decode``'s pipeline: iterate a loader of :class:`JpegBytesRows` batches and yield
    ``(images on the device, rows, ok)``, decoding batch i + 1 while batch i is computed.

    A helper thread decodes (nvJPEG's host-side Huffman decoding runs there, not on the thread
    that launches the forward pass) on a CUDA stream of its own; the consumer's stream waits
    for the batch's event before using it, so decoding overlaps the forward pass on the GPU too.
    On the CPU the same pipeline runs without streams.
    """

    def __init__(self, loader, image_size: int, device: torch.device,
                 preprocess: Preprocess = PROTOCOL):
        self.loader = loader
        self.image_size = image_size
        self.device = device
        self.preprocess = preprocess
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _decode(self, batch):
        payloads, rows, ok, is_jpeg = batch
        if self.stream is None:
            images, decoded = decode_on_device(payloads, is_jpeg, self.image_size, self.device,
                                               self.preprocess)
            return images, rows, ok & decoded, None
        with torch.cuda.stream(self.stream):
            images, decoded = decode_on_device(payloads, is_jpeg, self.image_size, self.device,
                                               self.preprocess)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return images, rows, ok & decoded, ready

    def __iter__(self):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="featcache-decode") as pool:
            batches = iter(self.loader)
            pending = next((pool.submit(self._decode, b) for b in batches), None)
            while pending is not None:
                images, rows, ok, ready = pending.result()
                pending = next((pool.submit(self._decode, b) for b in batches), None)
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
        with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
            array = np.asarray(to_rgb(image))
    except DECODE_ERRORS:
        return None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(device)
