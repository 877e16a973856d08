"""Stage one speed in steady state: decode, forward and end to end, ours next to a plain loop.

Every figure is images / second over ``--timed`` batches after ``--warmup`` untimed ones
(DataLoader workers starting, cuDNN autotuning, the allocator, nvJPEG's start-up are paid in
the warm-up), on generated JPEGs of photo size and compression (about 500 x 375 like VOC's,
quality 90, 65-80 kB), resized to ``--image-size``:

- decode only, PIL: our DataLoader (PIL decode + resize to uint8 in ``--workers`` processes),
  no model; and the cost of one PIL decode + resize per image on one core;
- decode only, device (``--gpu-decode``): the same files decoded by nvJPEG a batch at a time;
- forward only: normalisation + the backbone (``--backbone``: any registered one) on a batch
  already on the device (our precision and memory layout: channels_last for convolutional nets);
- end to end, ours: the engine's own loader, decode path and forward
  (:class:`featcache.features.extraction.Extraction`), features copied to the host per chunk;
- end to end, baseline: the plain loop, in the same run with the same batch size and workers:
  a Dataset that opens each file with PIL and applies the full torchvision transform (Resize,
  ToTensor, Normalize: float32 batches), a DataLoader, fp32, NCHW, ``.cpu()`` of every batch.

The device, batch size, workers and precision are printed and saved with the figures in
``cache/bench/extract-<device>.json``.

    python -m benchmarks.extract                         # CPU: batch 16, 2 + 4 batches (minutes)
    python -m benchmarks.extract --device cuda --gpu-decode   # GPU: batch 256, 3 + 12 batches
    python -m benchmarks.extract --device cuda --image-size 224 --workers 15
"""

from __future__ import annotations

import argparse
import itertools
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from benchmarks._common import BENCH_DIR, describe, machine, save, steady_rate, synchronize
from featcache.backbones import Uint8Normalize, backbone_spec, create_backbone, image_transform
from featcache.backbones.inputs import ImageRows, loader_prefetch, uint8_batch_bytes
from featcache.data.labelfile import load_labels
from featcache.data.synthetic import write_image_labels
from featcache.features.extract import Extraction, ExtractOptions
from featcache.features.shards import ChunkStore
from featcache.runtime import (
    autocast,
    backend_flags,
    default_batch_size,
    default_workers,
    resolve_precision,
    single_process,
    usable_cpus,
)
from featcache.tables import Table

#: (width, height) of VOC-like photos; the generator cycles through them
PHOTO_SIZES = ((500, 375), (500, 333), (375, 500), (500, 400))


# ---------------------------------------------------------------------------- data
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
    todo = [(folder / n, i, scale) for i, n in enumerate(names) if not (folder / n).exists()]
    if todo:
        print(f"generating {len(todo)} photo-like JPEGs in {folder} ...", flush=True)
        with Pool(max(1, processes)) as pool:
            pool.map(photo_like_jpeg, todo, chunksize=16)
    sizes = [(folder / n).stat().st_size for n in names]
    return folder, names, float(np.mean(sizes)) / 1e3


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


# ---------------------------------------------------------------------------- measurements
def pil_ms_per_image(folder: Path, names: list[str], image_size: int, count: int = 32,
                     draft: bool = False) -> float:
    """Milliseconds of one PIL decode + resize to uint8 on one core (this process, no workers)."""
    dataset = ImageRows(folder, names[:count], image_size, draft=draft)
    dataset[0]  # first-call costs
    started = time.process_time()
    for index in range(len(dataset)):
        dataset[index]
    return (time.process_time() - started) / len(dataset) * 1e3


def cycle(loader):
    """Batches of ``loader`` again and again (the timed part never runs dry)."""
    while True:
        yield from loader


