"""Every kind of head, each with one implementation for H stacked heads that every stage uses:
stage two trains a grid of them at once, stage three and the API use H = 1
(:class:`HeadModule`). :class:`HeadKind` names the kinds and owns their implementations:
``linear`` (:class:`LinearHeads`, on pooled features), ``boostlu`` (:class:`BoostLUHeads`) and
``cam`` (:class:`CamHeads`), heads on spatial maps (:class:`MapHeads`) that also give their
class activation maps."""

from featcache.heads.kinds import HeadKind
from featcache.heads.linear import HeadParams, LinearHeads, init_linear
from featcache.heads.maps import (
    CAM_BLOCK,
    CAM_BLOCK_TENSORS,
    BoostLUHeads,
    CamHeads,
    MapHeads,
    boost,
    boost_slope,
    boostlu_pool,
)
from featcache.heads.module import HeadModule, map_rows

__all__ = ["CAM_BLOCK", "CAM_BLOCK_TENSORS", "BoostLUHeads", "CamHeads", "HeadKind", "HeadModule",
           "HeadParams", "LinearHeads", "MapHeads", "boost", "boost_slope", "boostlu_pool",
           "init_linear", "map_rows"]
