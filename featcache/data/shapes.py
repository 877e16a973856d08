"""``shapes``: the embedded default dataset, generated on the spot (no download, no photos).

Ten classes of drawn objects (circle, square, triangle, star, cross, ring, hexagon, diamond,
crescent, arrow) in varied colours, sizes and rotations on varied backgrounds (gradients,
noise, stripes, checkerboards, blotches); 1 to 4 objects of different classes per image;
image sizes between 160 and 320 pixels with photo-like aspect ratios. Every image has its own
``RandomState([seed, split, index])``, so a seed always gives the same JPEG bytes, and image
``i`` of a split always contains class ``i mod 10``, so every class occurs in both splits.

Every object's box (the tight box of its drawn mask, clipped to the image) and area (its mask's
pixels) are kept like COCO's annotations, for the label-bias samplers, and written to
``objects.json`` beside the images.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from featcache.data.formats import SourceDataset, SourceSplit
from featcache.data.objects import ImageObjects
from featcache.data.prepare import (
    Notify,
    PrepareOptions,
    PrepareResult,
    prepare_dataset,
)
from featcache.errors import OptionError
from featcache.fileio import refuse_existing
from featcache.interrupt import uninterrupted
from featcache.progress import progress

SHAPE_CLASSES = ("circle", "square", "triangle", "star", "cross", "ring", "hexagon", "diamond",
                 "crescent", "arrow")
SPLIT_CODES = {"train": 1, "test": 2}
SIZE_RANGE = (160, 320)
ASPECTS = (1.0, 4 / 3, 3 / 4, 3 / 2, 2 / 3, 16 / 9)
MAX_OBJECTS = 4
JPEG_QUALITY = 90
#: masks are drawn this many times larger, then shrunk: smooth edges like a photo's
SUPERSAMPLE = 2
GRAIN_TILE = 64
GENERATOR_VERSION = 1
#: the objects of every image, beside the images
OBJECTS_FILE = "objects.json"


def generate_shapes(folder: str | os.PathLike, num_train: int = 300, num_test: int = 150,
                    seed: int = 0) -> SourceDataset:
    """Write ``<folder>/{train,test}/<index>.jpg`` and return their labels.

    The images' relative paths are ``train/000000.jpg`` and so on; the returned details hold
    a sha256 over all image bytes, which stays the same from run to run for a given seed.
    """
    for option, value in (("--num-train", num_train), ("--num-test", num_test)):
        if value < len(SHAPE_CLASSES):
            raise OptionError(f"{option} must be at least {len(SHAPE_CLASSES)} (one image per "
                              f"class), got {value}")
    folder = Path(folder)
    digest = hashlib.sha256()
    splits = {}
    listing = {}  # image name -> its objects, for OBJECTS_FILE
    for split, count in (("train", num_train), ("test", num_test)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        images, clean = [], np.zeros((count, len(SHAPE_CLASSES)), dtype=np.uint8)
        boxes = []
        for index in progress(range(count), desc=f"drawing {split} images", unit=" img",
                          mininterval=0.5, leave=False):
            rng = np.random.RandomState([seed, SPLIT_CODES[split], index])
            image, objects = draw_image(rng, first_class=index % len(SHAPE_CLASSES))
            name = f"{split}/{index:06d}.jpg"
            image.save(folder / name, format="JPEG", quality=JPEG_QUALITY)
            digest.update((folder / name).read_bytes())
            images.append(name)
            clean[index, objects.classes] = 1
            boxes.append(objects)
            listing[name] = objects.to_json()
        splits[split] = SourceSplit(images, clean, objects=boxes)
    (folder / OBJECTS_FILE).write_text(json.dumps(
        {"classes": list(SHAPE_CLASSES), "box": "x, y, width, height in pixels (top-left corner)",
         "images": listing}) + "\n")
    return SourceDataset(
        name="shapes",
        source_format="shapes",
        classes=list(SHAPE_CLASSES),
        train=splits["train"],
        test=splits["test"],
        image_root=folder,
        source_files=[],
        details={"generator": f"featcache.data.shapes v{GENERATOR_VERSION}", "seed": seed,
                 "num_train": num_train, "num_test": num_test,
                 "images_sha256": digest.hexdigest()},
    )


def draw_image(rng: np.random.RandomState, first_class: int) -> tuple[Image.Image, ImageObjects]:
    """One image with 1 to 4 objects of distinct classes, ``first_class`` among them, and the
    objects' boxes and areas in drawing order."""
    width, height = _image_size(rng)
    canvas = Image.fromarray(_background(rng, width, height))
    count = rng.randint(1, MAX_OBJECTS + 1)
    others = [c for c in range(len(SHAPE_CLASSES)) if c != first_class]
    classes = [first_class] + [int(c) for c in rng.choice(others, count - 1, replace=False)]
    placed: list[tuple[float, float, float]] = []
    objects = ImageObjects(float(width), float(height))
    for cls in classes:
        radius = rng.uniform(0.12, 0.24) * min(width, height)
        x, y = _free_spot(rng, width, height, radius, placed)
        placed.append((x, y, radius))
        mask, corner = _shape_mask(SHAPE_CLASSES[cls], x, y, radius,
                                   angle=rng.uniform(0, 2 * np.pi))
        under = canvas.crop((*corner, corner[0] + mask.width, corner[1] + mask.height))
        colour = _contrasting_colour(rng, np.asarray(under), mask)
        canvas.paste(colour, (*corner, corner[0] + mask.width, corner[1] + mask.height), mask)
        objects.add(cls, *_mask_box(mask, corner, width, height))
    return canvas, objects


