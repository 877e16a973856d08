"""New images through a run's backbone: stage one's decoding, resizing and normalisation.

Images are decoded as the reference does (``PIL.Image.open(p).convert("RGB")``), resized to the
run's s x s in DataLoader workers (:class:`~featcache.backbones.inputs.ImageRows`), normalised
on the device (:class:`~featcache.backbones.Uint8Normalize`) and batched; a bar shows progress.
A file that cannot be read stops the work with one error naming it, or (``skip_bad``) is left
out with a warning naming it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from featcache.backbones import Preprocess, Uint8Normalize, backbone_spec, resolve_preprocess
from featcache.backbones.inputs import ImageRows, worker_init
from featcache.data.images import image_problem, require_strict_pil
from featcache.errors import FeatcacheWarning, InputError
from featcache.interrupt import check_stop, safe_points
from featcache.progress import progress as progress_bar
from featcache.runtime import autocast, backend_flags, default_batch_size, resolve_precision

#: file endings taken from a folder given in place of images
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm")


def image_paths(items: Iterable[str | Path]) -> list[Path]:
    """Image files as given, folders replaced by the image files under them (sorted).

    A path that does not exist, or a folder without images, is refused naming it.
    """
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*")
                           if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise InputError(f"folder {path} holds no images (files ending in "
                                 f"{', '.join(IMAGE_SUFFIXES)})")
            paths += found
        elif path.exists():
            paths.append(path)
        else:
            raise InputError(f"image {path} does not exist")
    if not paths:
        raise InputError("no images given")
    return paths


#: how the images of a call are named: paths, or words such as "PIL image 3"
Named = TypeVar("Named", Path, str)


def run_on_images(paths: Sequence[Named], forward: Callable[[Tensor], Tensor], image_size: int,
                  backbone: str, device: torch.device, batch_size: int | None = None,
                  workers: int = 0, precision: str = "auto", skip_bad: bool = False,
                  progress: bool = True, desc: str = "images",
                  preprocess: Preprocess | None = None, dataset: ImageRows | None = None,
                  fix_hint: str = "fix or remove it, or pass --skip-bad to leave it out",
                  ) -> tuple[list[Named], np.ndarray]:
    """``forward`` (a network on a normalised batch) on every image, batched, in order;
    ``preprocess`` is the backbone's (default: its native one); ``dataset`` reads the rows
    (default: stage one's :class:`ImageRows` over ``paths``); ``fix_hint`` ends the error for
    an unreadable image.

    Returns the images that were read (all of them unless ``skip_bad``) and the outputs
    (float32, one row each).
    """
    require_strict_pil()
    precision = resolve_precision(precision, device)
    batch_size = batch_size or default_batch_size(device)
    preprocess = preprocess or resolve_preprocess(backbone)
    layout = torch.channels_last if backbone_spec(backbone).channels_last else torch.contiguous_format
    if dataset is None:
        dataset = ImageRows(Path("."), [str(p) for p in paths], image_size, preprocess=preprocess)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                        pin_memory=device.type == "cuda", worker_init_fn=worker_init,
                        prefetch_factor=2 if workers else None)
    normalize = Uint8Normalize(backbone, preprocess).to(device)
    kept: list[Named] = []
    outputs: list[np.ndarray] = []
    bar = progress_bar(total=len(paths), unit="img", desc=desc, disable=not progress)
    with bar, torch.inference_mode(), backend_flags(device, precision), safe_points():
        for images, rows, ok in loader:
            check_stop()  # Ctrl-C or SIGTERM on the command line: stop within a batch
            for row in rows[~ok].tolist():
                reason = image_problem(paths[row]) or "it could not be decoded"
                if not skip_bad:
                    raise InputError(f"cannot read image {paths[row]}: {reason}; {fix_hint}")
                warnings.warn(f"left out {paths[row]}: {reason}", FeatcacheWarning, stacklevel=2)
                bar.skip(1)
            if ok.any():
                batch = normalize(images[ok].to(device, non_blocking=True))
                batch = batch.contiguous(memory_format=layout)
                with autocast(device, precision):
                    outputs.append(forward(batch).float().cpu().numpy())
                kept += [paths[row] for row in rows[ok].tolist()]
            bar.update(len(rows))
    if not outputs:  # every image was left out (--skip-bad): nothing to score
        which = (f"{paths[0]} was left out" if len(paths) == 1 else
                 f"all {len(paths)} were left out, each named above")
        raise InputError(f"no image could be read: {which}; nothing to score")
    return kept, np.concatenate(outputs)
