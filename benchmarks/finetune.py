"""Stage three speed in steady state: training images/s of ours next to a plain loop.

Every figure is images / second over ``--timed`` steps after ``--warmup`` untimed ones, all
inside one epoch (no epoch boundary, no evaluation), with the process-wide flags a run sets
(``cudnn.benchmark`` on, as ``featcache finetune`` runs), on generated JPEGs of photo size and
compression (about 500 x 375, quality 90), at ``--image-size``. Every loader-fed figure is
timed in an honest window (:mod:`benchmarks.window`): at least 3 steps per worker, opened on a
drained queue (the training loader keeps 4 batches per worker in flight) and closed at the same
phase; the figure is the workers' own pace when the steps waited for them, else the steps'
rate, refused when the queue fell and the workers made batches more than 10 % slower than the
steps took them:

- decode only: our training loader (PIL decode + resize + seeded flip to uint8 in
  ``--workers`` processes), no model;
- compute only: :meth:`ConfigTrainer.step` (forward, AN loss, backward, fused Adam on a GPU)
  on a batch already on the device;
- end to end, ours: the training loop of :class:`featcache.finetune.loop.ConfigTrainer` (its
  loader, positions on the device per epoch, its step); with ``--compile`` the compile time
  of the first step is reported separately;
- end to end, baseline: the plain loop, in the same run with the same batch size and workers:
  a Dataset that opens each file with PIL and applies the full torchvision training transform
  (Resize, RandomHorizontalFlip, ToTensor, Normalize: float32 batches), a shuffling DataLoader,
  fp32, NCHW, ``torch.optim.Adam``'s default implementation, cuDNN's default algorithm choice,
  and the reference logger's host copy of every batch's predictions.

Both train ResNet-50 (random weights: speed does not depend on them) plus a linear head with
Adam and the AN loss. The device, batch size, workers and precision are printed and saved with
the figures in ``cache/bench/finetune-<device>.json``.

    python -m benchmarks.finetune                           # CPU: batch 8, 2 + 3 steps (minutes)
    python -m benchmarks.finetune --device cuda --bsize 16,64   # GPU: 10 + 3 steps per worker
    python -m benchmarks.finetune --device cuda --bsize 16 --compile
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from benchmarks import record
from benchmarks._common import BENCH_DIR, describe, machine, save, steady_rate, synchronize
from benchmarks.extract import FolderImages, window_note
from benchmarks.photos import generated_images
from benchmarks.window import MIN_BATCHES_PER_WORKER, BatchTap, check_window
from featcache.backbones import create_backbone, image_transform
from featcache.backbones.inputs import loader_prefetch, uint8_batch_bytes
from featcache.data.synthetic import write_image_labels
from featcache.errors import FeatcacheError
from featcache.finetune.data import load_finetune_data
from featcache.finetune.loop import ConfigTrainer
from featcache.finetune.model import FinetuneNet
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.start import fresh_start
from featcache.heads import HeadKind, HeadModule
from featcache.losses import Targets, create_loss
from featcache.protocol.grid import GridPoint
from featcache.runtime import (
    backend_flags,
    default_workers,
    resolve_precision,
    single_process,
    usable_cpus,
)
from featcache.tables import Table

NUM_CLASSES = 20


class TrainImages(FolderImages):
    """The plain loop's training Dataset: PIL, full transform with a random flip, and labels."""

    def __init__(self, paths, image_size: int):
        super().__init__(paths, image_size)
        self.transform = image_transform(image_size, train=True)

    def __getitem__(self, index: int):
        labels = torch.zeros(NUM_CLASSES)
        labels[index % NUM_CLASSES] = 1.0
        return super().__getitem__(index), labels, index


def make_trainer(labels_path: Path, args, device: torch.device,
                 bsize: int) -> tuple[ConfigTrainer, BatchTap]:
    """A ConfigTrainer as ``featcache finetune --init none --loss an`` builds it, and the tap on
    its training loader."""
    data = load_finetune_data(labels_path)
    start = fresh_start(FinetuneOptions(init="none", loss="an", dataset=str(labels_path.parent),
                                        weights="random", image_size=args.image_size))
    settings = FinetunePlan(loss="an", params={}, epochs=1, precision=args.resolved_precision,
                        compile=args.compile, workers=args.workers, progress=False)
    settings.validate(device)
    trainer = ConfigTrainer(GridPoint(1e-4, bsize), settings, start, data, single_process(device))
    trainer.net.train()
    trainer.sampler.set_epoch(0)
    return trainer, BatchTap(trainer.train_loader)  # before its persistent workers start


