"""The kinds of head a loss's logits come from, and what each needs of the training features:
the one place that knows them. A loss names its kind (``SPMLLoss.head``); the stages, the
reports and the API ask that kind instead of comparing names.

A :class:`HeadKind` is a string (its name, as ``results.json`` and ``best.pt`` record it under
``head.kind``), so it is written and compared like one.
"""

from __future__ import annotations

from enum import StrEnum

from featcache.losses.needs import SPATIAL_FEATURES, Need


class HeadKind(StrEnum):
    """``linear``: a linear layer on pooled features. ``boostlu`` (Kim et al. 2023): a 1x1
    convolution over the spatial map whose positive class-activation entries are multiplied by
    the loss parameter ``alpha`` before pooling; it needs spatial feature maps."""

    LINEAR = "linear"
    BOOSTLU = "boostlu"

    @property
    def needs(self) -> tuple[Need, ...]:
        """What this kind of head needs of the training data (a loss declares these too)."""
        return _NEEDS[self]

    @property
    def spatial(self) -> bool:
        """Whether this kind of head reads spatial feature maps instead of pooled features."""
        return SPATIAL_FEATURES in self.needs


_NEEDS: dict[HeadKind, tuple[Need, ...]] = {
    HeadKind.LINEAR: (),
    HeadKind.BOOSTLU: (SPATIAL_FEATURES,),
}