class Ours:
    """The engine's pieces for one setting: its loader, decode path, normalisation, forward."""

    def __init__(self, labels_path: Path, args, device: torch.device, gpu_decode: bool):
        self.options = ExtractOptions(
            backbone=args.backbone, weights="random", image_size=args.image_size,
            batch_size=args.batch_size, workers=args.workers, precision=args.precision,
            device=str(device), gpu_decode=gpu_decode, jpeg_draft=args.jpeg_draft and not gpu_decode)
        labels = load_labels(labels_path)
        self.run = Extraction(self.options, labels, single_process(device),
                              labels_path.parent / "features-bench.h5", say=lambda _: None)
        self.device = device
        self.model = create_backbone(args.backbone, "random", image_size=args.image_size).to(
            device, memory_format=layout_of(args.backbone))
        rows = list(range(len(self.run.images)))
        self.store = ChunkStore(self.run.final, {}, len(rows), self.run.chunk_rows,
                                backbone_spec(args.backbone).dim)
        self.loader = self.run.loader(Path(labels.image_root), rows, self.store,
                                      list(range(self.store.num_chunks)))

    def decode_only(self, warmup: int, timed: int) -> dict:
        return steady_rate(cycle_batches(self.run, self.loader), lambda b: len(b[1]), warmup,
                           timed, self.device)

    def end_to_end(self, warmup: int, timed: int) -> dict:
        parts, chunk_rows = [], self.run.chunk_rows

        def work(batch) -> int:
            images, rows, _, _ = batch
            x = self.run.layout(self.run.normalize(images))
            parts.append(self.run.forward(self.model, x))
            if sum(len(p) for p in parts) >= chunk_rows:  # the engine's host copy per chunk
                torch.cat(parts).cpu()
                parts.clear()
            return len(rows)

        with torch.inference_mode():
            return steady_rate(cycle_batches(self.run, self.loader), work, warmup, timed,
                               self.device)


def layout_of(backbone: str):
    """The engine's memory layout for ``backbone``: channels_last for convolutional nets."""
    return torch.channels_last if backbone_spec(backbone).channels_last else torch.contiguous_format


def cycle_batches(run: Extraction, loader):
    while True:
        yield from run.batches(loader)


def forward_only(args, device: torch.device, precision: str, batch_size: int, warmup: int,
                 timed: int) -> dict:
    """Normalisation + backbone on a uint8 batch already on the device."""
    model = create_backbone(args.backbone, "random", image_size=args.image_size)
    model = model.to(device, memory_format=layout_of(args.backbone))
    normalize = Uint8Normalize(args.backbone).to(device)
    batch = torch.randint(0, 256, (batch_size, 3, args.image_size, args.image_size),
                          dtype=torch.uint8, device=device)

    def work(_):
        with autocast(device, precision):
            model(normalize(batch).contiguous(memory_format=layout_of(args.backbone))).float()
        return batch_size

    with torch.inference_mode():
        return steady_rate(itertools.repeat(None), work, warmup, timed, device)


