"""Backbones shared by the stages: the registry (``create_backbone``), their weights found
offline, and how a dataset image becomes their input.

Stage one caches a backbone's pooled output; stage three fine-tunes the same module with a
linear head on top; prediction runs it on new images. Modules: ``registry`` (specs, trunks,
transforms), ``weights`` (``--weights v1|v2|random|PATH`` resolved offline), ``inputs`` (image
datasets for DataLoaders and the on-device JPEG decoder).
"""

from featcache.backbones.registry import (  # noqa: F401
    BackboneSpec,
    Uint8Normalize,
    backbone_names,
    backbone_spec,
    create_backbone,
    image_transform,
    register_backbone,
    resize_transform,
    transform_description,
)
