"""``--search protocol``'s stage-two hooks: none change anything (the papers' search on the
features as they are; :mod:`featcache.linear.engine.search`)."""

from __future__ import annotations

from featcache.linear.search_modes import LinearSearchMode, register_linear_search_mode
from featcache.protocol.search_modes.protocol import PROTOCOL

PROTOCOL_HOOKS = register_linear_search_mode(LinearSearchMode(PROTOCOL))