def _mask_box(mask: Image.Image, corner: tuple[int, int], width: int,
              height: int) -> tuple[tuple[float, float, float, float], float]:
    """The (x, y, w, h) box of a mask's pixels inside the image, and their count (the area)."""
    inside = np.asarray(mask) > 127
    ys, xs = np.nonzero(inside)
    xs, ys = xs + corner[0], ys + corner[1]
    keep = (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height)
    xs, ys = xs[keep], ys[keep]
    box = (float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1),
           float(ys.max() - ys.min() + 1))
    return box, float(keep.sum())


def _image_size(rng: np.random.RandomState) -> tuple[int, int]:
    aspect = ASPECTS[rng.randint(len(ASPECTS))]
    low, high = SIZE_RANGE
    longer = rng.randint(low + 40, high + 1)
    shorter = max(low, int(round(longer / max(aspect, 1 / aspect))))
    return (longer, shorter) if aspect >= 1 else (shorter, longer)


def _background(rng: np.random.RandomState, width: int, height: int) -> np.ndarray:
    """An (height, width, 3) uint8 background: gradient, noise, stripes, checks or blotches."""
    kind = rng.randint(5)
    low = rng.uniform(0, 255, 3).astype(np.float32)
    high = rng.uniform(0, 255, 3).astype(np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, np.pi)
    along = (xx * np.cos(angle) + yy * np.sin(angle)) / np.hypot(width, height)
    if kind == 0:  # linear gradient
        weight = (along - along.min()) / max(float(np.ptp(along)), 1e-6)
    elif kind == 1:  # coarse noise, smoothly upscaled
        coarse = rng.uniform(0, 1, (rng.randint(3, 9), rng.randint(3, 9)))
        weight = np.asarray(Image.fromarray((coarse * 255).astype(np.uint8)).resize(
            (width, height), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    elif kind == 2:  # stripes
        period = rng.uniform(0.04, 0.15)
        weight = (np.sin(along / period * 2 * np.pi) > 0).astype(np.float32)
    elif kind == 3:  # checkerboard
        cell = rng.randint(12, 40)
        weight = ((xx // cell + yy // cell) % 2).astype(np.float32)
    else:  # soft radial blotch
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        weight = np.clip(np.hypot(xx - cx, yy - cy) / (0.7 * max(width, height)), 0, 1)
    pixels = low + weight[..., None] * (high - low)
    # Sensor-like grain: a tile of noise repeated (drawing it per pixel is slow).
    grain = rng.normal(0, rng.uniform(2, 14), (GRAIN_TILE, GRAIN_TILE, 3)).astype(np.float32)
    pixels += np.tile(grain, (height // GRAIN_TILE + 1, width // GRAIN_TILE + 1, 1))[:height, :width]
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _free_spot(rng: np.random.RandomState, width: int, height: int, radius: float,
               placed: list[tuple[float, float, float]]) -> tuple[float, float]:
    """A centre that keeps the object inside the image and mostly clear of the others."""
    best, best_gap = None, -np.inf
    for _ in range(30):
        x = rng.uniform(radius, width - radius)
        y = rng.uniform(radius, height - radius)
        gap = min((np.hypot(x - px, y - py) - 0.8 * (radius + pr) for px, py, pr in placed),
                  default=np.inf)
        if gap >= 0:
            return x, y
        if gap > best_gap:
            best, best_gap = (x, y), gap
    assert best is not None  # every gap is above -inf
    return best


def _shape_mask(name: str, x: float, y: float, radius: float,
                angle: float) -> tuple[Image.Image, tuple[int, int]]:
    """An 'L' mask of the object's bounding box (255 inside) and the box's top-left corner.

    Drawn supersampled, then shrunk, for smooth edges like a photo's.
    """
    s = SUPERSAMPLE
    left, top = int(np.floor(x - radius)) - 1, int(np.floor(y - radius)) - 1
    size = int(np.ceil(2 * radius)) + 3
    mask = Image.new("L", (size * s, size * s), 0)
    draw = ImageDraw.Draw(mask)
    cx, cy, r = (x - left) * s, (y - top) * s, radius * s

    def box(radius_: float, dx: float = 0.0, dy: float = 0.0) -> list[float]:
        return [cx + dx - radius_, cy + dy - radius_, cx + dx + radius_, cy + dy + radius_]

    if name == "circle":
        draw.ellipse(box(r), fill=255)
    elif name == "ring":
        draw.ellipse(box(r), fill=255)
        draw.ellipse(box(0.6 * r), fill=0)
    elif name == "crescent":
        draw.ellipse(box(r), fill=255)
        draw.ellipse(box(0.85 * r, 0.5 * r * np.cos(angle), 0.5 * r * np.sin(angle)), fill=0)
    else:
        points = _polygon(name)
        rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        points = points @ rotation.T * r + (cx, cy)
        draw.polygon([tuple(p) for p in points], fill=255)
    return mask.resize((size, size), Image.Resampling.BOX), (left, top)


def _polygon(name: str) -> np.ndarray:
    """Vertices of a polygonal class around (0, 0), radius about 1."""
    if name in ("square", "triangle", "hexagon"):
        sides = {"square": 4, "triangle": 3, "hexagon": 6}[name]
        t = np.arange(sides) * 2 * np.pi / sides + np.pi / sides
        return np.stack([np.cos(t), np.sin(t)], axis=1)
    if name == "star":
        t = np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 1.0, 0.42)
        return np.stack([radii * np.cos(t), radii * np.sin(t)], axis=1)
    if name == "diamond":
        return np.array([[0, -1], [0.6, 0], [0, 1], [-0.6, 0]])
    if name == "cross":
        a, b = 0.3, 1.0
        return np.array([[-a, -b], [a, -b], [a, -a], [b, -a], [b, a], [a, a], [a, b], [-a, b],
                         [-a, a], [-b, a], [-b, -a], [-a, -a]])
    if name == "arrow":
        return np.array([[-1, -0.25], [0.2, -0.25], [0.2, -0.6], [1, 0], [0.2, 0.6],
                         [0.2, 0.25], [-1, 0.25]])
    raise ValueError(f"no polygon for {name!r}")


def _contrasting_colour(rng: np.random.RandomState, pixels: np.ndarray,
                        mask: Image.Image) -> tuple[int, int, int]:
    """A saturated colour far from the mean colour of what the object will cover."""
    inside = np.asarray(mask) > 127
    under = pixels[inside].mean(axis=0) if inside.any() else pixels.reshape(-1, 3).mean(axis=0)
    colour = rng.uniform(0, 255, 3)
    for _ in range(20):
        if np.abs(colour - under).sum() > 180:
            break
        colour = rng.uniform(0, 255, 3)
    red, green, blue = (int(c) for c in colour)
    return red, green, blue


def prepare_shapes(directory: str | os.PathLike, num_train: int = 300, num_test: int = 150,
                   seed: int = 0, options: PrepareOptions | None = None,
                   extra: dict | None = None, notify: Notify | None = None) -> PrepareResult:
    """Generate the images into ``<directory>/images`` and write ``<directory>/labels.h5``.

    The images are drawn into a temporary folder first; an old dataset is replaced only once
    the new images and labels are complete, and restored if writing the labels fails.
    """
    options = options or PrepareOptions()
    directory = Path(directory)
    images, labels = directory / "images", directory / "labels.h5"
    for path in (labels, images):
        refuse_existing(path, options.overwrite)
    staging = directory / f".images.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        source = generate_shapes(staging, num_train, num_test, seed)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    with uninterrupted():  # never the old images moved aside without the new ones in place
        if images.exists():
            old = images.with_name(f".images.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(images, old)
        os.replace(staging, images)
    source.image_root = images
    try:
        result = prepare_dataset(source, labels, options, extra, notify)
    except BaseException:
        with uninterrupted():
            shutil.rmtree(images, ignore_errors=True)
            if old is not None:
                os.replace(old, images)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return result
