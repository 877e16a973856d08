"""The open_clip family: image towers (CLIP, SigLIP), their specs and their text towers.

The image trunk is the tower's ``encode_image`` output, unnormalised: the joint embedding
(after CLIP's projection), so that the same cached feature trains linear heads and, normalised,
gives the cosine with the class prompts' text embeddings (:class:`TextTower`). OpenAI weights
are used with open_clip's ``-quickgelu`` model names: open_clip 3 builds GELU blocks for
``ViT-B-16`` + ``openai`` and only warns.

CLIP's vision transformer runs attention through ``nn.MultiheadAttention`` with
``need_weights=False``. In inference PyTorch would take its "fast path" there (a fused kernel
that, on the CPU at least, computes attention with its own softmax); :func:`sdpa_attention`
turns it off around the towers' forward passes, so that attention always goes through
``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on a GPU). SigLIP's tower is
a timm ViT (fused attention). Weights come from a file (``pretrained=PATH``: open_clip's own loader,
which resizes position embeddings for another input size); nothing is downloaded. open_clip
itself is imported only when a spec's tags are listed or a tower is built.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from featcache.backbones.family import BackboneSpec, Trunk
from featcache.backbones.hubweights import HubFamily
from featcache.backbones.preprocess import CLIP_MEAN, CLIP_STD, HALF, Preprocess
from featcache.backbones.weightsource import WeightsSource
from featcache.errors import InputError

HUB_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
CONFIGS = Path(__file__).with_name("configs")

#: OpenAI CLIP's (and open_clip's ``openai`` tags'): shorter side to s, centre crop
_CLIP = Preprocess("center", 1.0, "bicubic", CLIP_MEAN, CLIP_STD)
#: SigLIP ``webli``: squash to s x s, bicubic, mean = std = 0.5
_SIGLIP = Preprocess("squash", 1.0, "bicubic", HALF, HALF)


@contextmanager
def sdpa_attention():
    """``nn.MultiheadAttention``'s inference fast path off: attention through
    ``F.scaled_dot_product_attention`` (the previous setting is restored)."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


