"""A backbone's image transform, built from its preprocessing (:mod:`featcache.backbones.preprocess`).

The protocol's transform (PROTOCOL.md section 2; Cole et al., ``datasets.get_transforms``) is
``Resize((s, s))`` (no crop), a random horizontal flip only when training, ``ToTensor`` and
ImageNet ``Normalize``: the ResNets' native preprocessing, and ``--preprocess protocol`` for any
other backbone. The transform is split in two so that DataLoader workers send uint8:
:func:`resize_transform` on the CPU, :class:`Uint8Normalize` on the device.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision import transforms

from featcache.backbones.decoders import recorded_decoder
from featcache.backbones.family import DEFAULT_IMAGE_SIZE
from featcache.backbones.preprocess import PREPROCESS_MODES, PROTOCOL, Preprocess
from featcache.backbones.registry import backbone_spec
from featcache.errors import OptionError


def resolve_preprocess(backbone: str = "resnet50", preprocess: str | Preprocess = "native") -> Preprocess:
    """``native`` (the backbone's own transform), ``protocol`` (squash + ImageNet), or as given."""
    if isinstance(preprocess, Preprocess):
        return preprocess
    if preprocess not in PREPROCESS_MODES:
        raise OptionError(f"--preprocess {preprocess!r}: choose one of {', '.join(PREPROCESS_MODES)}")
    return backbone_spec(backbone).preprocess if preprocess == "native" else PROTOCOL

def image_transform(image_size: int = DEFAULT_IMAGE_SIZE, train: bool = False,
                    backbone: str = "resnet50", preprocess: str | Preprocess = "native") -> transforms.Compose:
    """The evaluation (or, with ``train``, training) transform: PIL RGB image -> normalised
    float tensor (3, s, s). Training adds a random horizontal flip after the resize, as the
    protocol's transform does."""
    chosen = resolve_preprocess(backbone, preprocess)
    steps = chosen.pil_steps(image_size)
    if train:
        steps.append(transforms.RandomHorizontalFlip(0.5))
    steps += [transforms.ToTensor(), transforms.Normalize(mean=chosen.mean, std=chosen.std)]
    return transforms.Compose(steps)


def resize_transform(image_size: int = DEFAULT_IMAGE_SIZE,
                     preprocess: Preprocess = PROTOCOL) -> transforms.Compose:
    """The CPU half of the evaluation transform: PIL image -> resized uint8 tensor (3, s, s).

    :class:`Uint8Normalize` finishes it on the device; together they give exactly the values of
    :func:`image_transform` while moving a quarter of the bytes between processes.
    """
    return transforms.Compose(preprocess.pil_steps(image_size) + [transforms.PILToTensor()])


class Uint8Normalize(nn.Module):
    """uint8 batch (B, 3, H, W) -> float32, normalised exactly as ``ToTensor`` + ``Normalize``.

    A module so that mean and std live on the device once (a per-batch host-to-device copy of
    them would make the host wait for the GPU).
    """

    mean: Tensor
    std: Tensor

    def __init__(self, backbone: str = "resnet50", preprocess: str | Preprocess = "native"):
        super().__init__()
        chosen = resolve_preprocess(backbone, preprocess)
        self.register_buffer("mean", torch.tensor(chosen.mean, dtype=torch.float32).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(chosen.std, dtype=torch.float32).view(-1, 1, 1))

    def forward(self, batch: Tensor) -> Tensor:
        # Same operations in the same order as torchvision's to_tensor and normalize.
        return batch.to(torch.float32).div(255).sub_(self.mean).div_(self.std)


def transform_description(image_size: int, backbone: str = "resnet50", decode: str = "pil",
                          preprocess: str | Preprocess = "native") -> dict:
    """The evaluation transform as data, recorded in features files and compared on resume;
    ``decode`` is ``pil`` (the reference's way), ``pil-draft`` (``--jpeg-draft``) or ``device``
    (``--gpu-decode``)."""
    return resolve_preprocess(backbone, preprocess).describe(image_size, decode)


def preprocess_mode(description: dict, backbone: str, image_size: int) -> str | None:
    """Which ``--preprocess`` mode made a recorded transform, whichever decoder it records
    (:func:`~featcache.backbones.decoders.recorded_decoder`); None: neither mode."""
    decode = recorded_decoder(description) or "pil"
    for mode in PREPROCESS_MODES:
        if transform_description(image_size, backbone, decode, mode) == description:
            return mode
    return None
