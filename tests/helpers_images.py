"""Small generated images and labels files for tests of the image stages (no real photographs).

``write_image`` makes one file of a given kind (plain JPEG, PNG with alpha, grayscale, CMYK,
EXIF-rotated, palette with transparency, 16-bit grayscale, and broken ones: empty, truncated, not
an image);
``make_dataset`` writes a folder of images and a labels file that lists them.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from featcache.data.synthetic import write_image_labels

GOOD_KINDS = ("jpeg", "png", "png_alpha", "gray", "cmyk", "exif", "palette")
#: images deeper than 8 bits, which the reference's decode would clip to white
DEEP_KINDS = ("png16",)
BAD_KINDS = ("empty", "truncated", "garbage")


def pattern(seed: int, size=(56, 44)) -> np.ndarray:
    """An RGB uint8 array (height x width x 3): smooth colour blobs plus noise, unique per seed."""
    rng = np.random.RandomState(seed)
    width, height = size
    coarse = rng.randint(0, 256, size=(4, 4, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR), dtype=np.int16)
    noise = rng.randint(-20, 21, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def jpeg_bytes(array: np.ndarray, quality: int = 90, **save_args) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality, **save_args)
    return buffer.getvalue()


def write_image(path: Path, kind: str = "jpeg", seed: int = 0, size=(56, 44)) -> Path:
    """Write one test image of ``kind`` (see ``GOOD_KINDS`` and ``BAD_KINDS``) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = pattern(seed, size)
    if kind == "jpeg":
        path.write_bytes(jpeg_bytes(rgb))
    elif kind == "png":
        Image.fromarray(rgb).save(path, format="PNG")
    elif kind == "png_alpha":
        alpha = np.linspace(0, 255, rgb.shape[0] * rgb.shape[1]).reshape(rgb.shape[:2]).astype(np.uint8)
        Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA").save(path, format="PNG")
    elif kind == "gray":
        Image.fromarray(rgb).convert("L").save(path, format="JPEG", quality=90)
    elif kind == "cmyk":
        Image.fromarray(rgb).convert("CMYK").save(path, format="JPEG", quality=90)
    elif kind == "exif":
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90 CW to display; PIL's open() must ignore it
        path.write_bytes(jpeg_bytes(rgb, exif=exif.tobytes()))
    elif kind == "palette":
        image = Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=16)
        image.info["transparency"] = 0
        image.save(path, format="PNG", transparency=0)
    elif kind == "png16":  # 16-bit grayscale: the grey of "gray16_twin" times 257
        grey = np.asarray(Image.fromarray(rgb).convert("L"), dtype=np.uint16)
        Image.fromarray(grey * 257).save(path, format="PNG")
    elif kind == "gray16_twin":  # the 8-bit PNG that "png16" holds, exactly
        Image.fromarray(rgb).convert("L").save(path, format="PNG")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        data = jpeg_bytes(rgb)
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        path.write_bytes(np.random.RandomState(seed).bytes(2000))
    else:
        raise ValueError(f"unknown image kind {kind!r}")
    return path


def make_dataset(base: Path, num_train: int = 12, num_test: int = 6, kinds: dict | None = None,
                 name: str = "toy", num_classes: int = 3, seed: int = 0,
                 image_root: str | None = None, size=(56, 44)) -> Path:
    """Images under ``base/images`` and a labels file ``base/cache/<name>/labels.h5``.

    ``kinds`` maps an image index (train first, then test) to a kind; every other image is a
    plain JPEG. Returns the labels file's path.
    """
    kinds = kinds or {}
    root = Path(base) / "images"
    names = []
    for index in range(num_train + num_test):
        kind = kinds.get(index, "jpeg")
        suffix = ".png" if kind.startswith(("png", "palette", "gray16")) else ".jpg"
        rel = f"{'train' if index < num_train else 'test'}/img{index:04d}{suffix}"
        write_image(root / rel, kind, seed=seed * 1000 + index, size=size)
        names.append(rel)
    return write_image_labels(
        Path(base) / "cache" / name / "labels.h5", names[:num_train], names[num_train:],
        str(root if image_root is None else image_root), dataset=name, num_classes=num_classes,
        seed=seed,
    )
