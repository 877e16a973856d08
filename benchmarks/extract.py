"""Stage one speed: images/s of ``featcache features`` next to the reference code's way.

Ours: :func:`featcache.features.extract.extract_features` (PIL decode and resize in DataLoader
workers, uint8 batches normalised on the device, autocast bf16 and channels_last on a GPU,
pinned memory, chunked shards); with ``--gpu`` also its ``--gpu-decode`` variant (nvJPEG).
Baseline: what the reference code does (Cole et al. ``datasets.py``/``train.py``): a Dataset
that opens each file with PIL and applies the full torchvision transform (Resize, ToTensor,
Normalize), a DataLoader with batch 16 and the reference's worker count (8, or fewer CPUs),
fp32, and a ``.cpu()`` of every batch's features.

Both run over the same generated JPEGs of photo size (about 500 x 375, like VOC's, 65-80 kB at JPEG quality 90),
resized to 448 x 448; the figure is images / seconds of the loop (DataLoader start to the last
features on the host), with the model already built and the device warmed up.

    python -m benchmarks.extract                  # CPU: 64 images (a few minutes on 2 cores)
    python -m benchmarks.extract --gpu            # lent GPU: 4096 images, PIL and nvJPEG decode
    python -m benchmarks.extract --images 256 --device cpu --weights v1
"""

from __future__ import annotations

import argparse
import shutil
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from benchmarks._common import BENCH_DIR, describe, machine, save
from featcache.backbones import backbone_spec, create_backbone, image_transform
from featcache.backbones.weights import describe_weights
from featcache.data.featurefile import read_feature_attrs
from featcache.data.synthetic import write_image_labels
from featcache.features.extract import ExtractOptions, extract_features
from featcache.features.shards import parts_dir
from featcache.runtime import default_workers, usable_cpus
from featcache.tables import Table

#: (width, height) of VOC-like photos; the generator cycles through them
PHOTO_SIZES = ((500, 375), (500, 333), (375, 500), (500, 400))
REFERENCE_WORKERS = 8
BASELINE_BATCH = 16


# ---------------------------------------------------------------------------- data
def photo_like_jpeg(args: tuple[Path, int]) -> int:
    """One JPEG with a photo's size and entropy (smooth regions, edges, texture, noise)."""
    path, seed = args
    rng = np.random.default_rng(seed)
    width, height = PHOTO_SIZES[seed % len(PHOTO_SIZES)]
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


def generated_images(count: int, processes: int) -> tuple[Path, list[str], float]:
    """``count`` photo-like JPEGs under cache/bench (made once); (folder, names, mean kB)."""
    folder = BENCH_DIR / "extract-images"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(count)]
    todo = [(folder / name, i) for i, name in enumerate(names) if not (folder / name).exists()]
    if todo:
        print(f"generating {len(todo)} photo-like JPEGs in {folder} ...", flush=True)
        with Pool(max(1, processes)) as pool:
            pool.map(photo_like_jpeg, todo, chunksize=16)
    sizes = [(folder / name).stat().st_size for name in names]
    return folder, names, float(np.mean(sizes)) / 1e3


# ---------------------------------------------------------------------------- runs
def run_ours(dataset_dir: Path, options: ExtractOptions) -> tuple[float, int]:
    """(images/s, batch size) of our extraction loop, from scratch (no file, no saved chunks)."""
    tag = describe_weights(backbone_spec(options.backbone), options.weights).tag
    final = dataset_dir / f"features-{options.backbone}{'-' + tag if tag else ''}.h5"
    final.unlink(missing_ok=True)
    shutil.rmtree(parts_dir(final), ignore_errors=True)
    result = extract_features(str(dataset_dir), options, say=lambda message: None)
    return result.images_per_second, int(read_feature_attrs(result.path)["batch_size"])


