"""Stage three speed: training images/s at 448 x 448, ours next to the reference code's way.

Ours: :class:`featcache.finetune.loop.ConfigTrainer` as ``featcache finetune`` runs it: PIL
decode and resize in DataLoader workers, uint8 batches (pinned) normalised on the device,
seeded flips, autocast bf16 (fp16 + grad scaler where bf16 is missing) and channels_last on a
GPU, fused Adam, no host copy of the predictions; optionally ``torch.compile``.
Baseline: what the reference code does (Cole et al. ``train.py``): a Dataset that opens each
file with PIL and applies the full torchvision training transform (Resize, RandomHorizontalFlip,
ToTensor, Normalize), a shuffling DataLoader with its 4 workers, fp32, ``.cpu().numpy()`` of
every batch's predictions for its logger.

Both train ResNet-50 (random weights: speed does not depend on them) plus a linear head with
Adam and the AN loss on the same generated photo-like JPEGs (about 500 x 375, like VOC's);
the figure is images / second over the timed steps, after warm-up steps (cuDNN autotuning,
allocator, worker start-up).

    python -m benchmarks.finetune               # CPU: batch 8, 1 warm-up + 2 timed steps (minutes)
    python -m benchmarks.finetune --gpu         # lent GPU: batches 16 and 64, 10 + 40 steps
    python -m benchmarks.finetune --gpu --compile
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from torch.utils.data import DataLoader

from benchmarks._common import BENCH_DIR, describe, machine, save
from benchmarks.extract import FolderImages, generated_images
from featcache.backbones import create_backbone, image_transform
from featcache.data.synthetic import write_image_labels
from featcache.finetune.data import load_finetune_data
from featcache.finetune.loop import ConfigTrainer, Settings
from featcache.finetune.model import FinetuneNet, linear_head
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.start import fresh_start
from featcache.losses import Targets, create_loss
from featcache.protocol.grid import GridPoint
from featcache.runtime import Ranks, default_workers, resolve_precision, usable_cpus
from featcache.tables import Table

REFERENCE_WORKERS = 4  # Cole et al. train.py: P['num_workers'] = 4
NUM_CLASSES = 20


class TrainImages(FolderImages):
    """The reference's training Dataset: PIL, full transform with a random flip, and labels."""

    def __init__(self, paths, image_size: int):
        super().__init__(paths, image_size)
        self.transform = image_transform(image_size, train=True)

    def __getitem__(self, index: int):
        labels = torch.zeros(NUM_CLASSES)
        labels[index % NUM_CLASSES] = 1.0
        return super().__getitem__(index), labels, index


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_ours(labels_path, args, device: torch.device, bsize: int) -> float:
    """images/s of ConfigTrainer's training steps (its loader, AMP, channels_last)."""
    data = load_finetune_data(labels_path)
    start = fresh_start(FinetuneOptions(init="none", loss="an", dataset=str(labels_path.parent),
                                        weights="random", image_size=args.image_size))
    workers = args.workers if args.workers is not None else default_workers(device)
    settings = Settings(loss="an", params={}, epochs=1, precision=resolve_precision(args.precision, device),
                        compile=args.compile, workers=workers, progress=False)
    settings.validate(device)
    trainer = ConfigTrainer(GridPoint(1e-4, bsize), settings, start, data,
                            Ranks(0, 1, 0, 1, device))
    trainer.net.train()

    def batches():
        for epoch in itertools.count():
            trainer.sampler.set_epoch(epoch)
            yield from trainer.train_loader

    return _timed(batches(), lambda images, positions: trainer.step(images, positions, 0),
                  args.warmup, args.steps, bsize, device)


def run_baseline(paths, args, device: torch.device, bsize: int) -> float:
    """images/s of the reference way: PIL + full transform, fp32, preds copied to the host."""
    trunk = create_backbone("resnet50", "random")
    model = FinetuneNet(trunk, linear_head(2048, NUM_CLASSES, generator=torch.Generator())).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = create_loss("an", NUM_CLASSES)
    workers = min(REFERENCE_WORKERS, usable_cpus())
    loader = DataLoader(TrainImages(paths, args.image_size), batch_size=bsize, shuffle=True,
                        num_workers=workers, drop_last=True, persistent_workers=workers > 0)

    def batches():
        while True:
            for images, labels, index in loader:
                yield images, (labels, index)

    def step(images, extra):
        labels, index = extra
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        logits = model(images)
        loss = loss_fn(logits, Targets(labels, index.to(device)))
        torch.sigmoid(logits).clone().detach().cpu().numpy()  # the reference logger's copy
        loss.backward()
        optimizer.step()

    return _timed(batches(), step, args.warmup, args.steps, bsize, device)


