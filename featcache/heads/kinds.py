"""The kinds of head a loss's logits come from: the one place that knows them, each with its one
implementation for H stacked heads (stage two trains a grid of them; stage three and the API
use H = 1). A loss names its kind (``SPMLLoss.head``); the stages, the reports and the API ask
the kind instead of comparing names.

A :class:`HeadKind` is a string (its name), so it is written and compared like one.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import torch

from featcache.heads.linear import HeadParams, LinearHeads
from featcache.heads.maps import BoostLUHeads, CamHeads, MapHeads


class HeadKind(StrEnum):
    """``linear``: a linear layer on pooled features. ``boostlu`` (Kim et al. 2023): a 1x1
    convolution over the spatial map whose positive class-activation entries are multiplied by
    the loss parameter ``alpha`` before pooling. ``cam``: a 1x1 convolution over the spatial
    map pooled by the plain mean (the linear head on the pooled feature), for losses that read
    its class activation maps (IGNORE's masked pass). The last two need spatial feature maps."""

    LINEAR = "linear"
    BOOSTLU = "boostlu"
    CAM = "cam"

    @property
    def implementation(self) -> type[LinearHeads]:
        """The class of H stacked heads of this kind (every stage's)."""
        return _IMPLEMENTATIONS[self]

    @property
    def map_implementation(self) -> type[MapHeads]:
        """The heads on maps that give this kind's class activation maps (the head applied at
        every position of a map): a linear head's are a CAM head's."""
        return _MAP_IMPLEMENTATIONS[self]

    @property
    def spatial(self) -> bool:
        """Whether this kind of head reads spatial feature maps instead of pooled features."""
        return self is not HeadKind.LINEAR

    @property
    def recorded(self) -> HeadKind:
        """The kind a trained head is recorded as (``head.kind`` of results.json and best.pt):
        how its stored weight and bias predict. A CAM head's are a linear head's (the mean of
        the map through the head is the head on the mean of the map)."""
        return HeadKind.LINEAR if self is HeadKind.CAM else self

    @property
    def trains_on(self) -> str:
        """What a loss of this kind trains, as messages say it."""
        return _TRAINS_ON[self]

    def create(self, in_features: int, out_features: int, generators: Sequence[torch.Generator],
               device: torch.device | str | None = None, *, positions: int = 1,
               params: HeadParams | None = None) -> LinearHeads:
        """Fresh trainable heads of this kind, one per generator (seeded like ``nn.Linear``)."""
        return self.implementation.create(in_features, out_features, generators, device,
                                          positions=positions, params=params)


_IMPLEMENTATIONS: dict[HeadKind, type[LinearHeads]] = {
    HeadKind.LINEAR: LinearHeads,
    HeadKind.BOOSTLU: BoostLUHeads,
    HeadKind.CAM: CamHeads,
}

_MAP_IMPLEMENTATIONS: dict[HeadKind, type[MapHeads]] = {
    HeadKind.LINEAR: CamHeads,
    HeadKind.BOOSTLU: BoostLUHeads,
    HeadKind.CAM: CamHeads,
}

_TRAINS_ON: dict[HeadKind, str] = {
    HeadKind.LINEAR: "trains linear heads on pooled features",
    HeadKind.BOOSTLU: "trains BoostLU heads on spatial feature maps",
    HeadKind.CAM: "trains on spatial feature maps",
}
