"""The timm family (ViT, ConvNeXt, DINOv2): its specs, build, load a weights file, cut to pooled
features.

A timm model built with ``num_classes=0`` maps images to its pooled features with
``forward_head(forward_features(x), pre_logits=True)``: the class token after the final norm
for ViT and DINOv2 (``global_pool='token'``), average pooling then LayerNorm for ConvNeXt.
ViTs are built for the requested input size (``img_size``: a fixed position embedding, which
timm resamples once when it loads weights made for another size). Attention runs through
``F.scaled_dot_product_attention`` (timm's ``fused_attn``, on by default;
``TIMM_FUSED_ATTN=0`` turns it off).

Weights are loaded from a file through timm's own pretrained path
(``pretrained_cfg_overlay=dict(file=...)``): its checkpoint filter converts the original
checkpoints, drops the classifier and resamples position embeddings; nothing is downloaded.
timm itself is imported only when a spec's tags are listed or a trunk is built.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from featcache.backbones.family import BackboneSpec, Trunk
from featcache.backbones.hubweights import HubFamily, pretrained_tag
from featcache.backbones.preprocess import HALF, IMAGENET_MEAN, IMAGENET_STD, Preprocess
from featcache.backbones.weightsource import WeightsSource

HUB_FILES = ("model.safetensors", "pytorch_model.bin")

#: timm's evaluation transforms (``pretrained_cfg``: crop_pct, bicubic, mean/std)
_TIMM_VIT = Preprocess("center", 0.9, "bicubic", HALF, HALF)
_TIMM_CONVNEXT = Preprocess("center", 0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
_TIMM_TEST = Preprocess("center", 0.95, "bicubic", HALF, HALF)
#: DINOv2's linear evaluation (``make_classification_eval_transform``: resize 256, crop 224)
_DINOV2 = Preprocess("center", 0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD)


def full_name(spec: BackboneSpec, tag: str | None) -> str:
    """``model.tag`` (timm's name of one set of pretrained weights)."""
    return f"{spec.model}.{tag}" if tag else spec.model


class TimmTrunk(Trunk):
    """A timm model without its classifier: pooled features (B, D), and :meth:`feature_map`.

    The model keeps timm's parameter names under ``model.``. ``pooling`` says how the pooled
    feature relates to the map: ``token`` (ViT/DINOv2: the class token; the map is the patch
    tokens after the final norm), ``avg+norm`` (ConvNeXt: LayerNorm of the average of the last
    stage; the map is that stage normalised per position).
    """

    model: Any  # a timm model: forward_features, forward_head, patch_embed, ...

    def __init__(self, model: nn.Module, pooling: str):
        super().__init__()
        self.model = model
        self.pooling = pooling

    def forward(self, x: Tensor) -> Tensor:
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True).float()

    def feature_map(self, x: Tensor) -> Tensor:
        """(B, D, h, w) features in the pooled feature's space, one per patch or position."""
        features = self.model.forward_features(x)
        if features.dim() == 4:  # a convolutional net: NCHW
            norm = getattr(getattr(self.model, "head", None), "norm", None)
            return norm(features) if norm is not None else features
        tokens = features[:, self.model.num_prefix_tokens:]
        height, width = self.model.patch_embed.dynamic_feat_size(x.shape[-2:])
        return tokens.reshape(x.shape[0], height, width, -1).permute(0, 3, 1, 2)


class TimmFamily(HubFamily):
    """timm's image models; weights ``timm/<model>.<tag>`` in the Hugging Face hub cache."""

    name = "timm"
    package = "timm"

    def specs(self) -> tuple[BackboneSpec, ...]:
        return (
            self.spec("vit-b16", "vit_base_patch16_224", "augreg2_in21k_ft_in1k", 768, _TIMM_VIT,
                      224, 16, "token", "timm ViT-B/16, ImageNet-21k then 1k (AugReg2)"),
            self.spec("convnext-b", "convnext_base", "fb_in22k_ft_in1k", 1024, _TIMM_CONVNEXT,
                      224, 0, "avg+norm", "timm ConvNeXt-B, ImageNet-22k then 1k"),
            self.spec("dinov2-vit-b14", "vit_base_patch14_dinov2", "lvd142m", 768, _DINOV2,
                      224, 14, "token", "DINOv2 ViT-B/14 (timm), self-supervised on LVD-142M"),
            self.spec("dinov2-vit-l14", "vit_large_patch14_dinov2", "lvd142m", 1024, _DINOV2,
                      224, 14, "token", "DINOv2 ViT-L/14 (timm), self-supervised on LVD-142M"),
            # Tiny random networks for tests and offline demos (timm's own test_* models).
            self.spec("test-vit", "test_vit", "r160_in1k", 64, _TIMM_TEST, 160, 16, "token",
                      "timm's test ViT (0.3 M parameters)", testing=True),
            self.spec("test-convnext", "test_convnext", "r160_in1k", 64, _TIMM_TEST, 160, 0,
                      "avg+norm", "timm's test ConvNeXt (0.2 M parameters)", testing=True),
        )

    def tags(self, spec: BackboneSpec) -> list[str]:
        """The pretrained tags timm knows for ``spec.model``."""
        timm = self.require(spec)
        names = timm.list_pretrained(f"{spec.model}.*")
        return [n.split(".", 1)[1] for n in names if n.split(".", 1)[0] == spec.model]

    def hub_files(self, spec: BackboneSpec, tag: str) -> tuple[str, tuple[str, ...]]:
        timm = self.require(spec)
        cfg = timm.models.get_pretrained_cfg(full_name(spec, tag))
        repo = getattr(cfg, "hf_hub_id", None) or f"timm/{full_name(spec, tag)}"
        return repo, HUB_FILES

    def build(self, spec: BackboneSpec, image_size: int, source: WeightsSource | None) -> TimmTrunk:
        """The trunk for ``image_size`` inputs: random weights (seed the global generator first)
        or the source's file (a pretrained tag's config, else the model's)."""
        timm = self.require(spec)
        kwargs = dict(spec.model_kwargs)
        if spec.patch_size:
            kwargs["img_size"] = image_size
        if source is None or source.path is None:
            model = timm.create_model(spec.model, pretrained=False, num_classes=0, **kwargs)
        else:
            model = timm.create_model(full_name(spec, pretrained_tag(source)), pretrained=True,
                                      num_classes=0,
                                      pretrained_cfg_overlay={"file": str(source.path)}, **kwargs)
        return TimmTrunk(model, spec.pooling)


FAMILY = TimmFamily()