class ClipTrunk(Trunk):
    """An open_clip image tower: ``encode_image`` (B, E) and :meth:`feature_map` (B, E, h, w).

    ``pooling`` is ``token`` (CLIP: the class token after ``ln_post``, projected; the map is
    the patch tokens after ``ln_post`` through the same projection, as MaskCLIP does) or ``map``
    (SigLIP: attention pooling; the map is the patch tokens after the final norm).
    """

    visual: Any  # open_clip's VisionTransformer, or a TimmModel (SigLIP)

    def __init__(self, visual: nn.Module, pooling: str):
        super().__init__()
        self.visual = visual
        self.pooling = pooling

    def forward(self, x: Tensor) -> Tensor:
        with sdpa_attention():
            return self.visual(x).float()

    def feature_map(self, x: Tensor) -> Tensor:
        """(B, E, h, w): the patch tokens in the pooled feature's space."""
        with sdpa_attention():
            return self._feature_map(x)

    def _feature_map(self, x: Tensor) -> Tensor:
        if hasattr(self.visual, "trunk"):  # a timm tower (SigLIP)
            trunk = self.visual.trunk
            tokens = trunk.forward_features(x)[:, trunk.num_prefix_tokens:]
            height, width = trunk.patch_embed.dynamic_feat_size(x.shape[-2:])
        else:
            out = self.visual.forward_intermediates(x, indices=1, normalize_intermediates=True,
                                                    intermediates_only=True, output_fmt="NLC")
            tokens = out["image_intermediates"][0]
            if self.visual.proj is not None:
                tokens = tokens @ self.visual.proj
            height, width = (x.shape[-2] // self.visual.patch_size[0],
                             x.shape[-1] // self.visual.patch_size[1])
        return tokens.reshape(x.shape[0], height, width, -1).permute(0, 3, 1, 2)


class TextTower(nn.Module):
    """An open_clip text tower with its tokenizer: prompts -> embeddings (P, E), unnormalised."""

    model: Any  # an open_clip model: encode_text

    def __init__(self, model: nn.Module, tokenizer):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer

    @torch.inference_mode()
    def forward(self, prompts: list[str]) -> Tensor:
        device = next(self.model.parameters()).device
        with sdpa_attention():
            return self.model.encode_text(self.tokenizer(prompts).to(device)).float()


class OpenClipFamily(HubFamily):
    """open_clip's CLIP and SigLIP towers; weights in the tag's Hugging Face hub repository."""

    name = "open_clip"
    package = "open_clip_torch"

    def specs(self) -> tuple[BackboneSpec, ...]:
        return (
            self.spec("clip-vit-b16", "ViT-B-16-quickgelu", "openai", 512, _CLIP, 224, 16,
                      "token", "OpenAI CLIP ViT-B/16 image tower (open_clip); AEVLP's CLIP",
                      has_text=True),
            self.spec("clip-vit-l14", "ViT-L-14-quickgelu", "openai", 768, _CLIP, 224, 14,
                      "token", "OpenAI CLIP ViT-L/14 image tower (open_clip)", has_text=True),
            self.spec("clip-vit-l14-336", "ViT-L-14-336-quickgelu", "openai", 768, _CLIP, 336,
                      14, "token", "OpenAI CLIP ViT-L/14 at 336 px (open_clip); VLPL's CLIP",
                      has_text=True),
            self.spec("siglip-vit-b16", "ViT-B-16-SigLIP", "webli", 768, _SIGLIP, 224, 16,
                      "map", "SigLIP ViT-B/16 image tower (open_clip, WebLI)", has_text=True),
            # A tiny random network for tests and offline demos (featcache's own config).
            self.spec("test-clip", "featcache-test-clip", "random", 32, _CLIP, 64, 16,
                      "token", "a tiny CLIP (2 layers, 32-d embedding; no published weights)",
                      has_text=True, testing=True),
        )

    def require(self, spec: BackboneSpec):
        """open_clip, with featcache's test model configs added."""
        open_clip = super().require(spec)
        if spec.model not in open_clip.list_models() and (CONFIGS / f"{spec.model}.json").is_file():
            open_clip.add_model_config(CONFIGS / f"{spec.model}.json")  # featcache's test configs
        return open_clip

    def tags(self, spec: BackboneSpec) -> list[str]:
        """The pretrained tags open_clip knows for ``spec.model``."""
        return list(self.require(spec).list_pretrained_tags_by_model(spec.model))

    def hub_files(self, spec: BackboneSpec, tag: str) -> tuple[str, tuple[str, ...]]:
        cfg = self.require(spec).get_pretrained_cfg(spec.model, tag) or {}
        hub = str(cfg.get("hub") or cfg.get("hf_hub") or "")
        if not hub:
            raise InputError(f"open_clip has no Hugging Face hub copy of {spec.model} weights {tag!r}; "
                             "pass --weights /path/to/the/checkpoint")
        parts = hub.rstrip("/").split("/")
        repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
        return repo, ((filename,) if filename else HUB_FILES)

    def create_model(self, spec: BackboneSpec, image_size: int, path: Path | None = None):
        """The whole open_clip model (both towers), random (``path`` None) or loaded from ``path``."""
        open_clip = self.require(spec)
        kwargs = dict(spec.model_kwargs)
        if image_size:
            kwargs["force_image_size"] = image_size
        quiet = logging.getLogger()
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # "No pretrained weights loaded ... initialized randomly"
        try:
            return open_clip.create_model(spec.model, pretrained=None if path is None else str(path),
                                          **kwargs).eval()
        finally:
            quiet.setLevel(level)

    def build(self, spec: BackboneSpec, image_size: int, source: WeightsSource | None) -> ClipTrunk:
        """The image trunk of ``spec`` for ``image_size`` inputs."""
        model = self.create_model(spec, image_size, None if source is None else source.path)
        return ClipTrunk(model.visual, spec.pooling)

    def build_text(self, spec: BackboneSpec, path: Path | None = None,
                   image_size: int = 0) -> TextTower:
        """The text tower of ``spec`` (same weights file as the image trunk) and its tokenizer."""
        open_clip = self.require(spec)
        try:
            tokenizer = open_clip.get_tokenizer(spec.model)
        except (ImportError, OSError) as exc:
            raise InputError(
                f"the tokenizer of {spec.name} ({spec.model}) is not available offline: {exc}. "
                "SigLIP's tokenizer needs `pip install transformers` and its files in the Hugging "
                "Face cache; or give precomputed class embeddings with --text-embeddings FILE.npy"
            ) from exc
        model = self.create_model(spec, image_size, path)
        model.visual = nn.Identity()  # only the text tower is kept
        return TextTower(model, tokenizer).eval()


FAMILY = OpenClipFamily()
