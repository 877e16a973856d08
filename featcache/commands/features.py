"""``featcache features``: stage one, backbone features extracted once into HDF5."""

from __future__ import annotations

import click

from featcache.commands.common import (
    cache_option,
    chosen_dataset,
    dataset_option,
    device_option,
    overwrite_option,
    preprocess_option,
)


@click.command("features")
@dataset_option(help="Dataset name under the cache root (or a directory holding labels.h5).")
@click.option("--backbone", default="resnet50", show_default=True,
              help="Backbone from the registry (`featcache backbones` lists them): resnet50 (the "
                   "papers'), vit-b16, convnext-b, dinov2-vit-b14/-l14, clip-vit-b16/-l14/-l14-336, "
                   "siglip-vit-b16, ...")
@click.option("--weights", default=None,
              help="ResNets: v1 (torchvision IMAGENET1K_V1, the papers'; the default), v2. timm and "
                   "open_clip backbones: a pretrained tag (default: the one `featcache backbones` "
                   "shows). Any: random (seeded initialisation) or a path to a checkpoint file. "
                   "Found offline in the torch hub / Hugging Face cache, else downloaded; set "
                   "FEATCACHE_OFFLINE=1 to never download.")
@click.option("--image-size", default=None, type=click.IntRange(min=32),
              help="Network input size SIZE x SIZE  [default: the backbone's: 448 for ResNets (the "
                   "protocol), 224 for most others, 336 for clip-vit-l14-336].")
@preprocess_option(
    help="native: the backbone's own evaluation transform (ResNets: the protocol's; CLIP: shorter "
         "side + centre crop, CLIP mean/std; timm: its crop_pct, ...). protocol: Resize((s, s)) "
         "bilinear and ImageNet mean/std, what the SPML reference code (and VLPL/AEVLP) feed every "
         "network; tagged -protocol in the file name.")
@click.option("--text", is_flag=True, default=False,
              help="Also store the class-prompt text embeddings (vision-language backbones), for "
                   "`featcache pseudo-label`. Added to an up-to-date file without re-extracting.")
@click.option("--prompt", "prompt_templates", multiple=True, metavar="TEMPLATE",
              help="Prompt template with {} for the class name (repeatable: the embeddings are "
                   "averaged)  [default: 'a photo of a {}.'].")
@click.option("--class-names", type=click.Path(dir_okay=False, exists=True), default=None,
              help="File with one class name per line (labels file order) to put in the prompts "
                   "[default: the labels file's names, _ read as a space].")
@click.option("--text-embeddings", type=click.Path(dir_okay=False, exists=True), default=None,
              help="An .npy of L x E class embeddings to store instead of encoding prompts (e.g. "
                   "VLPL's shipped text features).")
@click.option("--crops", default=None, metavar="GxG",
              help="Also store the embeddings of a G x G grid of tiles of every training image "
                   "(AEVLP's local views, e.g. 4x4), for `featcache pseudo-label --rule aevlp`.")
@click.option("--spatial", is_flag=True, default=False,
              help="Store each image's last feature map (14 x 14 x 2048 for ResNet-50 at 448) in "
                   "spatial-<tag>.h5, for BoostLU heads (docs/features.md: layout, sizes). ResNets "
                   "also write features-<tag>.h5 in the same pass when it does not exist yet. "
                   "The size is printed (and the free space checked) before starting.")
@click.option("--compression", type=click.Choice(["lzf", "gzip", "none"]), default="lzf",
              show_default=True,
              help="How --spatial files are compressed (with HDF5's byte shuffle): lzf is fast to "
                   "read, gzip (level 1) smaller and slower.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Images per forward pass  [default: 256 on a GPU, 32 on the CPU; with --crops "
                   "GxG that many tiles per pass and 1/G^2 as many images per batch].")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="DataLoader processes decoding images  [default: all CPUs but one per GPU; "
                   "1 on the CPU].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto",
              show_default=True,
              help="Compute precision: auto = bf16 on GPUs that support it (else fp16), fp32 on the "
                   "CPU; fp32 on a GPU also turns TF32 off (exact fidelity).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default=None,
              help="How features are stored  [default: float32; float16 with --spatial].")
