"""Honest timing windows for the benchmarks that read images through a DataLoader.

A DataLoader's workers decode ahead of the consumer: ``workers x prefetch_factor`` batches wait
in its queue. A window that opens on a full queue times batches decoded before it opened and
reports a rate that no decoder reached (the H200 run of 2026-11-26: "end to end" at 224 px
12,499 images/s, above the 5,257 of decoding alone, with 8 timed batches after a queue of 30).
So every loader-fed figure is timed like this (:func:`benchmarks._common.steady_rate`):

1. warm-up batches, with the work (worker start-up, cuDNN, the allocator, nvJPEG);
2. **drain**: batches taken without the work until one had to be waited for: the queue holds
   no batch the consumer could take, the steady state;
3. the window: ``timed`` batches with the work, and more until one had to be waited for again
   (at most one more per worker): it closes at the phase of the workers' output it opened at.
   Workers that decode batches of equal cost finish them together, in bursts; a window opened
   just before a burst and closed just after one would count a burst decoded before it;
4. the accounting. Every batch carries the moment its worker finished it (the collate function
   stamps it; ``time.monotonic`` is one clock for all the processes of a machine). ``early``:
   batches of the window finished before it opened; ``late``: batches after it finished before
   it closed (fetched after the window, without their work, until every worker has shown one
   finished later: a worker does its batches in order). The loader produced ``timed - early +
   late`` batches while the window was open, the consumer took ``timed``: the figure is the
   smaller, the steady rate of the slower side. When the queue fell during the window by more
   than a tenth of it (``early - late``), the window was too short for its queue and the
   figure is refused (:class:`PrefilledWindow`).

A window of fewer than :data:`MIN_BATCHES_PER_WORKER` batches per worker is refused before
anything runs (:func:`check_window`): each worker is part-way through a batch when the window
opens and when it closes, and only a window long against that evens out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from torch.utils.data import DataLoader, get_worker_info

from featcache.errors import FeatcacheError, OptionError

#: a timed window holds at least this many batches per DataLoader worker
MIN_BATCHES_PER_WORKER = 3
#: share of the window by which the queue may fall while it is open (at least 2 batches)
FALL_SHARE = 0.10


class PrefilledWindow(FeatcacheError):
    """The timed window consumed batches decoded before it opened: the figure is not end to end."""


class StampedCollate:
    """A loader's collate function that also returns when (and in which worker) it finished."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, items):
        worker = get_worker_info()
        return [self.collate(items), time.monotonic(), -1 if worker is None else worker.id]


class BatchTap:
    """Iterate a DataLoader's batches unchanged, recording for each the moment it was asked for
    and the moment its worker finished it (and which worker). Install it before the loader's
    first iteration: persistent workers keep the collate function they started with."""

    def __init__(self, loader: DataLoader):
        if not isinstance(loader.collate_fn, StampedCollate):
            loader.collate_fn = StampedCollate(loader.collate_fn)
        self.loader = loader
        self.workers = loader.num_workers
        self.depth = loader.num_workers * (loader.prefetch_factor or 0)
        self.asked: list[float] = []
        self.done: list[float] = []
        self.worker: list[int] = []
        self._iterator: Iterator | None = None

    def __iter__(self):
        self.asked, self.done, self.worker = [], [], []
        self._iterator = None  # the previous pass's workers and queue go before new ones start
        self._iterator = iter(self.loader)
        while (batch := self.fetch()) is not None:
            yield batch

    def fetch(self):
        """The loader's next batch (None at its end), recorded."""
        assert self._iterator is not None, "iterate the tap first"
        asked = time.monotonic()
        try:
            batch, done, worker = next(self._iterator)
        except StopIteration:
            return None
        self.asked.append(asked)
        self.done.append(done)
        self.worker.append(worker)
        return batch

    @property
    def count(self) -> int:
        return len(self.done)

    def last_waited(self) -> bool:
        """Whether the latest batch was still being decoded when it was asked for."""
        return bool(self.done) and self.done[-1] > self.asked[-1]


def check_window(timed: int, workers: int, option: str = "--timed") -> None:
    """Refuse a window too short for the loader's ``workers`` (one line naming the option)."""
    least = MIN_BATCHES_PER_WORKER * max(1, workers)
    if timed < least:
        raise OptionError(
            f"{option} {timed}: a timed window of {timed} batches is too short for {workers} "
            f"DataLoader workers (each is part-way through a batch when it opens and closes); "
            f"pass {option} {least} or more")


def allowed_fall(timed: int) -> int:
    """Batches by which the queue may fall during a window of ``timed``: 10 %, at least 2."""
    return max(2, math.ceil(FALL_SHARE * timed))


def drain(batches: Iterator, tap: BatchTap) -> int:
    """Take batches without their work until the latest one had to be waited for; returns how
    many. Gives up after the queue's depth and one batch per worker: the loader then outpaces
    even a consumer that does nothing, and the accounting shows its queue full at both ends."""
    taken = 0
    while not tap.last_waited() and taken < tap.depth + tap.workers + 2:
        next(batches)
        taken += 1
    return taken


def closes(tap: BatchTap, count: int, timed: int) -> bool:
    """Whether a window of ``count`` >= ``timed`` batches closes now: its latest batch had to be
    waited for (the phase it opened at), or it holds a batch per worker more than ``timed``."""
    return count >= timed and (tap.last_waited() or count >= timed + max(1, tap.workers))


def early_and_late(tap: BatchTap, first: int, timed: int, opened: float,
                   closed: float) -> tuple[int, int]:
    """(batches of the window [first, first + timed) finished before it opened, batches after it
    finished before it closed), fetching batches after the window, without their work, until
    every worker has shown one finished after it closed, or the loader ends."""
    early = sum(done < opened for done in tap.done[first:first + timed])
    pending = set(range(tap.workers)) if tap.workers else {-1}
    late, index = 0, first + timed
    while pending:
        if index >= tap.count and tap.fetch() is None:
            break
        if tap.done[index] < closed:
            late += 1
        else:
            pending.discard(tap.worker[index])
        index += 1
    return early, late


def verdict(early: int, late: int, timed: int, what: str) -> None:
    """Refuse the figure when the queue fell during the window by more than it allows."""
    fell = early - late
    if fell > allowed_fall(timed):
        raise PrefilledWindow(
            f"{what}: {fell} of the {timed} timed batches were decoded before the window opened "
            f"({early} ready when it opened, {late} when it closed): the rate would not be end to "
            "end. The window must open on a drained queue or be many times the queue's depth "
            "(benchmarks/window.py); pass a larger --timed")