class FolderImages(Dataset):
    """The plain loop's Dataset: open with PIL, convert to RGB, the full torchvision transform."""

    def __init__(self, paths: list[Path], image_size: int):
        self.paths = paths
        self.transform = image_transform(image_size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with Image.open(self.paths[index]) as raw:
            return self.transform(raw.convert("RGB"))


def baseline(paths: list[Path], args, device: torch.device, batch_size: int, workers: int,
             warmup: int, timed: int) -> dict:
    """The plain loop: PIL + full transform in a DataLoader, fp32, NCHW, a host copy per batch."""
    model = create_backbone(args.backbone, "random", image_size=args.image_size).to(device)
    # PyTorch's default 2 batches per worker, fewer if /dev/shm cannot hold them (float32)
    prefetch = loader_prefetch(4 * uint8_batch_bytes(batch_size, args.image_size), workers, 2)
    loader = DataLoader(FolderImages(paths, args.image_size), batch_size=batch_size,
                        num_workers=workers, pin_memory=device.type == "cuda",
                        persistent_workers=workers > 0, prefetch_factor=prefetch)

    def work(batch) -> int:
        model(batch.to(device)).cpu()
        return len(batch)

    with torch.no_grad():
        return steady_rate(cycle(loader), work, warmup, timed, device)


def warm_process(args, device: torch.device, precision: str) -> None:
    """Pay the process's one-time costs (oneDNN/cuDNN kernel creation for both layouts, CUDA
    context, allocator growth) before anything is timed, so that the order of the measurements
    does not matter."""
    model = create_backbone(args.backbone, "random", image_size=args.image_size).to(device)
    batch = torch.zeros(args.batch_size, 3, args.image_size, args.image_size, device=device)
    with torch.inference_mode():
        for layout in (torch.contiguous_format, torch.channels_last, torch.contiguous_format):
            model = model.to(memory_format=layout)
            for mode in ("fp32", precision):
                with autocast(device, mode):
                    model(batch.contiguous(memory_format=layout))
    synchronize(device)


# ---------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extract", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="ours and the baseline (default: the engine's: 256 GPU, 32 CPU; "
                             "16 on the CPU here to keep the run short)")
    parser.add_argument("--workers", type=int, default=None,
                        help="ours and the baseline (default: the engine's for the device)")
    parser.add_argument("--precision", default="auto", help="ours: auto, fp32, bf16, fp16")
    parser.add_argument("--warmup", type=int, default=None, help="untimed batches (2 CPU, 3 GPU)")
    parser.add_argument("--timed", type=int, default=None, help="timed batches (4 CPU, 12 GPU)")
    parser.add_argument("--gpu-decode", action="store_true", help="also time --gpu-decode")
    parser.add_argument("--jpeg-draft", action="store_true", help="ours with --jpeg-draft")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--out", default=None, help="JSON file (default cache/bench/extract-<device>.json)")
    parser.add_argument("--data-root", default=None, help="where generated images go (default cache/bench)")
    args = parser.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.warmup = args.warmup if args.warmup is not None else (3 if gpu else 2)
    args.timed = args.timed if args.timed is not None else (12 if gpu else 4)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print a Markdown table, save the JSON file; returns the document."""
    args = parse(argv)
    device = torch.device(args.device)
    precision = resolve_precision(args.precision, device)
    args.batch_size = args.batch_size or (default_batch_size(device) if device.type == "cuda" else 16)
    args.workers = args.workers if args.workers is not None else default_workers(device)
    batches = args.warmup + args.timed
    count = args.batch_size * batches
    root = Path(args.data_root) if args.data_root else None
    labels, folder, names, mean_kb = image_dataset(count, usable_cpus(), root)
    info = machine(device)
    settings = {"device": str(device), "batch_size": args.batch_size, "workers": args.workers,
                "precision": precision, "image_size": args.image_size, "backbone": args.backbone,
                "jpeg_draft": args.jpeg_draft}
    print(f"extract benchmark: {describe(info)}; {settings}; {count} JPEGs of {mean_kb:.0f} kB; "
          f"{args.warmup} warm-up + {args.timed} timed batches; {info['load']}", flush=True)
    rows: list[tuple[str, dict, str]] = []
    with backend_flags(device, precision):
        warm_process(args, device, precision)
        rows.append(("forward only", forward_only(args, device, precision, args.batch_size,
                                                  args.warmup, args.timed),
                     f"{precision}, {'channels_last' if backbone_spec(args.backbone).channels_last else 'NCHW'}, "
                     "batch already on the device"))
        variants = [("PIL", False)] + ([("--gpu-decode", True)] if args.gpu_decode else [])
        for label, gpu_decode in variants:
            ours = Ours(labels, args, device, gpu_decode)
            what = (f"{args.workers} workers" + (", --jpeg-draft" if args.jpeg_draft and not gpu_decode
                                                 else "") + (", nvJPEG batches" if gpu_decode else ""))
            print(f"decode only, {label} ...", flush=True)
            rows.append((f"decode only, {label}", ours.decode_only(args.warmup, args.timed), what))
            print(f"end to end, ours ({label}) ...", flush=True)
            rows.append((f"end to end, ours ({label})", ours.end_to_end(args.warmup, args.timed),
                         f"{what}, {precision}"))
            del ours
        if not args.skip_baseline:
            print("end to end, baseline (plain loop) ...", flush=True)
            rows.append(("end to end, baseline", baseline(
                [folder / n for n in names], args, device, args.batch_size, args.workers,
                args.warmup, args.timed), f"{args.workers} workers, PIL + full transform, fp32"))
    synchronize(device)
    per_core = pil_ms_per_image(folder, names, args.image_size, draft=args.jpeg_draft)
    base = next((r for label, r, _ in rows if label == "end to end, baseline"), None)
    table = Table(["what", "images/s", "vs baseline", "how"],
                  title=f"Stage one at {args.image_size} px, batch {args.batch_size}, {describe(info)}")
    for label, result, how in rows:
        ratio = result["images_per_s"] / base["images_per_s"] if base and label.startswith("end") else None
        table.add(label, result["images_per_s"], ratio, how)
    print(table.markdown())
    print(f"PIL decode + resize to {args.image_size}: {per_core:.2f} ms per image per core "
          f"(at most {1e3 / per_core * max(1, args.workers):.0f} images/s with {args.workers} workers)")
    document = {
        "benchmark": "extract", "machine": info, "settings": settings,
        "images": count, "mean_jpeg_kB": mean_kb, "warmup_batches": args.warmup,
        "timed_batches": args.timed, "pil_ms_per_image_per_core": per_core,
        "figures": {label: dict(result, how=how) for label, result, how in rows},
        "baseline": {"what": "plain loop: PIL + full torchvision transform in a DataLoader, fp32",
                     "batch_size": args.batch_size, "workers": args.workers, "precision": "fp32"},
        "ratio": {label: result["images_per_s"] / base["images_per_s"]
                  for label, result, _ in rows if base and label.startswith("end to end, ours")},
    }
    path = save(f"extract-{device.type}", document, args.out)
    print(f"figures saved to {path}")
    return document


if __name__ == "__main__":
    main()
