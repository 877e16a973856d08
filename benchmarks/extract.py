"""Stage one speed in steady state: decode, forward and end to end, ours next to a plain loop.

Every figure is images / second over ``--timed`` batches after ``--warmup`` untimed ones
(DataLoader workers starting, cuDNN autotuning, the allocator, nvJPEG's start-up are paid in
the warm-up), on generated JPEGs of photo size and compression (about 500 x 375 like VOC's,
quality 90, 65-80 kB), resized to ``--image-size``. Every loader-fed figure is timed in an
honest window (:mod:`benchmarks.window`): at least 3 batches per worker, opened on a drained
queue and closed at the same phase of the workers' output (each batch carries the moment its
worker finished it); the figure is the workers' own pace when the consumer waited for them,
else the consumer's rate, refused when the queue fell and the workers made batches more than
10 % slower than the consumer took them (batches decoded before the window opened were timed).
Each row reads the files in one pass from the first, so that no image is decoded twice in a
row (there are enough of them: :func:`batches_per_row`; their contents repeat every
:data:`~benchmarks.photos.DISTINCT_PHOTOS` files). The rows:

- decode only, PIL: our DataLoader (PIL decode + resize to uint8 in ``--workers`` processes),
  no model; and the cost of one PIL decode + resize per image on one core;
- device decode alone (``--gpu-decode``): nvJPEG + resize of batches whose bytes are already in
  pinned memory, one after another: the device decoder's own ceiling, no loader;
- decode only, device (``--gpu-decode``): the workers read the files, the device decodes;
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
    python -m benchmarks.extract --device cuda --gpu-decode   # GPU: batch 256, 3 + 3 per worker
    python -m benchmarks.extract --device cuda --image-size 224 --gpu-decode --skip-baseline
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from benchmarks import record
from benchmarks._common import describe, machine, save, steady_rate, synchronize
from benchmarks.photos import DISTINCT_PHOTOS, image_dataset
from benchmarks.window import MIN_BATCHES_PER_WORKER, BatchTap, check_window
from featcache.backbones import (
    Uint8Normalize,
    backbone_spec,
    create_backbone,
    image_transform,
    inputs,
)
from featcache.backbones.inputs import ImageRows, loader_prefetch, uint8_batch_bytes
from featcache.data.labelfile import load_labels
from featcache.errors import FeatcacheError
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

#: batches in flight per worker in the engine's loader and the plain loop's (PyTorch's default)
PREFETCH = 2


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


def batches_per_row(warmup: int, timed: int, workers: int) -> int:
    """Batches one row may read: warm-up, the drain (the queue and a batch per worker), the
    window (and up to a batch per worker to close it), and the look after it (as the drain)."""
    return warmup + timed + workers + 2 * (workers * PREFETCH + workers + 2) + 4


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
        self.root = Path(labels.image_root)
        rows = list(range(len(self.run.images)))
        self.store = ChunkStore(self.run.final, {}, len(rows), self.run.chunk_rows,
                                backbone_spec(args.backbone).dim)
        # each row iterates it from the start: a fresh pass, with workers of its own
        self.tap = BatchTap(self.run.loader(self.root, rows, self.store,
                                            list(range(self.store.num_chunks))))
        self.what = "decode only, " + ("device" if gpu_decode else "PIL")

    def decode_only(self, warmup: int, timed: int) -> dict:
        tap = self.tap
        return steady_rate(self.run.batches(tap), lambda b: len(b[1]), warmup, timed,
                           self.device, tap=tap, what=self.what)

    def end_to_end(self, warmup: int, timed: int) -> dict:
        parts, chunk_rows, tap = [], self.run.chunk_rows, self.tap

        def work(batch) -> int:
            images, rows, _, _ = batch
            x = self.run.layout(self.run.normalize(images))
            parts.append(self.run.forward(self.model, x))
            if sum(len(p) for p in parts) >= chunk_rows:  # the engine's host copy per chunk
                torch.cat(parts).cpu()
                parts.clear()
            return len(rows)

        with torch.inference_mode():
            return steady_rate(self.run.batches(tap), work, warmup, timed, self.device, tap=tap,
                               what=self.what.replace("decode only", "end to end"))

    def device_decode_alone(self, warmup: int, timed: int, resident: int = 8) -> dict:
        """nvJPEG + resize of ``resident`` packed batches already in (pinned) memory, each
        finished before the next: the device decoder's ceiling, without the loader or any
        overlap."""
        dataset = inputs.JpegBytesRows(self.root, self.run.images, self.options.image_size)
        batches = [inputs.collate_jpeg_rows([dataset[i] for i in range(b * self.run.batch_size,
                                                                       (b + 1) * self.run.batch_size)])
                   for b in range(resident)]
        if self.device.type == "cuda":
            batches = [inputs.JpegBatch(*(t.pin_memory() for t in batch)) for batch in batches]

        def work(batch) -> int:
            images, _ = inputs.decode_on_device(batch, self.options.image_size, self.device,
                                                self.run.preprocess)
            synchronize(self.device)  # as DeviceDecoder: decode_jpeg reuses the memory next
            return len(images)

        return steady_rate(itertools.cycle(batches), work, warmup, timed, self.device)


def layout_of(backbone: str):
    """The engine's memory layout for ``backbone``: channels_last for convolutional nets."""
    return torch.channels_last if backbone_spec(backbone).channels_last else torch.contiguous_format


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
    prefetch = loader_prefetch(4 * uint8_batch_bytes(batch_size, args.image_size), workers, PREFETCH)
    tap = BatchTap(DataLoader(FolderImages(paths, args.image_size), batch_size=batch_size,
                              num_workers=workers, pin_memory=device.type == "cuda",
                              prefetch_factor=prefetch))

    def work(batch) -> int:
        model(batch.to(device)).cpu()
        return len(batch)

    with torch.no_grad():
        return steady_rate(tap, work, warmup, timed, device, tap=tap, what="end to end, baseline")


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
    parser.add_argument("--timed", type=int, default=None,
                        help=f"timed batches (4 CPU; GPU: {MIN_BATCHES_PER_WORKER} per worker, "
                             f"the least a window may hold)")
    parser.add_argument("--gpu-decode", action="store_true", help="also time --gpu-decode")
    parser.add_argument("--jpeg-draft", action="store_true", help="ours with --jpeg-draft")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--out", default=None, help="JSON file (default cache/bench/extract-<device>.json)")
    parser.add_argument("--data-root", default=None, help="where generated images go (default cache/bench)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    args.batch_size = args.batch_size or (default_batch_size(device) if device.type == "cuda" else 16)
    args.workers = args.workers if args.workers is not None else default_workers(device)
    gpu = device.type == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (3 if gpu else 2)
    args.timed = args.timed if args.timed is not None else (
        MIN_BATCHES_PER_WORKER * max(1, args.workers) if gpu else 4)
    check_window(args.timed, args.workers)  # before any image is drawn
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print a Markdown table, save the JSON file; returns the document."""
    args = parse(argv)
    args.command = record.command_line("extract", argv)
    device = torch.device(args.device)
    precision = resolve_precision(args.precision, device)
    count = args.batch_size * batches_per_row(args.warmup, args.timed, args.workers)
    root = Path(args.data_root) if args.data_root else None
    labels, folder, names, mean_kb = image_dataset(count, usable_cpus(), root)
    info = machine(device)
    settings = {"device": str(device), "batch_size": args.batch_size, "workers": args.workers,
                "precision": precision, "image_size": args.image_size, "backbone": args.backbone,
                "jpeg_draft": args.jpeg_draft}
    print(f"extract benchmark: {describe(info)}; {settings}; {count} JPEGs of {mean_kb:.0f} kB "
          f"({min(count, DISTINCT_PHOTOS)} distinct); {args.warmup} warm-up + {args.timed} timed "
          f"batches per row; {info['load']}", flush=True)
    with backend_flags(device, precision):
        rows = measure(args, device, precision, labels, [folder / n for n in names])
    synchronize(device)
    per_core = pil_ms_per_image(folder, names, args.image_size, draft=args.jpeg_draft)
    return report(args, info, settings, rows, per_core, count, mean_kb)


def measure(args, device: torch.device, precision: str, labels: Path,
            paths: list[Path]) -> list[tuple[str, dict, str]]:
    """Every row: (label, figures, how)."""
    warm_process(args, device, precision)
    layout = "channels_last" if backbone_spec(args.backbone).channels_last else "NCHW"
    rows = [("forward only", forward_only(args, device, precision, args.batch_size, args.warmup,
                                          args.timed), f"{precision}, {layout}, batch already on the device")]
    variants = [("PIL", False)] + ([("--gpu-decode", True)] if args.gpu_decode else [])
    for label, gpu_decode in variants:
        ours = Ours(labels, args, device, gpu_decode)
        what = (f"{args.workers} workers" + (", --jpeg-draft" if args.jpeg_draft and not gpu_decode
                                             else "") + (", nvJPEG batches" if gpu_decode else ""))
        if gpu_decode:
            print("device decode alone ...", flush=True)
            rows.append(("device decode alone", ours.device_decode_alone(args.warmup, args.timed),
                         "nvJPEG + resize, bytes already in pinned memory, no loader"))
        print(f"decode only, {label} ...", flush=True)
        rows.append((f"decode only, {label}", ours.decode_only(args.warmup, args.timed), what))
        print(f"end to end, ours ({label}) ...", flush=True)
        rows.append((f"end to end, ours ({label})", ours.end_to_end(args.warmup, args.timed),
                     f"{what}, {precision}"))
        del ours
    if not args.skip_baseline:
        print("end to end, baseline (plain loop) ...", flush=True)
        rows.append(("end to end, baseline", baseline(
            paths, args, device, args.batch_size, args.workers, args.warmup, args.timed),
            f"{args.workers} workers, PIL + full transform, fp32"))
    return rows


def report(args, info: dict, settings: dict, rows: list[tuple[str, dict, str]], per_core: float,
           count: int, mean_kb: float) -> dict:
    """Print the table and the PIL ceiling, save the JSON document; returns it."""
    base = next((r for label, r, _ in rows if label == "end to end, baseline"), None)
    table = Table(["what", "images/s", "vs baseline", "window", "how"],
                  title=f"Stage one at {args.image_size} px, batch {args.batch_size}, {describe(info)}")
    for label, result, how in rows:
        ratio = result["images_per_s"] / base["images_per_s"] if base and label.startswith("end") else None
        table.add(label, result["images_per_s"], ratio, window_note(result), how)
    print(table.markdown())
    print(f"PIL decode + resize to {args.image_size}: {per_core:.2f} ms per image per core "
          f"(at most {1e3 / per_core * max(1, args.workers):.0f} images/s with {args.workers} workers)")
    document = {
        "benchmark": "extract", "command": args.command, "machine": info, "settings": settings,
        "images": count, "mean_jpeg_kB": mean_kb, "warmup_batches": args.warmup,
        "timed_batches": args.timed, "pil_ms_per_image_per_core": per_core,
        "window_rule": "benchmarks/window.py: at least 3 batches per worker, opened on a drained "
                       "queue, closed at the same phase; images/s is the workers' pace when the "
                       "consumer waited for them, else the consumer's rate, refused when the "
                       "workers were more than 10 % slower than the consumer",
        "figures": {label: dict(result, how=how) for label, result, how in rows},
        "baseline": {"what": "plain loop: PIL + full torchvision transform in a DataLoader, fp32",
                     "batch_size": args.batch_size, "workers": args.workers, "precision": "fp32"},
        "ratio": {label: result["images_per_s"] / base["images_per_s"]
                  for label, result, _ in rows if base and label.startswith("end to end, ours")},
    }
    path = save(f"extract-{torch.device(args.device).type}", document, args.out)
    print(f"figures saved to {path}")
    return document


def window_note(result: dict) -> str:
    """The timed window of a row, in a few words."""
    window = result.get("window")
    timed = f"{result['timed_batches']} batches"
    if window is None:
        return f"{timed}, no loader"
    return (f"{timed}, queue {window['queue_depth']} drained ({window['drained_batches']}), "
            f"{window['decoded_before_window']} decoded before")


def cli(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.extract``: a refused setting is one line, not a traceback."""
    try:
        main(argv)
    except FeatcacheError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    cli()
