"""``--search protocol`` (the default): the SPML papers' search, Adam on the protocol's grid
(PROTOCOL.md section 2) over the backbone's features as they are; its heads start fine-tuning
(LinearInit). Stage two's hooks: :mod:`featcache.linear.search_modes.protocol`."""

from __future__ import annotations

from featcache.protocol.search_modes import SearchMode, register_search_mode


class ProtocolSearch(SearchMode):
    name = "protocol"
    default = True
    without_weight_decay = "the protocol's search trains Adam without weight decay"


PROTOCOL = register_search_mode(ProtocolSearch())