def ours(labels_path: Path, args, device: torch.device, bsize: int) -> dict[str, dict]:
    """decode only, compute only (and compile time), end to end: one epoch's steps."""
    trainer, tap = make_trainer(labels_path, args, device, bsize)
    out = {"decode only": steady_rate(tap, lambda b: len(b[1]), args.warmup, args.timed, device,
                                      tap=tap, what=f"batch {bsize}, decode only")}
    order = trainer.sampler.positions()
    on_device = order.to(device)
    images, _, _ = next(iter(tap))
    started = time.perf_counter()
    trainer.step(images, on_device[0], 0)  # with --compile: the compilation
    synchronize(device)
    first_step = time.perf_counter() - started
    resident = images.to(device)
    out["compute only"] = steady_rate(
        itertools.count(1), lambda step: len(trainer.step(resident, on_device[step % len(order)], 0)[1]),
        args.warmup, args.timed, device)
    out["compute only"]["first_step_seconds"] = first_step

    def batches():  # the loop of ConfigTrainer.train_epoch without its bar and records
        for step, (images, _positions, _ok) in enumerate(tap):
            yield images, on_device[step]

    out["end to end"] = steady_rate(batches(), lambda b: len(trainer.step(b[0], b[1], 0)[1]),
                                    args.warmup, args.timed, device, tap=tap,
                                    what=f"batch {bsize}, end to end")
    return out


