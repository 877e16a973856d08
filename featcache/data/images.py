"""Reading dataset images exactly as the reference code does, and saying which ones are bad.

Decoding is ``PIL.Image.open(path).convert("RGB")`` (Cole et al., ``datasets.ds_multilabel``):
no EXIF transpose; PNG with alpha, palette, grayscale and CMYK images all go through
``convert("RGB")``. PIL's ``LOAD_TRUNCATED_IMAGES`` must be off, or a truncated JPEG would be
padded with grey instead of being reported; :func:`require_strict_pil` turns it off (with a
warning) wherever images are read. :func:`image_problem` says what is wrong with a file, and
:func:`image_root` finds the folder a labels file's image paths are relative to.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from PIL import Image, ImageFile, UnidentifiedImageError

from featcache.data.labelfile import LabelSet
from featcache.errors import InputError, OptionError

#: what PIL raises for files it cannot open or decode
DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError)


def require_strict_pil() -> None:
    """Make truncated images raise (PIL's ``LOAD_TRUNCATED_IMAGES`` off); warn if it was on."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        warnings.warn("PIL.ImageFile.LOAD_TRUNCATED_IMAGES was on (set by another library); "
                      "featcache turns it off so that truncated images are reported, not padded",
                      RuntimeWarning, stacklevel=2)
        ImageFile.LOAD_TRUNCATED_IMAGES = False


def load_rgb(path: str | os.PathLike, draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode ``path`` as the reference does: ``Image.open(path).convert("RGB")``, fully loaded.

    ``draft=(w, h)`` (opt-in, off in the reference) lets a JPEG decode at 1/2, 1/4 or 1/8 scale
    in libjpeg (``Image.draft``) when the result stays at least w x h: much less work for
    photos far larger than the network's input, slightly different pixels. Other formats ignore it.
    """
    with Image.open(path) as image:
        if draft is not None:
            image.draft(None, draft)
        return image.convert("RGB")


def image_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the image at ``path`` (missing, empty, unreadable), or None if it decodes."""
    path = Path(path)
    if not path.exists():
        return "file does not exist"
    if not path.is_file():
        return "not a file"
    if path.stat().st_size == 0:
        return "file is empty (0 bytes)"
    require_strict_pil()
    try:
        load_rgb(path)
    except DECODE_ERRORS as exc:
        return f"cannot be decoded ({type(exc).__name__}: {exc})"
    return None


def image_root(labels: LabelSet, override: str | os.PathLike | None) -> Path:
    """The folder the labels file's image paths are relative to.

    ``--images-root`` wins; otherwise the labels file's ``image_root`` attribute, relative to
    the current directory or, failing that, to the labels file's directory.
    """
    if override is not None:
        root = Path(override)
        if not root.is_dir():
            raise OptionError(f"--images-root {root} is not a directory")
        return root
    if not labels.image_root:
        raise OptionError(f"{labels.path} records no image folder (image_root); pass "
                          "--images-root DIR")
    root = Path(labels.image_root).expanduser()
    if not root.is_dir() and not root.is_absolute() and labels.path is not None:
        beside = labels.path.parent / root
        root = beside if beside.is_dir() else root
    if not root.is_dir():
        hint = (" (it was prepared with labels_only: images were never checked)"
                if labels.provenance.get("labels_only") else "")
        raise InputError(f"image folder {root} (image_root of {labels.path}{hint}) does not exist; "
                         "pass --images-root DIR")
    return root