@device_option
@click.option("--gpu-decode/--pil-decode", default=None,
              help="Where JPEGs are decoded. Neither (auto): on CUDA on the GPU (nvJPEG, whole "
                   "batches, ahead of the forward pass, resized there), except with --jpeg-draft "
                   "or --crops, or when the features file or its unfinished work already records "
                   "PIL (then kept, so that it stays up to date and resumes); on the CPU, and for "
                   "other formats, with PIL. --gpu-decode asks for the GPU (needs CUDA); "
                   "--pil-decode for PIL, the protocol's decoder, which the papers' numbers were "
                   "made with. GPU-decoded features are close to PIL's, not identical; the file "
                   "records its decoder (docs/features.md; figures in docs/performance.md).")
@click.option("--jpeg-draft", is_flag=True, default=False,
              help="Let PIL decode JPEGs at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) when "
                   "the image stays at least SIZE x SIZE; slightly different features. Pays only "
                   "for photos at least twice SIZE each way (less CPU per image); smaller ones "
                   "decode as without it (figures in docs/performance.md). Off: the reference "
                   "decodes full size.")
@click.option("--skip-bad", is_flag=True, default=False,
              help="Flag unreadable images (NaN features, /<split>/bad = 1, listed in the file's "
                   "bad_images attribute) instead of stopping at the first one.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per saved chunk, the unit of resuming and of sharding across ranks; a "
                   "multiple of the batch size  [default: about 1024; --spatial: about 128 MB].")
@overwrite_option
@click.option("--images-root", type=click.Path(file_okay=False), default=None,
              help="Folder the labels file's image paths are relative to (default: its image_root).")
@cache_option
def command(dataset, backbone, weights, image_size, preprocess, text, prompt_templates, class_names,
            text_embeddings, crops, spatial, compression, batch_size, workers, precision, dtype, device, gpu_decode,
            jpeg_draft, skip_bad, chunk_rows, overwrite, images_root, cache):
    """Stage one: run the backbone once over every image into <cache>/<dataset>/features-<tag>.h5.

    \b
    <tag> is the backbone with a suffix for non-default weights (and -protocol for
    --preprocess protocol where that is not the backbone's own), so that different features
    never overwrite each other: resnet50 (v1), resnet50-v2, resnet50-random,
    resnet50-<file stem>, clip-vit-l14-336, clip-vit-l14-336-protocol.
    Rows follow the labels file (official train, then test). Work is saved in chunks: an
    interrupted run resumes when the same command runs again, and a finished, up-to-date file
    is left alone. --spatial writes <cache>/<dataset>/spatial-<tag>.h5 instead (the feature
    maps; see docs/features.md). For several GPUs:
      torchrun --nproc_per_node N -m featcache features --dataset voc
    """
    from featcache.features.extract import ExtractOptions, extract_features
    from featcache.interrupt import safe_points

    if gpu_decode and not _cuda_requested(device):
        raise click.BadParameter("needs a CUDA device (--device cuda, or auto on a machine with "
                                 "a GPU)", param_hint="--gpu-decode")
    options = ExtractOptions(
        backbone=backbone, weights=weights, image_size=image_size, preprocess=preprocess,
        batch_size=batch_size, workers=workers, precision=precision, dtype=dtype, device=device,
        gpu_decode=gpu_decode, jpeg_draft=jpeg_draft, skip_bad=skip_bad, chunk_rows=chunk_rows,
        overwrite=overwrite, images_root=images_root, cache=cache, text=text, prompts=tuple(prompt_templates),
        class_names=class_names, text_embeddings=text_embeddings, crops=_grid(crops),
        spatial=spatial, compression=compression,
    )
    dataset = chosen_dataset(dataset, cache)
    with safe_points():  # stage one stops at its next batch, keeping finished chunks
        result = extract_features(dataset, options,
                                  say=lambda message: click.echo(message, err=True))
    if result.status != "shard":  # ranks > 0 say nothing
        click.echo(result.summary())


def _grid(value: str | None) -> int:
    """``4x4`` -> 4 (square grids only, as AEVLP's)."""
    if value is None:
        return 0
    rows, sep, cols = value.lower().partition("x")
    if not sep or not rows.strip().isdigit() or rows.strip() != cols.strip() or int(rows) < 1:
        raise click.BadParameter(f"{value!r} is not a square grid GxG with G >= 1, e.g. 4x4",
                                 param_hint="--crops")
    return int(rows)


def _cuda_requested(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
