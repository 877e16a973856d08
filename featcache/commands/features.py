"""``featcache features``: stage one, backbone features extracted once into HDF5."""

from __future__ import annotations

import click

from featcache.commands.common import cache_option, device_option, overwrite_option


@click.command("features")
@click.option("--dataset", required=True,
              help="Dataset name under the cache root (or a directory holding labels.h5).")
@click.option("--backbone", default="resnet50", show_default=True,
              help="Backbone from the registry: resnet50 (the papers'), resnet101, resnet18.")
@click.option("--weights", default="v1", show_default=True,
              help="v1 (torchvision IMAGENET1K_V1, the papers'), v2 (IMAGENET1K_V2), random "
                   "(seeded initialisation), or a path to a checkpoint file. Found offline in the "
                   "torch hub cache, else downloaded; set FEATCACHE_OFFLINE=1 to never download.")
@click.option("--image-size", default=448, show_default=True, type=click.IntRange(min=32),
              help="Images are resized to SIZE x SIZE (no crop), as in the protocol.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Images per forward pass  [default: 256 on a GPU, 32 on the CPU].")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="DataLoader processes decoding images  [default: all CPUs but one per GPU; "
                   "1 on the CPU].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto",
              show_default=True,
              help="Compute precision: auto = bf16 on GPUs that support it (else fp16), fp32 on the "
                   "CPU; fp32 on a GPU also turns TF32 off (exact fidelity).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32",
              show_default=True, help="How features are stored.")
@device_option
@click.option("--gpu-decode", is_flag=True, default=False,
              help="Decode JPEGs on the GPU (torchvision.io.decode_jpeg, nvJPEG) and resize there: "
                   "less CPU work, features close to but not identical with PIL's.")
@click.option("--jpeg-draft", is_flag=True, default=False,
              help="Let PIL decode JPEGs at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) when "
                   "the image stays at least SIZE x SIZE: less CPU per image for photos much "
                   "larger than SIZE, slightly different features. Off: the reference decodes "
                   "full size (docs/features.md has the measured difference).")
@click.option("--skip-bad", is_flag=True, default=False,
              help="Flag unreadable images (NaN features, /<split>/bad = 1, listed in the file's "
                   "bad_images attribute) instead of stopping at the first one.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per saved chunk, the unit of resuming and of sharding across ranks; a "
                   "multiple of the batch size  [default: about 1024].")
@overwrite_option
@click.option("--images-root", type=click.Path(file_okay=False), default=None,
              help="Folder the labels file's image paths are relative to (default: its image_root).")
@cache_option
def command(dataset, backbone, weights, image_size, batch_size, workers, precision, dtype, device,
            gpu_decode, jpeg_draft, skip_bad, chunk_rows, overwrite, images_root, cache):
    """Stage one: run the backbone once over every image into <cache>/<dataset>/features-<tag>.h5.

    \b
    <tag> is the backbone with a suffix for non-default weights, so that different weights
    never overwrite each other: resnet50 (v1), resnet50-v2, resnet50-random, resnet50-<file stem>.
    Rows follow the labels file (official train, then test). Work is saved in chunks: an
    interrupted run resumes when the same command runs again, and a finished, up-to-date file
    is left alone. For several GPUs:
      torchrun --nproc_per_node N -m featcache features --dataset voc
    """
    from featcache.features.extract import ExtractOptions, extract_features

    if gpu_decode and not _cuda_requested(device):
        raise click.BadParameter("needs a CUDA device (--device cuda, or auto on a machine with "
                                 "a GPU)", param_hint="--gpu-decode")
    options = ExtractOptions(
        backbone=backbone, weights=weights, image_size=image_size, batch_size=batch_size,
        workers=workers, precision=precision, dtype=dtype, device=device, gpu_decode=gpu_decode,
        jpeg_draft=jpeg_draft, skip_bad=skip_bad, chunk_rows=chunk_rows, overwrite=overwrite, images_root=images_root,
        cache=cache,
    )
    result = extract_features(dataset, options, say=lambda message: click.echo(message, err=True))
    if result.status == "written":
        click.echo(result.summary())


def _cuda_requested(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