def baseline(paths, args, device: torch.device, bsize: int) -> dict:
    """The plain loop: PIL + full transform, fp32, NCHW, default Adam, predictions to the host."""
    trunk = create_backbone("resnet50", "random")
    model = FinetuneNet(trunk, HeadModule.create(HeadKind.LINEAR, 2048, NUM_CLASSES,
                                                 generator=torch.Generator())).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = create_loss("an", NUM_CLASSES)
    prefetch = loader_prefetch(4 * uint8_batch_bytes(bsize, args.image_size), args.workers, 2)
    tap = BatchTap(DataLoader(TrainImages(paths, args.image_size), batch_size=bsize, shuffle=True,
                              num_workers=args.workers, drop_last=True,
                              pin_memory=device.type == "cuda", prefetch_factor=prefetch))

    def step(batch) -> int:
        images, labels, index = batch
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        logits = model(images)
        loss = loss_fn(logits, Targets(labels, index.to(device)))
        torch.sigmoid(logits).clone().detach().cpu().numpy()  # the reference logger's copy
        loss.backward()
        optimizer.step()
        return len(images)

    return steady_rate(tap, step, args.warmup, args.timed, device, tap=tap,
                       what=f"batch {bsize}, end to end, baseline")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.finetune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--bsize", default=None,
                        help="comma-separated batch sizes (default 8 on the CPU, 16,64 on a GPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (2 CPU, 10 GPU)")
    parser.add_argument("--timed", type=int, default=None,
                        help=f"timed steps (3 CPU; GPU: 40, or {MIN_BATCHES_PER_WORKER} per worker "
                             "when more, the least a window may hold)")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--precision", default="auto", help="ours: auto, fp32, bf16, fp16")
    parser.add_argument("--workers", type=int, default=None,
                        help="ours and the baseline (default: the engine's for the device)")
    parser.add_argument("--compile", action="store_true", help="ours with torch.compile")
    parser.add_argument("--skip-baseline", action="store_true", help="time ours only")
    parser.add_argument("--out", default=None, help="JSON file (default cache/bench/finetune-<device>.json)")
    parser.add_argument("--data-root", default=None, help="where generated images go (default cache/bench)")
    args = parser.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.bsizes = [int(b) for b in (args.bsize or ("16,64" if gpu else "8")).split(",")]
    args.warmup = args.warmup if args.warmup is not None else (10 if gpu else 2)
    args.workers = args.workers if args.workers is not None else default_workers(torch.device(args.device))
    args.timed = args.timed if args.timed is not None else (
        max(40, MIN_BATCHES_PER_WORKER * args.workers) if gpu else 3)
    check_window(args.timed, args.workers)  # before any image is drawn
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print a Markdown table, save the JSON file; returns the document."""
    args = parse(argv)
    device = torch.device(args.device)
    args.resolved_precision = resolve_precision(args.precision, device)
    # One epoch holds every step of a row: warm-up, the drain and the look after the window
    # (the queue, 4 batches per worker, and a batch per worker, each), the window and up to a
    # batch per worker to close it (+1: the compile step). The protocol trains on 80 % of the
    # official train set (the rest validates); 4 test images.
    steps = args.warmup + args.timed + args.workers + 2 * (5 * args.workers + 2) + 2
    official_train = math.ceil(max(args.bsizes) * steps / 0.8) + 1
    count = official_train + 4
    root = Path(args.data_root) if args.data_root else None
    folder, names, mean_kb = generated_images(count, usable_cpus(), root=root)
    labels_path = (root or BENCH_DIR) / "finetune-data" / f"photos{count}" / "labels.h5"
    write_image_labels(labels_path, names[:official_train], names[official_train:],
                       str(folder.resolve()), dataset=f"photos{count}", num_classes=NUM_CLASSES,
                       overwrite=True)
    info = machine(device)
    settings = {"device": str(device), "workers": args.workers,
                "precision": args.resolved_precision, "compile": args.compile,
                "image_size": args.image_size, "cudnn_benchmark": device.type == "cuda"}
    print(f"finetune benchmark: {describe(info)}; {settings}; batches {args.bsizes}; {count} "
          f"JPEGs of {mean_kb:.0f} kB; {args.warmup} warm-up + {args.timed} timed steps; "
          f"{info['load']}", flush=True)
    table = Table(["batch", "what", "images/s", "vs baseline", "window", "how"],
                  title=f"Stage three training at {args.image_size} px, {describe(info)}")
    figures = []
    for bsize in args.bsizes:
        print(f"ours, batch {bsize} ...", flush=True)
        with backend_flags(device, args.resolved_precision, cudnn_benchmark=True):
            mine = ours(labels_path, args, device, bsize)
        base = None
        if not args.skip_baseline:
            print(f"baseline (plain loop), batch {bsize} ...", flush=True)
            with backend_flags(device, "fp32"):
                base = baseline([folder / n for n in names], args, device, bsize)
        how = (f"{args.workers} workers, {args.resolved_precision}, channels_last"
               + (", compiled" if args.compile else ""))
        for what, result in mine.items():
            ratio = (result["images_per_s"] / base["images_per_s"]
                     if base and what == "end to end" else None)
            table.add(bsize, f"{what}, ours", result["images_per_s"], ratio, window_note(result), how)
        if base:
            table.add(bsize, "end to end, baseline", base["images_per_s"], 1.0, window_note(base),
                      f"{args.workers} workers, fp32, PIL + full transform")
        figures.append({"batch_size": bsize, "ours": mine, "baseline": base,
                        "ratio": base and mine["end to end"]["images_per_s"] / base["images_per_s"]})
    print(table.markdown())
    for figure in figures:
        first = figure["ours"]["compute only"]["first_step_seconds"]
        print(f"batch {figure['batch_size']}: first step {first:.1f} s"
              + (" (includes torch.compile)" if args.compile else ""))
    document = {
        "benchmark": "finetune", "command": record.command_line("finetune", argv),
        "machine": info, "settings": settings, "images": count,
        "mean_jpeg_kB": mean_kb, "warmup_steps": args.warmup, "timed_steps": args.timed,
        "baseline": {"what": "plain loop: PIL + full torchvision transform, DataLoader, fp32, "
                             "default Adam, predictions copied to the host",
                     "workers": args.workers, "precision": "fp32"},
        "figures": figures,
    }
    path = save(f"finetune-{device.type}", document, args.out)
    print(f"figures saved to {path}")
    return document


def cli(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.finetune``: a refused setting is one line, not a traceback."""
    try:
        main(argv)
    except FeatcacheError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    cli()
