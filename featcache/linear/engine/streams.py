"""CUDA streams that no two groups of this process use at the same time.

``torch.cuda.Stream()`` does not create a stream: it hands out the next of a fixed pool of 32
per device and priority, round-robin, so two streams asked for at different moments can be the
same stream. Stage two trains several groups at once on one GPU, each in a thread with streams
of its own (its work, its graph captures, its losses' branches): if two of them got the same
pool stream, one group's kernels would be queued in the other's capture (recorded into its
graph instead of run; on the H200 of 2026-11-28, "dependency created on uncaptured work in
another stream" and a capture invalidated). :data:`LEASE` lends each group streams that no
other group holds until it gives them back, and never lends again a stream that a failed
capture may have left capturing (:meth:`StreamLease.retire`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: draws from the device's pool before a lease gives up on finding a free stream (twice the
#: pool: every stream has been seen at least once)
POOL_DRAWS = 64


class StreamLease:
    """Streams lent to one holder at a time, drawn from ``draw(device)`` (PyTorch's pool); a
    stream is known by its ``cuda_stream`` handle."""

    def __init__(self, draw: Callable[[torch.device], Any], draws: int = POOL_DRAWS):
        self._draw, self._draws = draw, draws
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._retired: set[int] = set()
        #: the most streams held at once (what the checks report)
        self.most_held = 0

    def take(self, device: torch.device, count: int) -> list:
        """Up to ``count`` streams of ``device`` that nobody holds (fewer when the pool has no
        more free ones: the caller makes do); they are the caller's until :meth:`give_back`."""
        taken: list = []
        if count <= 0:
            return taken
        with self._lock:
            for _ in range(self._draws):
                stream = self._draw(device)
                handle = int(stream.cuda_stream)
                if handle in self._held or handle in self._retired:
                    continue
                self._held.add(handle)
                taken.append(stream)
                if len(taken) == count:
                    break
            self.most_held = max(self.most_held, len(self._held))
        return taken

    def give_back(self, streams: Sequence) -> None:
        """Streams whose holder is done with them (its work on them queued or finished)."""
        with self._lock:
            for stream in streams:
                self._held.discard(int(stream.cuda_stream))

    def retire(self, streams: Sequence) -> None:
        """Streams never to be lent again (a failed capture may have left them capturing)."""
        with self._lock:
            for stream in streams:
                handle = int(stream.cuda_stream)
                self._held.discard(handle)
                self._retired.add(handle)

    def held(self) -> int:
        with self._lock:
            return len(self._held)


def _pool_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=device)


#: the process's lease of CUDA streams
LEASE = StreamLease(_pool_stream)


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` (a CUDA stream) is being captured into a graph now."""
    with torch.cuda.stream(stream):
        return bool(torch.cuda.is_current_stream_capturing())


def give_back(streams: Sequence) -> None:
    """Leased streams back to :data:`LEASE`, but any that is still capturing (a failed
    capture's) retired: no other group may queue work on it."""
    capturing = [s for s in streams if is_capturing(s)]
    LEASE.retire(capturing)
    LEASE.give_back([s for s in streams if not any(s is c for c in capturing)])
