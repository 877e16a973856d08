"""What the checksums of issue 36 cost when reading, side by side with the same files without.

1. Features files: generated rows written as ``featcache`` writes them (pooled: float32, chunks
   of 1024 whole rows, no compression; spatial: float16, byte shuffle + gzip 1 in chunks of
   about 4 MB of whole rows), once without and once with HDF5's Fletcher32 checksum per chunk
   (:func:`featcache.hdf5.checksum_filter`), then read through the reader stage two uses
   (:func:`featcache.hdf5.read_checked`): the whole split (the in-memory path) and chunk-sized
   blocks (``--stream`` / ``--max-memory``). Page cache warm; median of ``--repeat`` reads.
2. ``best.pt``: a payload of ``--payload-mb`` MB of float32 tensors saved with ``torch.save``,
   loaded with ``torch.load(weights_only=True)`` alone (the baseline) and with
   :func:`featcache.torchfile.load_checked` (the CRC-32 of every zip member checked first).

    python -m benchmarks.checksums                     # VOC-sized: 11,540 x 2048 pooled
    python -m benchmarks.checksums --rows 2000 --spatial-rows 64 --payload-mb 8 --repeat 3  # tiny
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks._common import describe, machine, save
from featcache.data.featurewrite import BLOCK_ROWS, chunk_rows, hdf5_filters
from featcache.features.spatial import CHUNK_BYTES
from featcache.hdf5 import checksum_filter, read_checked
from featcache.tables import Table
from featcache.torchfile import load_checked

#: a ResNet-50 layer4 map at 448 px: 14 x 14 x 2048 values per row
SPATIAL_WIDTH = 14 * 14 * 2048


def _median_seconds(work, repeat: int) -> float:
    work()  # warm: the page cache holds the file, HDF5's library is loaded
    times = []
    for _ in range(repeat):
        tick = time.perf_counter()
        work()
        times.append(time.perf_counter() - tick)
    return statistics.median(times)


def _read_seconds(path: Path, rows: int, height: int, repeat: int) -> tuple[float, float]:
    """Median seconds to read the file's rows whole, and in blocks of ``height`` rows."""
    with h5py.File(path, "r") as h5:
        dataset = h5["features"]
        whole = _median_seconds(lambda: read_checked(dataset, path, ""), repeat)
        blocks = _median_seconds(lambda: [read_checked(dataset, path, "", start, start + height)
                                          for start in range(0, rows, height)], repeat)
    return whole, blocks


def measure_features(rows: np.ndarray, folder: Path, kind: str, repeat: int) -> dict:
    """Read MB/s of ``rows`` stored without and with checksums, whole and in chunk blocks."""
    if kind == "pooled":
        height, filters = min(len(rows), BLOCK_ROWS), hdf5_filters(None)
    else:
        height = chunk_rows(len(rows), rows.shape[1], rows.dtype, CHUNK_BYTES)
        filters = hdf5_filters("gzip")
    out = {}
    for name, extra in (("without checksums", {}), ("with checksums", checksum_filter())):
        path = folder / f"{kind}-{len(extra)}.h5"
        with h5py.File(path, "w") as h5:
            h5.create_dataset("features", data=rows, chunks=(height, rows.shape[1]), **filters,
                              **extra)
        whole, blocks = _read_seconds(path, len(rows), height, repeat)
        out[name] = {"whole_MB_s": rows.nbytes / whole / 1e6,
                     "blocks_MB_s": rows.nbytes / blocks / 1e6,
                     "file_MB": path.stat().st_size / 1e6}
        path.unlink()
    return out


def measure_torch_file(payload_mb: int, folder: Path, repeat: int) -> dict:
    """Seconds to load a best.pt-like file: torch.load alone and load_checked."""
    generator = torch.Generator().manual_seed(0)
    count = max(1, payload_mb * 1_000_000 // 4 // 16)
    payload = {"format": "bench", "state": {f"layer{i}": torch.randn(count, generator=generator)
                                            for i in range(16)}}
    path = folder / "best.pt"
    torch.save(payload, path)
    plain = _median_seconds(lambda: torch.load(path, map_location="cpu", weights_only=True), repeat)
    checked = _median_seconds(lambda: load_checked(path, ""), repeat)
    return {"file_MB": path.stat().st_size / 1e6, "torch_load_s": plain, "load_checked_s": checked}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checksums", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=11_540, help="pooled rows (VOC: 11,540)")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--spatial-rows", type=int, default=512,
                        help=f"spatial rows of {SPATIAL_WIDTH} float16 values")
    parser.add_argument("--payload-mb", type=int, default=94, help="best.pt size (a ResNet-50's: 94)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    pooled = np.abs(rng.standard_normal((args.rows, args.width), dtype=np.float32))
    spatial = np.maximum(rng.standard_normal((args.spatial_rows, SPATIAL_WIDTH),
                                             dtype=np.float32), 0).astype(np.float16)
    with tempfile.TemporaryDirectory() as folder:
        figures = {"pooled": measure_features(pooled, Path(folder), "pooled", args.repeat),
                   "spatial": measure_features(spatial, Path(folder), "spatial", args.repeat)}
        torch_file = measure_torch_file(args.payload_mb, Path(folder), args.repeat)
    info = machine("cpu")
    table = Table(["file", "stored", "whole split MB/s", "chunk blocks MB/s"],
                  title=f"reading features files without and with checksums; {describe(info)}; "
                        f"{info['load']}",
                  formats={"whole split MB/s": "{:.0f}", "chunk blocks MB/s": "{:.0f}"})
    for kind, array in (("pooled", pooled), ("spatial", spatial)):
        for name, row in figures[kind].items():
            table.add(f"{kind} {array.shape[0]:,} x {array.shape[1]:,} {array.dtype}", name,
                      row["whole_MB_s"], row["blocks_MB_s"])
    print(table.markdown())
    print(f"\nbest.pt of {torch_file['file_MB']:.0f} MB: torch.load {torch_file['torch_load_s']:.3f} s, "
          f"load_checked (CRC-32 + torch.load) {torch_file['load_checked_s']:.3f} s")
    document = {"benchmark": "checksums", "machine": info, "features": figures,
                "torch_file": torch_file, "args": vars(args)}
    path = save("checksums", document, args.out)
    print(f"figures saved to {path}")
    return document


if __name__ == "__main__":
    main()
