"""Dataset images as backbone inputs: decoded (as the reference does), resized, batched.

:class:`ImageRows` decodes with :func:`featcache.data.images.load_rgb` and resizes on the CPU
to uint8 in DataLoader workers; :class:`~featcache.backbones.registry.Uint8Normalize` finishes
the transform on the device. The datasets never raise for a bad image: they return
``ok = False`` and the caller, in the main process and in row order, either stops with one
error naming the file or flags the row (stage one's ``--skip-bad``).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from featcache.backbones.registry import resize_transform
from featcache.data.images import DECODE_ERRORS, load_rgb, require_strict_pil

_JPEG_START = b"\xff\xd8"
_JPEG_END = b"\xff\xd9"


class ImageRows(Dataset):
    """Images ``root / relpath`` for the given rows, resized on the CPU to uint8 (3, s, s).

    ``relpaths`` lists every image of the labels file (train then test); item ``i`` of the
    dataset is global row ``rows[i]`` and yields ``(image, row, ok)``. A bad image gives a zero
    tensor and ``ok = False``, never an exception (see the module docstring).
    """

    def __init__(self, root: str | os.PathLike, relpaths, image_size: int, rows=None):
        self.root = Path(root)
        self.relpaths = relpaths
        self.rows = range(len(relpaths)) if rows is None else rows
        self.image_size = image_size
        self.resize = resize_transform(image_size)

    def __len__(self) -> int:
        return len(self.rows)

    def path(self, row: int) -> Path:
        return self.root / str(self.relpaths[row])

    def __getitem__(self, index: int):
        row = int(self.rows[index])
        try:
            return self.resize(load_rgb(self.path(row))), row, True
        except DECODE_ERRORS:
            return torch.zeros(3, self.image_size, self.image_size, dtype=torch.uint8), row, False


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
    """DataLoader worker setup: strict PIL in every worker, whatever the start method."""
    require_strict_pil()


def decode_on_device(payloads, is_jpeg, image_size: int, device: torch.device):
    """Batch of :class:`JpegBytesRows` payloads -> (resized uint8 (B, 3, s, s) on ``device``,
    bool mask of the images that decoded).

    JPEG bytes are decoded with ``torchvision.io.decode_jpeg`` on the device (nvJPEG on CUDA),
    RGB, no EXIF rotation (as PIL), and resized with antialiased bilinear interpolation; the
    result is close to, not bit-identical with, PIL's decode and resize. A JPEG the device
    decoder refuses is decoded with PIL instead; one that PIL cannot read either is not ok.
    """
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    out = torch.zeros(len(payloads), 3, image_size, image_size, dtype=torch.uint8, device=device)
    ok = torch.ones(len(payloads), dtype=torch.bool)
    jpeg_index = [i for i, flag in enumerate(is_jpeg) if flag]
    if jpeg_index:
        data = [payloads[i] for i in jpeg_index]
        try:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:  # one bad file fails the whole batch: retry one by one
            decoded = [_decode_one(d, device) for d in data]
        for i, image in zip(jpeg_index, decoded, strict=True):
            if image is None:
                ok[i] = False
            else:
                out[i] = F.resize(image, [image_size, image_size], antialias=True)
    for i, flag in enumerate(is_jpeg):
        if not flag:
            out[i] = payloads[i].to(device, non_blocking=True)
    return out, ok


def _decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """One JPEG on the device; with PIL when the device decoder refuses it; None if neither can."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        pass
    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
            array = np.asarray(image.convert("RGB"))
    except DECODE_ERRORS:
        return None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(device)
