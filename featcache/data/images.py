"""Reading dataset images exactly as the reference code does, and saying which ones are bad.

Decoding is ``PIL.Image.open(path).convert("RGB")`` (Cole et al., ``datasets.ds_multilabel``):
no EXIF transpose; PNG with alpha, palette, grayscale and CMYK images all go through
``convert("RGB")``, bit for bit as the reference (alpha is dropped, a palette is looked up,
CMYK is converted by PIL's rule). One exception, where the reference's decode is wrong: images
of more than 8 bits per channel that PIL keeps as integers or floats (16-bit grayscale PNG and
TIFF, modes ``I;16*``; 32-bit ``I``; float ``F``), which ``convert("RGB")`` clips at 255, so that
a 16-bit PNG comes out nearly white. :func:`to_rgb` scales them instead (:data:`DEPTH_RULE`).
(16-bit colour PNGs are read by PIL as 8-bit RGB already.)

PIL's ``LOAD_TRUNCATED_IMAGES`` must be off, or a truncated JPEG would be padded with grey
instead of being reported; :func:`require_strict_pil` turns it off (with a warning) wherever
images are read. :func:`image_problem` says what is wrong with a file, :func:`survey_images`
decodes a whole dataset at prepare time (modes, sizes, unreadable files), and
:func:`image_root` finds the folder a labels file's image paths are relative to.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from featcache.data.labelfile import LabelSet
from featcache.errors import FeatcacheWarning, InputError, OptionError
from featcache.fileio import human_bytes
from featcache.progress import progress

#: how images deeper than 8 bits become 8-bit RGB (the reference would clip them at 255)
DEPTH_RULE = ("16-bit (I;16*): round(v * 255 / 65535); 32-bit integer (I): the same when a value "
              "exceeds 255, else as is; float (F) with every value in [0, 1]: round(v * 255); "
              "then grey to RGB")

#: what PIL raises for files it cannot open or decode
DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError)


def require_strict_pil() -> None:
    """Make truncated images raise (PIL's ``LOAD_TRUNCATED_IMAGES`` off); warn if it was on."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        warnings.warn("PIL.ImageFile.LOAD_TRUNCATED_IMAGES was on (set by another library); "
                      "featcache turns it off so that truncated images are reported, not padded",
                      RuntimeWarning, stacklevel=2)
        ImageFile.LOAD_TRUNCATED_IMAGES = False


@contextmanager
def open_image(path: str | os.PathLike | IO[bytes], name: str | os.PathLike | None = None
               ) -> Iterator[Image.Image]:
    """``Image.open(path)``, with PIL's two-line decompression-bomb warning (an image of more
    than ``Image.MAX_IMAGE_PIXELS`` pixels, decoded anyway) replaced by one featcache line
    naming the image (``name``, default ``path``). Images twice over the limit still raise
    PIL's DecompressionBombError (one of :data:`DECODE_ERRORS`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image = Image.open(path)
    with image:
        width, height = image.size
        limit = Image.MAX_IMAGE_PIXELS
        if limit and width * height > limit:
            warnings.warn(f"{name or path} is {width} x {height} ({width * height:,} pixels), over "
                          f"PIL's limit of {limit:,} for untrusted images; decoding it anyway "
                          f"({human_bytes(width * height * 3)} as RGB)",
                          FeatcacheWarning, stacklevel=3)
        yield image


def load_rgb(path: str | os.PathLike, draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode ``path`` as the reference does: ``Image.open(path).convert("RGB")``, fully loaded.

    ``draft=(w, h)`` (opt-in, off in the reference) lets a JPEG decode at 1/2, 1/4 or 1/8 scale
    in libjpeg (``Image.draft``) when the result stays at least w x h: much less work for
    photos far larger than the network's input, slightly different pixels. Other formats ignore it.
    """
    with open_image(path) as image:
        if draft is not None:
            image.draft(None, draft)
        return to_rgb(image)


def is_deep(mode: str) -> bool:
    """Whether PIL keeps images of ``mode`` as integers or floats deeper than 8 bits."""
    return mode.startswith("I;16") or mode in ("I", "F")


def to_rgb(image: Image.Image) -> Image.Image:
    """``image.convert("RGB")`` (the reference), except for deeper than 8-bit grayscale images,
    scaled by :data:`DEPTH_RULE` instead of clipped."""
    mode = image.mode
    if not is_deep(mode):
        return image.convert("RGB")
    values = np.asarray(image)
    if mode == "F":
        if values.size and (values.min() < 0 or values.max() > 1):
            return image.convert("RGB")  # not a [0, 1] image: PIL's rule, as the reference
        top = 1.0
    elif mode.startswith("I;16") or (values.size and values.max() > 255):
        top = 65535.0
    else:
        return image.convert("RGB")  # 8-bit values stored as I: the same as the reference
    scaled = np.rint(np.clip(values.astype(np.float64), 0, top) * (255.0 / top)).astype(np.uint8)
    return Image.fromarray(scaled, "L").convert("RGB")


