"""The registry of backbones that map a normalised image batch to pooled features, and the
factory that builds them.

A registry in the style of timm: :func:`create_backbone` builds a registered network with the
requested weights and returns its *trunk*: ``(B, 3, H, W) -> (B, D)`` pooled features, plus
``feature_map(x)``, the spatial features ``(B, D, h, w)`` the pooled output summarises. Stage
one caches the trunk's output; stage three puts a linear head on the same module. Three
libraries provide networks:

- ``torchvision`` (ResNets: the papers' ResNet-50), always installed;
- ``timm`` (ViT-B/16, ConvNeXt, DINOv2) and ``open_clip`` (CLIP and SigLIP image towers, with
  their text towers), the ``backbones`` extra (``pip install featcache[backbones]``).

Each :class:`BackboneSpec` declares its feature width, its preprocessing (resize policy,
interpolation, normalisation: :mod:`featcache.backbones.preprocess`), its default input size,
its weights (torchvision's enum, or the library's pretrained tags found in the Hugging Face
cache: :mod:`featcache.backbones.weights`) and how its pooled feature relates to its map
(``pooling``). Adding a backbone is one entry in ``_REGISTRY`` (or a :func:`register_backbone`
call). Each library is a family module that builds and loads its trunks:
:mod:`~featcache.backbones.torchvision_nets`, :mod:`~featcache.backbones.timm_nets` and
:mod:`~featcache.backbones.openclip_nets`; the image transforms built from a backbone's
preprocessing are in :mod:`featcache.backbones.transforms`.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torchvision
from torch import nn

from featcache.backbones.preprocess import (
    CLIP_MEAN,
    CLIP_STD,
    HALF,
    IMAGENET_MEAN,
    IMAGENET_STD,
    PROTOCOL,
    Preprocess,
)
from featcache.backbones.torchvision_nets import ResNetTrunk
from featcache.errors import FeatcacheError, InputError, OptionError, unknown_name

DEFAULT_IMAGE_SIZE = 448
LIBRARIES = ("torchvision", "timm", "open_clip")
_FAMILY_MODULES = {"torchvision": "featcache.backbones.torchvision_nets",
                   "timm": "featcache.backbones.timm_nets",
                   "open_clip": "featcache.backbones.openclip_nets"}


@dataclass(frozen=True)
class BackboneSpec:
    """What featcache needs to know about one backbone.

    torchvision entries: ``build`` makes the network with random weights, ``trunk`` cuts it
    down to pooled features, ``weights_enum`` is torchvision's weights enum (its urls name the
    checkpoint files) and ``weights_aliases`` maps short names (``v1``) to its members.
    timm and open_clip entries: ``model`` is the library's model name and ``default_weights``
    its pretrained tag (``augreg2_in21k_ft_in1k``, ``openai``, ...; ``random`` for entries
    without published weights); ``model_kwargs`` go to the library's constructor.

    Every entry: ``dim`` (pooled width), ``preprocess`` (its evaluation transform),
    ``default_image_size``, ``patch_size`` (0, or the patch size the input size must be a
    multiple of), ``pooling`` (``avg``: the pooled feature is the average of
    ``feature_map``; ``token``/``map``: a class token or attention pooling, the map being the
    patch tokens; ``avg+norm``: a norm after the average), ``channels_last`` (whether that
    memory layout speeds it up), ``has_text`` (a text tower for class prompts).
    """

    name: str
    dim: int
    build: Callable[[], nn.Module] | None = None
    weights_enum: type | None = None
    weights_aliases: Mapping[str, str] = field(default_factory=dict)
    default_weights: str = "v1"
    trunk: Callable[[nn.Module], nn.Module] = ResNetTrunk
    library: str = "torchvision"
    model: str = ""
    preprocess: Preprocess = PROTOCOL
    default_image_size: int = DEFAULT_IMAGE_SIZE
    patch_size: int = 0
    pooling: str = "avg"
    channels_last: bool = True
    has_text: bool = False
    model_kwargs: Mapping[str, object] = field(default_factory=dict)
    summary: str = ""
    testing: bool = False

    @property
    def mean(self) -> tuple[float, float, float]:
        return self.preprocess.mean

    @property
    def std(self) -> tuple[float, float, float]:
        return self.preprocess.std

    @property
    def family(self):
        """The module that builds this entry's library's trunks (imported on first use)."""
        return importlib.import_module(_FAMILY_MODULES[self.library])

    def weights_member(self, alias: str):
        """The torchvision weights enum member for ``alias`` (``v1`` or a member name), or None."""
        if self.weights_enum is None:
            return None
        member_name = self.weights_aliases.get(alias.lower(), alias.upper())
        return getattr(self.weights_enum, member_name, None)

    def weights_names(self) -> list[str]:
        """Names accepted by ``--weights`` besides ``random`` and a path."""
        return self.family.tags(self)

    def check_image_size(self, image_size: int) -> None:
        """OptionError when this backbone cannot take ``image_size`` x ``image_size`` inputs."""
        if self.patch_size and image_size % self.patch_size:
            lower = image_size - image_size % self.patch_size
            raise OptionError(f"--image-size {image_size} is not a multiple of {self.name}'s patch "
                              f"size {self.patch_size}; use {lower} or {lower + self.patch_size}")


def _resnet(name: str, dim: int, weights_enum: type) -> BackboneSpec:
    return BackboneSpec(
        name=name, dim=dim, build=getattr(torchvision.models, name), weights_enum=weights_enum,
        weights_aliases={"v1": "IMAGENET1K_V1", "v2": "IMAGENET1K_V2"},
        summary="torchvision ImageNet ResNet; the protocol's transform",
    )


def _hub(library: str, name: str, model: str, weights: str, dim: int, preprocess: Preprocess,
         image_size: int, patch_size: int, pooling: str, summary: str, **extra) -> BackboneSpec:
    return BackboneSpec(
        name=name, dim=dim, library=library, model=model, default_weights=weights,
        preprocess=preprocess, default_image_size=image_size, patch_size=patch_size,
        pooling=pooling, channels_last=not patch_size, summary=summary, **extra,
    )


#: timm's evaluation transforms (``pretrained_cfg``: crop_pct, bicubic, mean/std)
_TIMM_VIT = Preprocess("center", 0.9, "bicubic", HALF, HALF)
_TIMM_CONVNEXT = Preprocess("center", 0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
_TIMM_TEST = Preprocess("center", 0.95, "bicubic", HALF, HALF)
#: DINOv2's linear evaluation (``make_classification_eval_transform``: resize 256, crop 224)
_DINOV2 = Preprocess("center", 0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
#: OpenAI CLIP's (and open_clip's ``openai`` tags'): shorter side to s, centre crop
_CLIP = Preprocess("center", 1.0, "bicubic", CLIP_MEAN, CLIP_STD)
#: SigLIP ``webli``: squash to s x s, bicubic, mean = std = 0.5
_SIGLIP = Preprocess("squash", 1.0, "bicubic", HALF, HALF)

_REGISTRY: dict[str, BackboneSpec] = {
    spec.name: spec
    for spec in (
        _resnet("resnet50", 2048, torchvision.models.ResNet50_Weights),
        _resnet("resnet101", 2048, torchvision.models.ResNet101_Weights),
        _resnet("resnet18", 512, torchvision.models.ResNet18_Weights),
        _hub("timm", "vit-b16", "vit_base_patch16_224", "augreg2_in21k_ft_in1k", 768, _TIMM_VIT,
             224, 16, "token", "timm ViT-B/16, ImageNet-21k then 1k (AugReg2)"),
        _hub("timm", "convnext-b", "convnext_base", "fb_in22k_ft_in1k", 1024, _TIMM_CONVNEXT,
             224, 0, "avg+norm", "timm ConvNeXt-B, ImageNet-22k then 1k"),
        _hub("timm", "dinov2-vit-b14", "vit_base_patch14_dinov2", "lvd142m", 768, _DINOV2,
             224, 14, "token", "DINOv2 ViT-B/14 (timm), self-supervised on LVD-142M"),
        _hub("timm", "dinov2-vit-l14", "vit_large_patch14_dinov2", "lvd142m", 1024, _DINOV2,
             224, 14, "token", "DINOv2 ViT-L/14 (timm), self-supervised on LVD-142M"),
        _hub("open_clip", "clip-vit-b16", "ViT-B-16-quickgelu", "openai", 512, _CLIP, 224, 16,
             "token", "OpenAI CLIP ViT-B/16 image tower (open_clip); AEVLP's CLIP",
             has_text=True),
        _hub("open_clip", "clip-vit-l14", "ViT-L-14-quickgelu", "openai", 768, _CLIP, 224, 14,
             "token", "OpenAI CLIP ViT-L/14 image tower (open_clip)", has_text=True),
        _hub("open_clip", "clip-vit-l14-336", "ViT-L-14-336-quickgelu", "openai", 768, _CLIP, 336,
             14, "token", "OpenAI CLIP ViT-L/14 at 336 px (open_clip); VLPL's CLIP",
             has_text=True),
        _hub("open_clip", "siglip-vit-b16", "ViT-B-16-SigLIP", "webli", 768, _SIGLIP, 224, 16,
             "map", "SigLIP ViT-B/16 image tower (open_clip, WebLI)", has_text=True),
        # Tiny random networks for tests and offline demos (like timm's own test_* models).
        _hub("timm", "test-vit", "test_vit", "r160_in1k", 64, _TIMM_TEST, 160, 16, "token",
             "timm's test ViT (0.3 M parameters)", testing=True),
        _hub("timm", "test-convnext", "test_convnext", "r160_in1k", 64, _TIMM_TEST, 160, 0,
             "avg+norm", "timm's test ConvNeXt (0.2 M parameters)", testing=True),
        _hub("open_clip", "test-clip", "featcache-test-clip", "random", 32, _CLIP, 64, 16,
             "token", "a tiny CLIP (2 layers, 32-d embedding; no published weights)",
             has_text=True, testing=True),
    )
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


def create_backbone(name: str = "resnet50", weights=None, seed: int = 0,
                    image_size: int | None = None) -> nn.Module:
    """Build backbone ``name`` with ``weights`` in eval mode on the CPU.

    ``weights``: ``None`` (the entry's default: ``v1`` for ResNets, the library's pretrained
    tag otherwise), ``random``, a torchvision alias or library tag, a file path, or a resolved
    :class:`~featcache.backbones.weights.WeightsSource`. ``image_size`` (default: the entry's)
    matters to vision transformers, whose position embedding is built for it. The module maps
    a normalised batch ``(B, 3, s, s)`` to pooled features ``(B, dim)``; ``feature_map(x)``
    gives ``(B, dim, h, w)``. Attributes: ``weights_identity`` (recorded in features files),
    ``pooling`` and ``image_size``. ``seed`` fixes the initialisation of ``random`` weights.
    """
    from featcache.backbones.weights import WeightsSource, resolve_weights

    spec = backbone_spec(name)
    image_size = image_size or spec.default_image_size
    spec.check_image_size(image_size)
    source = weights if isinstance(weights, WeightsSource) else resolve_weights(spec, weights, seed)
    if source.kind == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(source.seed)
            trunk = spec.family.build(spec, image_size, None, None)
        identity = dict(source.identity(), weights_sha256=state_sha256(trunk))
    else:
        tag = source.name if source.kind == "hub" else None
        try:
            trunk = spec.family.build(spec, image_size, source.path, tag)
        except FeatcacheError:  # torchvision's checkpoint checks name the keys already
            raise
        except (RuntimeError, KeyError, ValueError) as exc:  # the libraries' load errors
            raise InputError(f"weights file {source.path} does not fit the {spec.name} backbone "
                             f"({spec.library} {spec.model}): {str(exc).splitlines()[0]}") from exc
        identity = source.identity()
    trunk.weights_identity = identity
    trunk.pooling = getattr(trunk, "pooling", spec.pooling)
    trunk.image_size = image_size
    return trunk.eval()


def create_text_tower(name: str, weights=None, seed: int = 0, image_size: int | None = None) -> nn.Module:
    """The text tower of a vision-language backbone (``has_text``), with the same weights as
    :func:`create_backbone`'s image trunk (random weights: the same seed and ``image_size`` give
    the text tower of the same random model): ``tower(prompts) -> (P, E)`` unnormalised."""
    from featcache.backbones.weights import WeightsSource, resolve_weights

    spec = backbone_spec(name)
    if not spec.has_text:
        with_text = ", ".join(n for n in backbone_names(testing=False) if _REGISTRY[n].has_text)
        raise OptionError(f"backbone {name!r} has no text tower; class-prompt embeddings need a "
                          f"vision-language backbone: {with_text}")
    source = weights if isinstance(weights, WeightsSource) else resolve_weights(spec, weights, seed)
    if source.kind == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(source.seed)
            return spec.family.build_text(spec, None, image_size or spec.default_image_size)
    try:
        return spec.family.build_text(spec, source.path)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise InputError(f"weights file {source.path} does not fit the {spec.name} backbone "
                         f"({spec.library} {spec.model}): {str(exc).splitlines()[0]}") from exc


def state_sha256(module: nn.Module) -> str:
    """sha256 over a module's state dict (names, dtypes, shapes and bytes, in order)."""
    digest = hashlib.sha256()
    for key, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
