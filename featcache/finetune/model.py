"""The network stage three trains: stage one's backbone trunk with a head of the loss's kind on
top (:class:`featcache.heads.HeadModule`: a linear head on the pooled features, or a head on the
trunk's feature map: BoostLU's, or IGNORE's CAM head, whose class activation maps its masked
pass reads), computed by the same head implementation as stage two's."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from featcache.backbones import Trunk
from featcache.heads import HeadModule


class FinetuneNet(nn.Module):
    """Normalised images (B, 3, H, W) -> logits (B, L): ``head(trunk(x))``.

    The trunk is :func:`featcache.backbones.create_backbone`'s module, the one whose
    pooled output stage one cached, so a LinearInit head sees exactly the features it was
    trained on; a head that reads maps gets the trunk's ``feature_map``. The head runs in
    float32 even under autocast (the logits feed the loss, which is computed in float32; the
    head is a tiny part of the work).
    """

    def __init__(self, trunk: Trunk, head: HeadModule):
        super().__init__()
        self.trunk = trunk
        self.head = head
        self.spatial = head.kind.spatial

    def forward(self, x: Tensor, cam: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, L); with ``cam``, (the class activation maps (B, L, h, w), the logits
        they pool to)."""
        features = self.trunk.feature_map(x) if self.spatial else self.trunk(x)
        with torch.autocast(x.device.type, enabled=False):
            if cam:
                return self.head.cam_and_logits(features.float())
            return self.head(features.float())


def build_net(trunk: Trunk, head: HeadModule) -> FinetuneNet:
    """A trainable copy of ``trunk`` (left untouched, so every configuration starts alike)."""
    trunk = copy.deepcopy(trunk)
    for parameter in trunk.parameters():
        parameter.requires_grad_(True)
    return FinetuneNet(trunk, head)
