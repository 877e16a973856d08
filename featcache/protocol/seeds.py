"""Seeds derived from a run seed (the seeded fresh head both stages draw is
:func:`featcache.heads.init_linear`)."""

from __future__ import annotations

import zlib


def derive_seed(*parts) -> int:
    """A 63-bit seed from a run seed and text parts (stable across processes and machines)."""
    text = "|".join(str(p) for p in parts).encode()
    return (zlib.crc32(text) << 31 ^ zlib.crc32(text[::-1])) & ((1 << 63) - 1)
