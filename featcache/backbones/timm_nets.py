"""timm backbones (ViT, ConvNeXt, DINOv2): build, load a weights file, cut to pooled features.

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
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn

from featcache.backbones.hub import require

HUB_FILES = ("model.safetensors", "pytorch_model.bin")


def full_name(spec, tag: str | None) -> str:
    """``model.tag`` (timm's name of one set of pretrained weights)."""
    return f"{spec.model}.{tag}" if tag else spec.model


def tags(spec) -> list[str]:
    """The pretrained tags timm knows for ``spec.model``."""
    timm = require("timm", spec.name)
    names = timm.list_pretrained(f"{spec.model}.*")
    return [n.split(".", 1)[1] for n in names if n.split(".", 1)[0] == spec.model]


def hub_files(spec, tag: str) -> tuple[str, tuple[str, ...]]:
    """(hub repository, file names tried in order) of pretrained weights ``tag``."""
    timm = require("timm", spec.name)
    cfg = timm.models.get_pretrained_cfg(full_name(spec, tag))
    repo = getattr(cfg, "hf_hub_id", None) or f"timm/{full_name(spec, tag)}"
    return repo, HUB_FILES


class TimmTrunk(nn.Module):
    """A timm model without its classifier: pooled features (B, D), and :meth:`feature_map`.

    The model keeps timm's parameter names under ``model.``. ``pooling`` says how the pooled
    feature relates to the map: ``token`` (ViT/DINOv2: the class token; the map is the patch
    tokens after the final norm), ``avg+norm`` (ConvNeXt: LayerNorm of the average of the last
    stage; the map is that stage normalised per position).
    """

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


def build(spec, image_size: int, path: Path | None = None, tag: str | None = None) -> TimmTrunk:
    """The trunk of ``spec`` for ``image_size`` inputs: random weights (``path`` None; seed the
    global generator first) or the weights in ``path`` (tag ``tag``'s pretrained config)."""
    timm = require("timm", spec.name)
    kwargs = dict(spec.model_kwargs)
    if spec.patch_size:
        kwargs["img_size"] = image_size
    if path is None:
        model = timm.create_model(spec.model, pretrained=False, num_classes=0, **kwargs)
    else:
        model = timm.create_model(full_name(spec, tag), pretrained=True, num_classes=0,
                                  pretrained_cfg_overlay={"file": str(path)}, **kwargs)
    return TimmTrunk(model, spec.pooling)
