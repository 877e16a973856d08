"""Honest timing windows for the benchmarks that read images through a DataLoader.

A DataLoader's workers decode ahead of the consumer: ``workers x prefetch_factor`` batches wait
in its queue. A window that opens on a full queue times batches decoded before it opened and
reports a rate that no decoder reached (the H200 run of 2026-11-26: "end to end" at 224 px
12,499 images/s, above the 5,257 of decoding alone, with 8 timed batches after a queue of 30).
So every loader-fed figure is timed like this (:func:`benchmarks._common.steady_rate`):

1. warm-up batches, with the work (worker start-up, cuDNN, the allocator, nvJPEG);
2. **drain**: batches taken without the work, at least one, until one had to be waited for:
   the consumer has caught up with the workers;
3. the window: ``timed`` batches with the work, and more until one had to be waited for (at
   most one more per worker): it closes at the phase of the workers' output it opened at;
4. the accounting. Every batch carries the moment its worker finished it and which worker did
   (the collate function stamps them; ``time.monotonic`` is one clock for all the processes of
   a machine). After the window, batches are fetched without their work until every worker
   has shown one finished after it closed (a worker does its batches in order): then every
   batch finished while the window was open is known. Each worker's batches finished in the
   window, one after another, give its pace; the paces add up to the rate the loader made
   batches at (:func:`worker_pace`), which does not depend on where the window's ends fall
   (workers that decode batches of equal cost finish them together, in bursts, and a count of
   batches between two moments depends on how many bursts those moments enclose). When the
   consumer waited for the loader during more than :data:`WAIT_SHARE` of the window, the
   loader set the pace and the figure is the workers' (or the consumer's rate, if lower).
   Otherwise the consumer set it and the
   figure is the rate it took batches at, unless the queue fell while it was open (``early``,
   batches of the window finished before it opened, minus ``late``, batches after it finished
   before it closed) by more than a batch per worker and the workers made batches more than
   :data:`FALL_SHARE` slower than the consumer took them: the window then drew on a queue
   filled before it opened, and the figure is refused (:class:`PrefilledWindow`).

A window of fewer than :data:`MIN_BATCHES_PER_WORKER` batches per worker is refused before
anything runs (:func:`check_window`): each worker's pace needs several of its batches.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from torch.utils.data import DataLoader, get_worker_info

from featcache.errors import FeatcacheError, OptionError

#: a timed window holds at least this many batches per DataLoader worker
MIN_BATCHES_PER_WORKER = 3
#: how much slower than the consumer the workers may make batches in a consumer-paced window
FALL_SHARE = 0.10
#: the loader set the pace when the consumer waited for it during more than this share
WAIT_SHARE = 0.05


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


def drain(batches: Iterator, tap: BatchTap) -> int:
    """Take batches without their work, at least one (the queue filled while the last warm-up
    batch was worked on), until the latest had to be waited for; returns how many. Gives up
    after the queue's depth and one batch per worker: the loader then outpaces even a consumer
    that does nothing, and the accounting shows its queue full at both ends."""
    taken = 0
    while taken == 0 or (not tap.last_waited() and taken < tap.depth + tap.workers + 2):
        next(batches)
        taken += 1
    return taken


def worker_pace(tap: BatchTap, opened: float, closed: float) -> float | None:
    """Batches per second the workers made while the window was open: for each worker, its
    batches finished in it one after another ((k - 1) over the time from its first to its
    last), added up. None without workers (the consumer makes each batch itself) or when a
    worker finished fewer than 2 batches in it."""
    if not tap.workers:
        return None
    done: dict[int, list[float]] = {w: [] for w in range(tap.workers)}
    for worker, moment in zip(tap.worker, tap.done, strict=True):
        if opened <= moment <= closed:
            done.setdefault(worker, []).append(moment)
    if any(len(m) < 2 or m[-1] <= m[0] for m in done.values()):
        return None
    return sum((len(m) - 1) / (m[-1] - m[0]) for m in done.values())


def waited(tap: BatchTap, first: int, timed: int) -> float:
    """Seconds the consumer spent waiting for the window's batches to be finished."""
    return sum(max(0.0, done - asked) for asked, done in
               zip(tap.asked[first:first + timed], tap.done[first:first + timed], strict=True))


def closes(tap: BatchTap, count: int, timed: int) -> bool:
    """Whether a window of ``count`` >= ``timed`` batches closes now: its latest batch had to be
    waited for (the phase of the workers' output it opened at, after the drain), or it holds a
    batch per worker more than ``timed``."""
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


def verdict(consumed: float, made: float | None, workers: int, early: int, late: int,
            what: str) -> None:
    """Refuse a consumer-paced figure when the queue fell during the window by more than a batch
    per worker (``early - late``: out-of-order workers leave a few ready at any moment) and the
    workers made batches (``made`` images/s; None: some worker finished fewer than 2 in the
    window) more than :data:`FALL_SHARE` slower than the consumer took them (``consumed``)."""
    if not workers or early - late <= workers or (
            made is not None and made >= (1 - FALL_SHARE) * consumed):
        return
    making = ("some worker finished fewer than 2 batches" if made is None
              else f"the workers made {made:,.0f}")
    raise PrefilledWindow(
        f"{what}: the consumer took {consumed:,.0f} images/s while {making}: the window drew on "
        f"batches decoded before it opened ({early} ready when it opened, {late} when it "
        "closed), the rate would not be end to end. The window must open on a drained queue or "
        "be many times the queue's depth (benchmarks/window.py); pass a larger --timed")


def account(tap: BatchTap, warmup: int, drained: int, timed: int, window: tuple[float, float],
            images: int, what: str) -> dict:
    """The figures of a window that opened and closed at ``window`` (step 4 above), with the
    one to report as ``images_per_s``; refuses a consumer-paced window that drew on a queue
    filled before it."""
    opened, closed = window
    first, seconds = warmup + drained, closed - opened
    consumed = images / seconds
    early, late = early_and_late(tap, first, timed, opened, closed)
    pace = worker_pace(tap, opened, closed)
    made = None if pace is None else pace * images / timed
    wait = waited(tap, first, timed)
    loader_paced = wait > WAIT_SHARE * seconds
    if not loader_paced:
        verdict(consumed, made, tap.workers, early, late, what)
    return {"workers": tap.workers, "queue_depth": tap.depth, "drained_batches": drained,
            "decoded_before_window": early, "ready_after_window": late,
            "consumed_images_per_s": consumed, "workers_images_per_s": made,
            "waited_share": wait / seconds, "paced_by": "loader" if loader_paced else "consumer",
            "images_per_s": min(consumed, made) if loader_paced and made is not None
            else consumed}
