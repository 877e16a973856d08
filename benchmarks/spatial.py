"""What the compression of ``featcache features --spatial`` files costs and saves.

Writes the training rows of a spatial features file (``spatial-<tag>.h5``; with no file, the
maps of generated photos through a random-weight ResNet-50) again with each filter the option
offers (none, lzf, gzip level 1, gzip level 4; byte shuffle on, chunks of whole rows of about
4 MB, as ``featcache features`` writes them) and reports the stored / raw ratio, the write and
the read speed (a whole-split read, page cache warm), and the fraction of zero activations,
which decides the ratio.

    python -m benchmarks.spatial                                   # generated, 64 images at 448
    python -m benchmarks.spatial --file cache/voc/spatial-resnet50.h5   # a real file
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks._common import describe, machine, save
from benchmarks.photos import generated_images
from featcache.backbones import Uint8Normalize, create_backbone
from featcache.backbones.inputs import ImageRows
from featcache.data.featurewrite import GZIP_LEVEL, chunk_rows, hdf5_filters
from featcache.features.spatial import CHUNK_BYTES
from featcache.runtime import usable_cpus
from featcache.tables import Table

FILTERS = {"none": hdf5_filters(None), "lzf": hdf5_filters("lzf"),
           f"gzip {GZIP_LEVEL}": hdf5_filters("gzip"),
           "gzip 4": {**hdf5_filters("gzip"), "compression_opts": 4}}


def generated_rows(images: int, image_size: int) -> np.ndarray:
    """(N, H*W*D) float16 maps of generated photos, random-weight ResNet-50, (H, W, D) order."""
    folder, names, _ = generated_images(images, usable_cpus(), 1.0, None)
    dataset = ImageRows(folder, names, image_size)
    model, normalize = create_backbone("resnet50", "random"), Uint8Normalize()
    rows = []
    with torch.inference_mode():
        for start in range(0, len(names), 16):
            batch = torch.stack([dataset[i][0] for i in range(start, min(start + 16, len(names)))])
            fmap = model.feature_map(normalize(batch))
            rows.append(fmap.permute(0, 2, 3, 1).reshape(len(batch), -1).numpy().astype(np.float16))
    return np.concatenate(rows)


def measure(rows: np.ndarray, folder: Path) -> dict:
    height = chunk_rows(len(rows), rows.shape[1], rows.dtype, CHUNK_BYTES)
    out = {}
    for name, filters in FILTERS.items():
        path = folder / f"{name.replace(' ', '')}.h5"
        tick = time.perf_counter()
        with h5py.File(path, "w") as h5:
            h5.create_dataset("rows", data=rows, chunks=(height, rows.shape[1]),
                              **filters)
        write = time.perf_counter() - tick
        tick = time.perf_counter()
        with h5py.File(path, "r") as h5:
            h5["rows"][()]
        read = time.perf_counter() - tick
        out[name] = {"ratio": path.stat().st_size / rows.nbytes,
                     "write_MB_s": rows.nbytes / write / 1e6, "read_MB_s": rows.nbytes / read / 1e6}
        path.unlink()
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spatial", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default=None, help="a spatial features file (its train rows)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.file:
        with h5py.File(args.file, "r") as h5:
            rows, source = h5["train/features"][()], f"{args.file} (train rows)"
    else:
        rows = generated_rows(args.images, args.image_size)
        source = (f"{len(rows)} generated photos at {args.image_size}, random-weight ResNet-50")
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(rows, Path(folder))
    info = machine("cpu")
    zeros = float((rows == 0).mean())
    table = Table(["compression", "stored / raw", "write MB/s", "read MB/s"],
                  title=f"{source}: {rows.shape[0]} x {rows.shape[1]} {rows.dtype}, "
                        f"{rows.nbytes / 1e6:.0f} MB, {zeros:.0%} zeros; {describe(info)}",
                  formats={"stored / raw": "{:.3f}", "write MB/s": "{:.0f}", "read MB/s": "{:.0f}"})
    for name, row in figures.items():
        table.add(name, row["ratio"], row["write_MB_s"], row["read_MB_s"])
    print(table.markdown())
    document = {"benchmark": "spatial", "machine": info, "source": source,
                "shape": list(rows.shape), "zeros": zeros, "filters": figures}
    path = save("spatial-compression", document, args.out)
    print(f"figures saved to {path}")
    return document


if __name__ == "__main__":
    main()