def image_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the image at ``path`` (missing, empty, unreadable), or None if it decodes."""
    path = Path(path)
    problem = _file_problem(path)
    if problem is not None:
        return problem
    require_strict_pil()
    try:
        load_rgb(path)
    except DECODE_ERRORS as exc:
        return _decode_reason(path, exc)
    return None


def _file_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold an image before any decoding: missing, not a file, empty."""
    if not path.exists():
        return "file does not exist"
    if not path.is_file():
        return "not a file"
    if path.stat().st_size == 0:
        return "file is empty (0 bytes)"
    return None


#: ``prepare`` verifies images by default below this many (decoding costs ~1-5 ms an image)
VERIFY_LIMIT = 50_000


@dataclass
class ImageSurvey:
    """What decoding every image of a dataset found: modes, sizes, and the unreadable ones."""

    count: int = 0
    modes: Counter = field(default_factory=Counter)
    widths: list[int] = field(default_factory=list)
    heights: list[int] = field(default_factory=list)
    alpha: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)

    @property
    def deep(self) -> int:
        return sum(n for mode, n in self.modes.items() if is_deep(mode))

    def summary(self) -> str:
        """One line: how many images, their modes, their sizes, what conversion they get."""
        modes = ", ".join(f"{mode} {n}" for mode, n in self.modes.most_common())
        sizes = ""
        if self.widths:
            w, h = np.array(self.widths), np.array(self.heights)
            sizes = (f"; sizes {w.min()}x{h.min()} to {w.max()}x{h.max()} (median "
                     f"{int(np.median(w))}x{int(np.median(h))})")
        notes = []
        if self.deep:
            notes.append(f"{self.deep} deeper than 8 bits, scaled to 8 bits ({DEPTH_RULE})")
        if self.alpha:
            notes.append(f"{self.alpha} with transparency: alpha dropped, as the reference does")
        converted = sum(n for mode, n in self.modes.items() if mode not in ("RGB", "L"))
        if converted - self.deep:
            notes.append(f"{converted - self.deep} palette/CMYK/other modes converted to RGB as "
                         "the reference does")
        bad = f"; {len(self.bad)} unreadable" if self.bad else ""
        return (f"images verified: {self.count - len(self.bad)} decoded ({modes}){sizes}{bad}"
                + ("; " + "; ".join(notes) if notes else ""))

    def record(self) -> dict:
        """What the labels file's provenance keeps."""
        return {"count": self.count, "modes": dict(self.modes), "alpha": self.alpha,
                "deep": self.deep, "bad": [{"image": n, "reason": r} for n, r in self.bad],
                "depth_rule": DEPTH_RULE,
                **({"min_size": [min(self.widths), min(self.heights)],
                    "max_size": [max(self.widths), max(self.heights)]} if self.widths else {})}


def survey_images(root: str | os.PathLike, names: Iterable[str], desc: str = "verifying images",
                  total: int | None = None) -> ImageSurvey:
    """Decode every image ``root / name`` (JPEGs at reduced scale: the whole stream is still
    read, so truncation is caught) and note its mode, size and transparency."""
    require_strict_pil()
    survey = ImageSurvey()
    bar = progress(names, desc=desc, unit="img", total=total)
    for name in bar:
        path = Path(root) / str(name)
        survey.count += 1
        try:
            with open_image(path) as image:
                mode, (width, height) = image.mode, image.size
                if image.format == "JPEG":
                    image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
                image.load()
                alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
        except DECODE_ERRORS as exc:
            survey.bad.append((str(name), _decode_reason(path, exc)))
            bar.skip(1)
            continue
        survey.modes[mode] += 1
        survey.widths.append(width)
        survey.heights.append(height)
        survey.alpha += int(alpha)
    return survey


def _decode_reason(path: Path, exc: Exception) -> str:
    """What an image that failed to open is: a file problem, else the decoder's error."""
    return _file_problem(path) or f"cannot be decoded ({type(exc).__name__}: {exc})"


def image_root(labels: LabelSet, override: str | os.PathLike | None) -> Path:
    """The folder the labels file's image paths are relative to.

    ``--images-root`` wins; otherwise the labels file's ``image_root`` attribute, relative to
    the current directory or, failing that, to the labels file's directory.
    """
    if labels.provenance.get("source_format") == "npz":
        npz = next((f.get("file") for f in labels.provenance.get("sources", [])), "an .npz file")
        raise InputError(
            f"{labels.path} was imported from a precomputed feature set ({npz}): it has features "
            "but no images, so nothing here can read images (stage one, fine-tuning, CAMs, "
            f"predicting from images). Its features are ready: `featcache train-linear --dataset "
            f"{labels.dataset}`; predict from features with `featcache predict --run RUN --features FILE`")
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
