"""Backbones shared by the stages: the registry (``create_backbone``), their weights found
offline, their preprocessing, and how a dataset image becomes their input.

Stage one caches a backbone's pooled output; stage three fine-tunes the same module with a
linear head on top; prediction runs it on new images. Modules: ``registry`` (specs and the
factory), ``preprocess`` (resize/crop policies and normalisation), ``transforms`` (the image
transforms built from them), ``weights`` (``--weights`` resolved offline), ``hub`` (the
optional timm/open_clip libraries and the Hugging Face cache), ``torchvision_nets``,
``timm_nets`` and ``openclip_nets`` (each library's trunks; CLIP's text tower), ``inputs``
(image datasets for DataLoaders and the on-device JPEG decoder).
"""

from featcache.backbones.preprocess import PROTOCOL, Preprocess, described_image_size  # noqa: F401
from featcache.backbones.registry import (  # noqa: F401
    BackboneSpec,
    backbone_names,
    backbone_spec,
    create_backbone,
    register_backbone,
)
from featcache.backbones.transforms import (  # noqa: F401
    Uint8Normalize,
    image_transform,
    preprocess_mode,
    resize_transform,
    resolve_preprocess,
    transform_description,
)
