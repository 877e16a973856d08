"""Which decoder a stage-one run uses: PIL (the reference's), PIL with JPEG draft scaling
(``--jpeg-draft``), or JPEGs decoded on the device (``--gpu-decode``).

``--gpu-decode`` and ``--pil-decode`` choose (``ExtractOptions.gpu_decode`` True or False).
Without either (None, *auto*), a run on CUDA decodes its JPEGs on the device: the verdict of
``benchmarks/decoder_choice.py`` on the H200 run of 2026-11-28 (recorded in
``docs/gpu-runs/2026-11-28-h200/gpu-check/gpu-check.json``, row "decoder choice"). Auto keeps
PIL, as before that run, when

- the run is on the CPU;
- ``--jpeg-draft`` (a PIL option) or ``--crops`` (tiles cut from full-size PIL images) is given;
- the features file exists (and ``--overwrite`` is not given) and records PIL, or unfinished
  work of it with this run's transform does: so that a file made with PIL stays up to date and
  its chunks resume, whatever the default (one made on the device stays on the device);
- none of a sample of the dataset's images is a JPEG: the device would decode none of them.

Every file records its decoder in its ``transform`` attribute
(:func:`~featcache.backbones.decoders.recorded_decoder` reads it back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featcache.backbones.decoders import recorded_decoder
from featcache.backbones.inputs import any_jpeg
from featcache.data.featurefile import read_feature_attrs
from featcache.errors import InputError
from featcache.features.shards import read_manifest

#: what auto decodes JPEGs with on CUDA when nothing on disk says otherwise
AUTO_ON_CUDA = "device"
#: how many of a dataset's images auto looks at for a JPEG
JPEG_SAMPLE = 32


@dataclass(frozen=True)
class Recorded:
    """The decoder an existing file or its unfinished work records (``decode`` None: unknown)."""

    decode: str | None
    where: str  # "file" (the finished features file) or "work" (its unfinished chunks)


@dataclass(frozen=True)
class DecoderChoice:
    """The decoder of a run (one of :data:`~featcache.backbones.decoders.DECODERS`) and why:
    ``asked`` (--gpu-decode / --pil-decode), ``cpu``, ``draft``, ``crops``, ``file`` or ``work``
    (what is on disk records it), ``no-jpeg`` or ``default``."""

    decode: str
    reason: str


def choose_decoder(device_type: str, gpu_decode: bool | None, *, jpeg_draft: bool = False,
                   crops: bool = False, recorded: Recorded | None = None,
                   has_jpegs: Callable[[], bool] = lambda: True) -> DecoderChoice:
    """The decoder of a run on ``device_type`` (``cuda``, ``cpu``) with ``--gpu-decode`` (True),
    ``--pil-decode`` (False) or neither (None); ``has_jpegs`` is only asked when it decides."""
    pil = "pil-draft" if jpeg_draft else "pil"
    if gpu_decode is not None:
        return DecoderChoice("device" if gpu_decode else pil, "asked")
    if device_type != "cuda":
        return DecoderChoice(pil, "cpu")
    if jpeg_draft:
        return DecoderChoice(pil, "draft")
    if crops:
        return DecoderChoice(pil, "crops")
    if recorded is not None and recorded.decode in ("pil", AUTO_ON_CUDA):
        return DecoderChoice(recorded.decode, recorded.where)
    if not has_jpegs():
        return DecoderChoice(pil, "no-jpeg")
    return DecoderChoice(AUTO_ON_CUDA, "default")


def recorded_on_disk(final: Path, overwrite: bool,
                     transform: Callable[[str], dict] | None = None) -> Recorded | None:
    """The decoder ``final`` records (unless ``overwrite`` replaces it), else the one its
    unfinished work records; None when neither exists, or when the work's transform is not
    ``transform(its decoder)`` (this run's transform with that decoder: other settings, whose
    chunks the run deletes rather than resumes)."""
    if final.exists() and not overwrite:
        try:
            attrs = read_feature_attrs(final)
        except InputError:  # the up-to-date check says what is wrong with it
            return Recorded(None, "file")
        return Recorded(recorded_decoder(attrs.get("transform") or {}), "file")
    manifest = read_manifest(final)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("transform"), dict):
        return None
    decode = recorded_decoder(manifest["transform"])
    if decode is None or (transform is not None and transform(decode) != manifest["transform"]):
        return None
    return Recorded(decode, "work")


def sampled_images(root: Path, images: Sequence[str] | np.ndarray, sample: int = JPEG_SAMPLE) -> list[Path]:
    """Up to ``sample`` of ``images`` spread evenly over them, as paths under ``root``."""
    if not len(images):
        return []
    picks = np.unique(np.linspace(0, len(images) - 1, min(sample, len(images))).astype(int))
    return [root / str(images[i]) for i in picks]


def describe_choice(choice: DecoderChoice, final: Path) -> str | None:
    """The line a run says about its decoder (None: nothing worth saying)."""
    if choice.reason == "default":
        return ("decoding JPEGs on the GPU (the default on CUDA; --pil-decode decodes with PIL, "
                "the protocol's decoder)")
    if choice.reason == "work" and choice.decode != AUTO_ON_CUDA:
        return (f"the unfinished work of {final.name} was decoded with PIL: resuming with PIL "
                "(--gpu-decode starts it again on the GPU)")
    return None


def jpeg_check(root: Callable[[], Path], images: Sequence[str] | np.ndarray) -> Callable[[], bool]:
    """``has_jpegs`` for :func:`choose_decoder`: whether a sample of ``images`` holds a JPEG
    (False when the image folder cannot be found: the run's own checks then say why)."""
    def has_jpegs() -> bool:
        try:
            folder = root()
        except InputError:
            return False
        return any_jpeg(sampled_images(folder, images))
    return has_jpegs