class FolderImages(Dataset):
    """The reference's Dataset: open with PIL, convert to RGB, full torchvision transform."""

    def __init__(self, paths: list[Path], image_size: int):
        self.paths = paths
        self.transform = image_transform(image_size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with Image.open(self.paths[index]) as raw:
            return self.transform(raw.convert("RGB"))


def run_baseline(paths: list[Path], image_size: int, device: torch.device, weights: str,
                 workers: int) -> float:
    """images/s of the reference way: fp32, batch 16, a host copy of every batch."""
    model = create_backbone("resnet50", weights).to(device)
    loader = DataLoader(FolderImages(paths, image_size), batch_size=BASELINE_BATCH,
                        num_workers=workers, pin_memory=device.type == "cuda")
    start = time.perf_counter()
    with torch.no_grad():
        for batch in loader:
            model(batch.to(device)).cpu()
    return len(paths) / (time.perf_counter() - start)


def warm_up(device: torch.device, image_size: int) -> None:
    """CUDA context, cuDNN and allocator set-up are paid here, not by whichever runs first."""
    model = create_backbone("resnet50", "random").to(device)
    with torch.no_grad():
        model(torch.zeros(2, 3, image_size, image_size, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extract", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true",
                        help="GPU settings: cuda, 4096 images, also time --gpu-decode")
    parser.add_argument("--images", type=int, default=None, help="images (default 64; 4096 with --gpu)")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda with --gpu)")
    parser.add_argument("--weights", default="random",
                        help="backbone weights (speed does not depend on them; random runs offline)")
    parser.add_argument("--batch-size", type=int, default=None, help="ours (default: the engine's)")
    parser.add_argument("--workers", type=int, default=None, help="ours (default: the engine's)")
    parser.add_argument("--precision", default="auto", help="ours: auto, fp32, bf16, fp16")
    parser.add_argument("--baseline-workers", type=int, default=None,
                        help=f"baseline DataLoader workers (default: min({REFERENCE_WORKERS}, CPUs))")
    parser.add_argument("--gpu-decode", action="store_true", help="also time ours with --gpu-decode")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print a Markdown table, save cache/bench/extract-<device>.json."""
    args = parse(argv)
    device = torch.device(args.device or ("cuda" if args.gpu else "cpu"))
    count = args.images or (4096 if args.gpu else 64)
    cpus = usable_cpus()
    folder, names, mean_kb = generated_images(count, cpus)
    dataset_dir = BENCH_DIR / "extract-data" / f"photos{count}"
    labels = dataset_dir / "labels.h5"
    n_train = int(count * 0.8)
    write_image_labels(labels, names[:n_train], names[n_train:], str(folder.resolve()),
                       dataset=f"photos{count}", overwrite=True)
    warm_up(device, args.image_size)

    variants = [("PIL workers", False)]
    if args.gpu or args.gpu_decode:
        variants.append(("--gpu-decode", True))
    ours = {}
    for label, gpu_decode in variants:
        options = ExtractOptions(
            weights=args.weights, image_size=args.image_size, batch_size=args.batch_size,
            workers=args.workers, precision=args.precision, device=str(device),
            gpu_decode=gpu_decode, overwrite=True,
        )
        print(f"ours ({label}) ...", flush=True)
        ours[label], batch_size = run_ours(dataset_dir, options)
    workers = args.workers if args.workers is not None else default_workers(device)
    baseline_workers = args.baseline_workers
    if baseline_workers is None:
        baseline_workers = min(REFERENCE_WORKERS, cpus)
    print("baseline (reference way) ...", flush=True)
    baseline = run_baseline([folder / n for n in names], args.image_size, device, args.weights,
                            baseline_workers)

    info = machine(device)
    table = Table(["device", "images", "image size", "ours", "ours img/s", "baseline img/s", "ratio"],
                  title=f"Stage one extraction, {describe(info)}")
    for label, speed in ours.items():
        table.add(str(device), count, args.image_size, label, speed, baseline, speed / baseline)
    print(table.markdown())
    document = {
        "benchmark": "extract", "machine": info, "images": count, "mean_jpeg_kB": mean_kb,
        "image_size": args.image_size, "weights": args.weights,
        "ours": {"images_per_s": ours, "batch_size": batch_size, "workers": workers,
                 "precision": args.precision},
        "baseline": {"images_per_s": baseline, "batch_size": BASELINE_BATCH,
                     "workers": baseline_workers, "precision": "fp32"},
        "ratio": {label: speed / baseline for label, speed in ours.items()},
    }
    path = save(f"extract-{device.type}", document)
    print(f"figures saved to {path}")
    return document


if __name__ == "__main__":
    main()
