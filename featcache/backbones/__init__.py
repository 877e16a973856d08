"""Backbones shared by the stages: the registry (``create_backbone``), their weights found
offline, their preprocessing, and how a dataset image becomes their input.

Stage one caches a backbone's pooled output; stage three fine-tunes the same module with a
linear head on top; prediction runs it on new images. Modules: ``registry`` (specs, trunks,
transforms), ``preprocess`` (resize/crop policies and normalisation), ``weights``
(``--weights`` resolved offline), ``hub`` (the optional timm/open_clip libraries and the
Hugging Face cache), ``timm_nets`` and ``openclip_nets`` (their trunks and CLIP's text tower),
``inputs`` (image datasets for DataLoaders and the on-device JPEG decoder).
"""

from featcache.backbones.preprocess import PROTOCOL, Preprocess, described_image_size  # noqa: F401
from featcache.backbones.registry import (  # noqa: F401
    BackboneSpec,
    Uint8Normalize,
    backbone_names,
    backbone_spec,
    create_backbone,
    image_transform,
    preprocess_mode,
    register_backbone,
    resize_transform,
    resolve_preprocess,
    transform_description,
)
