"""The registry of backbones that map a normalised image batch to pooled features, and the
factory that builds them.

A registry in the style of timm: :func:`create_backbone` builds a registered network with the
requested weights and returns its *trunk*: ``(B, 3, H, W) -> (B, D)`` pooled features, plus
``feature_map(x)``, the spatial features ``(B, D, h, w)`` the pooled output summarises. Stage
one caches the trunk's output; stage three puts a linear head on the same module. Each library
is a family (:class:`~featcache.backbones.family.BackboneFamily`), found in the package's
``*_nets`` modules: ``torchvision`` (ResNets: the papers' ResNet-50), always installed;
``timm`` (ViT-B/16, ConvNeXt, DINOv2) and ``open_clip`` (CLIP and SigLIP image towers, with
their text towers), the ``backbones`` extra (``pip install featcache[backbones]``).

Each :class:`~featcache.backbones.family.BackboneSpec` declares its feature width, its
preprocessing (resize policy, interpolation, normalisation:
:mod:`featcache.backbones.preprocess`), its default input size, its weights (torchvision's
enum, or the library's pretrained tags found in the Hugging Face cache:
:mod:`featcache.backbones.weights`) and how its pooled feature relates to its map
(``pooling``). The registry holds every family's specs; adding a backbone is one spec in its
family's ``specs()`` (or a :func:`register_backbone` call); the image transforms built from a
backbone's preprocessing are in :mod:`featcache.backbones.transforms`.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from featcache.backbones.family import DEFAULT_IMAGE_SIZE, BackboneSpec, Trunk, families
from featcache.backbones.weights import WeightsSource, resolve_weights
from featcache.backbones.weightsource import RANDOM
from featcache.errors import FeatcacheError, InputError, OptionError, unknown_name

__all__ = ["DEFAULT_IMAGE_SIZE", "BackboneSpec", "backbone_names", "backbone_spec",
           "create_backbone", "create_text_tower", "register_backbone", "state_sha256"]

_REGISTRY: dict[str, BackboneSpec] = {
    spec.name: spec for family in families() for spec in family.specs()
}


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    """Add (or replace) a backbone in the registry; returns ``spec``."""
    _REGISTRY[spec.name] = spec
    return spec


def backbone_names(testing: bool = True) -> list[str]:
    """Names accepted by ``--backbone`` (without the tiny test networks when ``testing`` is False)."""
    return sorted(name for name, spec in _REGISTRY.items() if testing or not spec.testing)


def backbone_spec(name: str) -> BackboneSpec:
    """The registry entry of ``name``; an OptionError lists the choices."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError(unknown_name("backbone", name, backbone_names(testing=False),
                                       listing="`featcache backbones` lists them")) from None


def create_backbone(name: str = "resnet50", weights: str | WeightsSource | None = None,
                    seed: int = 0, image_size: int | None = None) -> Trunk:
    """Build backbone ``name`` with ``weights`` in eval mode on the CPU.

    ``weights``: ``None`` (the entry's default: ``v1`` for ResNets, the library's pretrained
    tag otherwise), ``random``, a torchvision alias or library tag, a file path, or a resolved
    :class:`~featcache.backbones.weights.WeightsSource`. ``image_size`` (default: the entry's)
    matters to vision transformers, whose position embedding is built for it. The module maps
    a normalised batch ``(B, 3, s, s)`` to pooled features ``(B, dim)``; ``feature_map(x)``
    gives ``(B, dim, h, w)``. Attributes: ``weights_identity`` (recorded in features files),
    ``pooling`` and ``image_size``. ``seed`` fixes the initialisation of ``random`` weights.
    """
    spec = backbone_spec(name)
    image_size = image_size or spec.default_image_size
    spec.check_image_size(image_size)
    source = weights if isinstance(weights, WeightsSource) else resolve_weights(spec, weights, seed)
    if source.kind == RANDOM:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(source.seed)
            trunk = spec.family.build(spec, image_size, None)
        identity = dict(source.identity(), weights_sha256=state_sha256(trunk))
    else:
        try:
            trunk = spec.family.build(spec, image_size, source)
        except FeatcacheError:  # torchvision's checkpoint checks name the keys already
            raise
        except (RuntimeError, KeyError, ValueError) as exc:  # the libraries' load errors
            raise _does_not_fit(spec, source, exc) from exc
        identity = source.identity()
    trunk.weights_identity = identity
    trunk.pooling = getattr(trunk, "pooling", spec.pooling)
    trunk.image_size = image_size
    return trunk.eval()


def create_text_tower(name: str, weights: str | WeightsSource | None = None, seed: int = 0,
                      image_size: int | None = None) -> nn.Module:
    """The text tower of a vision-language backbone (``has_text``), with the same weights as
    :func:`create_backbone`'s image trunk (random weights: the same seed and ``image_size`` give
    the text tower of the same random model): ``tower(prompts) -> (P, E)`` unnormalised."""
    spec = backbone_spec(name)
    if not spec.has_text:
        with_text = ", ".join(n for n in backbone_names(testing=False) if _REGISTRY[n].has_text)
        raise OptionError(f"backbone {name!r} has no text tower; class-prompt embeddings need a "
                          f"vision-language backbone: {with_text}")
    source = weights if isinstance(weights, WeightsSource) else resolve_weights(spec, weights, seed)
    if source.kind == RANDOM:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(source.seed)
            return spec.family.build_text(spec, None, image_size or spec.default_image_size)
    try:
        return spec.family.build_text(spec, source.path)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise _does_not_fit(spec, source, exc) from exc


def _does_not_fit(spec: BackboneSpec, source: WeightsSource, exc: Exception) -> InputError:
    return InputError(f"weights file {source.path} does not fit the {spec.name} backbone "
                      f"({spec.library} {spec.model}): {str(exc).splitlines()[0]}")


def state_sha256(module: nn.Module) -> str:
    """sha256 over a module's state dict (names, dtypes, shapes and bytes, in order)."""
    digest = hashlib.sha256()
    for key, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
