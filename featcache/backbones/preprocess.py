"""How a dataset image becomes a backbone's input: resize (and crop), then normalise.

Two policies cover every registered backbone:

- ``squash``: ``Resize((s, s))``, no crop: the protocol's (PROTOCOL.md section 2; Cole et al.'s
  ``datasets.get_transforms``) and SigLIP's;
- ``center``: the shorter side to ``floor(s / crop_pct)``, then a centre ``s x s`` crop: timm's
  evaluation transform (``transforms_imagenet_eval``), OpenAI CLIP's (crop_pct 1) and DINOv2's
  linear evaluation (resize 256, crop 224: crop_pct 0.875).

The transform is split in two so that DataLoader workers send uint8: :meth:`Preprocess.pil_steps`
(resize, crop; then ``PILToTensor``) runs on the CPU and
:class:`~featcache.backbones.transforms.Uint8Normalize` finishes it on the device with the same
operations, in the same order, as ``ToTensor`` + ``Normalize``.
:meth:`Preprocess.describe` is the transform as data, recorded in features files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor
from torchvision import transforms
from torchvision.transforms import InterpolationMode

from featcache.backbones.decoders import DECODE_TEXT, DRAFT_TEXT

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)

RESIZE_POLICIES = ("squash", "center")
INTERPOLATIONS = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}
#: ``--preprocess``: the backbone's own evaluation transform, or the protocol's squash + ImageNet
PREPROCESS_MODES = ("native", "protocol")


@dataclass(frozen=True)
class Preprocess:
    """One backbone's image preprocessing (resize policy, interpolation, normalisation)."""

    resize: str = "squash"
    crop_pct: float = 1.0
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        if self.resize not in RESIZE_POLICIES:
            raise ValueError(f"resize policy {self.resize!r}: choose one of {RESIZE_POLICIES}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation {self.interpolation!r}: choose one of {list(INTERPOLATIONS)}")
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct}")

    def scale_size(self, image_size: int) -> int:
        """The shorter side before the centre crop (timm's ``floor(s / crop_pct)``)."""
        return math.floor(image_size / self.crop_pct)

    def draft_size(self, image_size: int) -> int:
        """The smallest square a JPEG may be decoded down to (``--jpeg-draft``) before the
        resize: s for a squash, the pre-crop shorter side for a centre crop."""
        return image_size if self.resize == "squash" else self.scale_size(image_size)

    def pil_steps(self, image_size: int) -> list:
        """PIL image -> resized (and cropped) PIL image of ``image_size`` x ``image_size``."""
        mode = INTERPOLATIONS[self.interpolation]
        if self.resize == "squash":
            return [transforms.Resize((image_size, image_size), interpolation=mode)]
        return [transforms.Resize(self.scale_size(image_size), interpolation=mode),
                transforms.CenterCrop(image_size)]

    def resize_tensor(self, image: Tensor, image_size: int) -> Tensor:
        """The same resize on a decoded uint8 tensor (3, H, W) on any device (antialiased)."""
        from torchvision.transforms.v2 import functional as F

        mode = INTERPOLATIONS[self.interpolation]
        if self.resize == "squash":
            return F.resize(image, [image_size, image_size], interpolation=mode, antialias=True)
        image = F.resize(image, self.scale_size(image_size), interpolation=mode, antialias=True)
        return F.center_crop(image, [image_size, image_size])

    def describe(self, image_size: int, decode: str = "pil") -> dict:
        """The evaluation transform as data (recorded in features files, compared on resume).

        The protocol's squash + bilinear + ImageNet transform keeps the description every
        ResNet-50 features file already carries.
        """
        on_device = decode == "device"
        interpolation = (f"{self.interpolation}, antialiased tensor resize" if on_device
                         else self.interpolation)
        side = self.draft_size(image_size)
        decoders = dict(DECODE_TEXT, **{
            "pil-draft": f"{DRAFT_TEXT}None, ({side}, {side})) for JPEGs, .convert('RGB')"})
        resize: list[int] | dict[str, int]
        crop: dict[str, list[int]] | None
        if self.resize == "squash":
            resize, crop = [image_size, image_size], None
        else:
            resize, crop = {"shorter_side": self.scale_size(image_size)}, {"center": [image_size, image_size]}
        return {
            "decode": decoders[decode],
            "resize": resize,
            "interpolation": interpolation,
            "crop": crop,
            "to_tensor": "uint8 / 255",
            "normalize": {"mean": list(self.mean), "std": list(self.std)},
        }


#: the protocol's transform: Resize((s, s)) bilinear, no crop, ImageNet normalisation
PROTOCOL = Preprocess()


def described_image_size(description: dict) -> int | None:
    """The network's input size recorded in a transform description (crop, else resize)."""
    crop = description.get("crop")
    if isinstance(crop, dict) and crop.get("center"):
        return int(crop["center"][0])
    resize = description.get("resize")
    if isinstance(resize, (list, tuple)) and resize:
        return int(resize[0])
    return None