def _timed(batches, step, warmup: int, steps: int, bsize: int, device: torch.device) -> float:
    """Run ``warmup`` untimed then ``steps`` timed steps; images / second of the timed ones."""
    for _, (images, second, *_) in zip(range(warmup), batches, strict=False):
        step(images, second)
    _synchronize(device)
    started = time.perf_counter()
    for _, (images, second, *_) in zip(range(steps), batches, strict=False):
        step(images, second)
    _synchronize(device)
    return steps * bsize / (time.perf_counter() - started)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.finetune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true",
                        help="GPU settings: cuda, batches 16 and 64, 10 warm-up + 40 timed steps")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda with --gpu)")
    parser.add_argument("--bsize", default=None, help="comma-separated batch sizes (default 8; 16,64 with --gpu)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 1; 10 with --gpu)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 2; 40 with --gpu)")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--images", type=int, default=None, help="generated JPEGs (default: enough for one pass)")
    parser.add_argument("--precision", default="auto", help="ours: auto, fp32, bf16, fp16")
    parser.add_argument("--workers", type=int, default=None, help="ours (default: the engine's)")
    parser.add_argument("--compile", action="store_true", help="ours with torch.compile")
    parser.add_argument("--skip-baseline", action="store_true", help="time ours only")
    args = parser.parse_args(argv)
    args.bsizes = [int(b) for b in (args.bsize or ("16,64" if args.gpu else "8")).split(",")]
    args.warmup = args.warmup if args.warmup is not None else (10 if args.gpu else 1)
    args.steps = args.steps if args.steps is not None else (40 if args.gpu else 2)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print a Markdown table, save cache/bench/finetune-<device>.json."""
    args = parse(argv)
    device = torch.device(args.device or ("cuda" if args.gpu else "cpu"))
    count = args.images or min(4096, max(args.bsizes) * (args.warmup + args.steps) + 16)
    folder, names, mean_kb = generated_images(count, usable_cpus())
    labels_path = BENCH_DIR / "finetune-data" / f"photos{count}" / "labels.h5"
    # 80 % of the official train set trains (the protocol's split): all but a few images here
    n_train = count - 4
    write_image_labels(labels_path, names[:n_train], names[n_train:], str(folder.resolve()),
                       dataset=f"photos{count}", num_classes=NUM_CLASSES, overwrite=True)
    info = machine(device)
    table = Table(["device", "batch", "image size", "ours img/s", "baseline img/s", "ratio"],
                  title=f"Stage three training, {describe(info)}")
    figures = []
    for bsize in args.bsizes:
        print(f"ours, batch {bsize} ...", flush=True)
        ours = run_ours(labels_path, args, device, bsize)
        baseline = None
        if not args.skip_baseline:
            print(f"baseline (reference way), batch {bsize} ...", flush=True)
            baseline = run_baseline([folder / n for n in names], args, device, bsize)
        table.add(str(device), bsize, args.image_size, ours, baseline,
                  None if baseline is None else ours / baseline)
        figures.append({"bsize": bsize, "ours_images_per_s": ours, "baseline_images_per_s": baseline})
    print(table.markdown())
    document = {
        "benchmark": "finetune", "machine": info, "images": count, "mean_jpeg_kB": mean_kb,
        "image_size": args.image_size, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "ours": {"precision": resolve_precision(args.precision, device), "compile": args.compile,
                 "workers": args.workers if args.workers is not None else default_workers(device)},
        "baseline": {"precision": "fp32", "workers": min(REFERENCE_WORKERS, usable_cpus())},
        "figures": figures,
    }
    path = save(f"finetune-{device.type}", document)
    print(f"figures saved to {path}")
    return document


if __name__ == "__main__":
    main()
