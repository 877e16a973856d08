"""What ``featcache features --jpeg-draft`` buys and what it changes, on generated photos.

For photo-like JPEGs (quality 90) at ``--scale`` times VOC's sizes (about 500 x 375 at 1),
resized to ``--image-size``: the milliseconds of one PIL decode + resize per image on one
core, with the reference's full-size decode and with ``draft`` (libjpeg's 1/2, 1/4, 1/8 DCT
scaling, used only when the image stays at least SIZE x SIZE); how far the resized uint8
inputs move (mean absolute difference in grey levels); and how far the pooled features of a
ResNet-50 (random weights, fp32) move (relative L2 error per image, and cosine similarity).

    python -m benchmarks.jpeg_draft                        # 2x VOC's size at 224 (draft acts)
    python -m benchmarks.jpeg_draft --scale 1 --image-size 448   # VOC at 448: draft cannot act
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import describe, machine, save
from benchmarks.extract import pil_ms_per_image
from benchmarks.photos import generated_images
from featcache.backbones import Uint8Normalize, create_backbone
from featcache.backbones.inputs import ImageRows
from featcache.runtime import usable_cpus
from featcache.tables import Table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jpeg_draft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=2.0, help="times VOC's photo sizes (2)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--out", default=None)
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args(argv)
    root = Path(args.data_root) if args.data_root else None
    folder, names, mean_kb = generated_images(args.images, usable_cpus(), args.scale, root)
    timing = {draft: pil_ms_per_image(folder, names, args.image_size, len(names), draft)
              for draft in (False, True)}
    full = ImageRows(folder, names, args.image_size)
    drafted = ImageRows(folder, names, args.image_size, draft=True)
    a = torch.stack([full[i][0] for i in range(len(names))])
    b = torch.stack([drafted[i][0] for i in range(len(names))])
    pixels = float((a.float() - b.float()).abs().mean())
    model, normalize = create_backbone("resnet50", "random"), Uint8Normalize()
    with torch.inference_mode():
        fa, fb = model(normalize(a)).double(), model(normalize(b)).double()
    relative = ((fb - fa).norm(dim=1) / fa.norm(dim=1)).numpy()
    cosine = torch.nn.functional.cosine_similarity(fa, fb, dim=1).numpy()
    info = machine("cpu")
    table = Table(["decode", "ms per image per core", "speed-up"],
                  title=f"PIL decode + resize to {args.image_size}, {len(names)} JPEGs of "
                        f"{mean_kb:.0f} kB at {args.scale:g}x VOC size, {describe(info)}")
    table.add("full size (the reference)", timing[False], 1.0)
    table.add("--jpeg-draft", timing[True], timing[False] / timing[True])
    print(table.markdown())
    print(f"inputs: mean |difference| {pixels:.2f} grey levels; features (ResNet-50, random "
          f"weights, fp32): relative L2 error median {np.median(relative):.4f}, max "
          f"{relative.max():.4f}; cosine similarity min {cosine.min():.5f}")
    document = {"benchmark": "jpeg_draft", "machine": info, "scale": args.scale,
                "image_size": args.image_size, "images": len(names), "mean_jpeg_kB": mean_kb,
                "ms_per_image": {"full": timing[False], "draft": timing[True]},
                "pixel_mean_abs_difference": pixels,
                "feature_relative_error": {"median": float(np.median(relative)),
                                           "max": float(relative.max())},
                "feature_cosine_min": float(cosine.min())}
    path = save(f"jpeg-draft-x{args.scale:g}-{args.image_size}", document, args.out)
    print(f"figures saved to {path}")
    return document


if __name__ == "__main__":
    main()
