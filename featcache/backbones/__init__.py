"""Backbones shared by the stages: the registry (``create_backbone``), their weights found
offline, their preprocessing, and how a dataset image becomes their input.

Stage one caches a backbone's pooled output; stage three fine-tunes the same module with a
linear head on top; prediction runs it on new images. Modules: ``family`` (``BackboneFamily``,
what a library provides; ``BackboneSpec``; ``Trunk``; the families found in this package),
``registry`` (every family's specs and the factory), ``preprocess`` (resize/crop policies and
normalisation), ``transforms`` (the image transforms built from them), ``weightsource`` and
``weights`` (``--weights`` resolved offline), ``hub`` (the optional timm/open_clip libraries
and the Hugging Face cache), ``hubweights`` (what the timm and open_clip families share), the
family modules ``torchvision_nets``, ``timm_nets`` and ``openclip_nets`` (each library's specs,
weights and trunks; CLIP's text tower), ``rebuild`` (the backbone a run needs again),
``inputs`` (image datasets for DataLoaders and the on-device JPEG decoder).

The names below load their module on first use (PEP 562), so that ``featcache.backbones.hub``
can be imported without torch (``featcache backbones`` only looks up caches).
"""

import importlib

_EXPORTS = {
    "family": ("BackboneFamily", "BackboneSpec", "Trunk", "families", "register_family"),
    "preprocess": ("PROTOCOL", "Preprocess", "described_image_size"),
    "decoders": ("DECODERS", "recorded_decoder"),
    "registry": ("backbone_names", "backbone_spec", "create_backbone", "register_backbone"),
    "transforms": ("Uint8Normalize", "image_transform", "preprocess_mode", "resize_transform",
                   "resolve_preprocess", "transform_description"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
