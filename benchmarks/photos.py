"""Generated photo-like JPEGs for the image benchmarks (VOC's sizes and compression).

Each benchmark row reads its own pass over the files, so that every image of a timed window is
decoded once and only inside it (:mod:`benchmarks.window`). A pass can need tens of thousands of
files on a GPU; :data:`DISTINCT_PHOTOS` of them are drawn, and the others are hard links to
them (file ``i`` has the contents of file ``i % DISTINCT_PHOTOS``): a distinct name, decoded in
full like any other (neither PIL nor nvJPEG keeps anything of a decoded file), for no disk and
no drawing time.
"""

from __future__ import annotations

import os
import shutil
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks._common import BENCH_DIR
from featcache.data.synthetic import write_image_labels

#: (width, height) of VOC-like photos; the generator cycles through them
PHOTO_SIZES = ((500, 375), (500, 333), (375, 500), (500, 400))
#: photos drawn; files beyond these repeat their contents (296 MB of JPEGs at VOC's size)
DISTINCT_PHOTOS = 4096


def photo_like_jpeg(args: tuple[Path, int, float]) -> int:
    """One JPEG with a photo's size and entropy (smooth regions, edges, texture, noise)."""
    path, seed, scale = args
    rng = np.random.default_rng(seed)
    width, height = (round(v * scale) for v in PHOTO_SIZES[seed % len(PHOTO_SIZES)])
    coarse = rng.integers(0, 256, size=(rng.integers(3, 8), rng.integers(3, 8), 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.02, 0.3), rng.uniform(0.02, 0.3), rng.uniform(0, 6.3)
        image += rng.uniform(5, 20) * np.sin(fx * xx + fy * yy + phase)[..., None]
    image += rng.normal(0, 12, size=image.shape)
    data = np.clip(image, 0, 255).astype(np.uint8)
    Image.fromarray(data).save(path, format="JPEG", quality=90)
    return path.stat().st_size


def generated_images(count: int, processes: int, scale: float = 1.0,
                     root: Path | None = None) -> tuple[Path, list[str], float]:
    """``count`` photo-like JPEGs (``scale`` x VOC's sizes) made once; (folder, names, mean kB)."""
    name = "extract-images" if scale == 1.0 else f"extract-images-x{scale:g}"
    folder = (root or BENCH_DIR) / name
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(count)]
    todo = [(folder / n, i, scale) for i, n in enumerate(names[:DISTINCT_PHOTOS])
            if not (folder / n).exists()]
    if todo:
        print(f"generating {len(todo)} photo-like JPEGs in {folder} ...", flush=True)
        with Pool(max(1, processes)) as pool:
            pool.map(photo_like_jpeg, todo, chunksize=16)
    for i, name in enumerate(names[DISTINCT_PHOTOS:], start=DISTINCT_PHOTOS):
        if not (folder / name).exists():
            _link(folder / names[i % DISTINCT_PHOTOS], folder / name)
    sizes = [(folder / n).stat().st_size for n in names]
    return folder, names, float(np.mean(sizes)) / 1e3


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)


def image_dataset(count: int, processes: int, root: Path | None = None,
                  scale: float = 1.0) -> tuple[Path, Path, list[str], float]:
    """A labels file over ``count`` generated JPEGs: (labels path, image folder, names, mean kB)."""
    folder, names, mean_kb = generated_images(count, processes, scale, root)
    suffix = "" if scale == 1.0 else f"-x{scale:g}"
    labels = (root or BENCH_DIR) / "extract-data" / f"photos{count}{suffix}" / "labels.h5"
    n_train = max(1, int(count * 0.8))
    write_image_labels(labels, names[:n_train], names[n_train:], str(folder.resolve()),
                       dataset=labels.parent.name, overwrite=True)
    return labels, folder, names, mean_kb
