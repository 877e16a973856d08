"""How much memory stage two may use (``--max-memory``) and what a search needs of it.

The budget bounds the memory of the process and its workers (forked worker processes share
the parent's pages: count each page once, as PSS does, not once per process). Features are held in memory (the
protocol's exact path) when everything fits; otherwise the training split is streamed from
the features file in blocks (:mod:`featcache.linear.stream`), the validation and test splits
staying in memory while they fit. The estimate counts what grows with the data: features,
labels, each concurrent group's per-example state, optimizer moments, predictions kept for
the training mAP, evaluation buffers and BoostLU's scoring blocks; the process's current
resident size stands for the rest (the interpreter, PyTorch, the labels file).
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import re
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from featcache.errors import OptionError, plural
from featcache.metrics import RANK_BLOCK, RANK_BYTES

#: share of the machine's memory (or of the container's limit) used when no budget is given
DEFAULT_SHARE = 0.5
FLOAT32 = 4
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int, option: str = "--max-memory") -> int:
    """Bytes from ``4GB``, ``512M``, ``1.5GiB`` or a plain number of bytes (K, M, G, T are
    powers of 1024; the B / iB suffix is optional)."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text).lower())
        if match is None:
            raise OptionError(f"{option} {text!r}: give a size such as 4GB, 512MB or 1.5G")
        value = int(float(match.group(1)) * _UNITS[match.group(2)])
    if value <= 0:
        raise OptionError(f"{option} {text!r}: the size must be positive")
    return value


def format_size(size: float) -> str:
    """``3.2 GB``-style text (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"  # pragma: no cover


def physical_memory() -> int:
    """The machine's memory, or the container's memory limit when that is lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        total = 0
    limits = [total] if total > 0 else []
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (1 << 60):
            limits.append(int(text))
    if not limits:  # pragma: no cover - no way to know: assume a small machine
        return 8 << 30
    return min(limits)


def default_budget() -> int:
    """The budget when ``--max-memory`` is not given: half the machine's (or container's) memory."""
    return int(DEFAULT_SHARE * physical_memory())


def resident_memory() -> int:
    """This process's current resident memory in bytes."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return peak_resident_memory()


def peak_resident_memory() -> int:
    """This process's peak resident memory so far (``ru_maxrss``) in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if os.uname().sysname == "Darwin" else peak * 1024


@dataclass(frozen=True)
class SplitSizes:
    """Rows per split, classes and feature width: what the estimate is made of."""

    train: int
    val: int
    test: int
    classes: int
    dim: int

    def features(self, split: str, itemsize: int = FLOAT32) -> int:
        return getattr(self, split) * self.dim * itemsize


@dataclass(frozen=True)
class GroupShape:
    """What one training group keeps besides the features (per concurrent group). A group of
    several losses (:meth:`stacked`) counts their per-row tensors as a share of its heads."""

    heads: int
    per_example_state: float = 0  # (H, N, L) float32 tensors the loss keeps
    learned_state: float = 0  # of which trained by Adam (with gradient and two moments)
    train_scores: float = 0  # the loss asks for predictions on the whole training split
    train_map: bool = True  # predictions kept for the training-set mAP
    scoring_work: int = 0  # bytes a scoring pass needs beyond the scores (BoostLU's blocks)

    @classmethod
    def stacked(cls, shapes: Sequence[GroupShape], pieces: int = 1) -> GroupShape:
        """One group of every loss of ``shapes``, cut into ``pieces`` groups of equal heads
        (the largest a stacked run trains at once): each per-row tensor in its share of heads."""
        if not shapes:
            return cls(1)
        total = sum(shape.heads for shape in shapes)

        def share(field: Callable[[GroupShape], float]) -> float:
            return sum(field(shape) * shape.heads for shape in shapes) / total

        return cls(heads=max(1, math.ceil(total / max(1, pieces))),
                   per_example_state=share(lambda s: s.per_example_state),
                   learned_state=share(lambda s: s.learned_state),
                   train_scores=share(lambda s: float(s.train_scores)),
                   train_map=any(shape.train_map for shape in shapes),
                   scoring_work=max(shape.scoring_work for shape in shapes))

    def heads_bytes(self, sizes: SplitSizes) -> int:
        """One copy of the heads' weights."""
        return self.heads * sizes.dim * sizes.classes * FLOAT32

    def bytes(self, sizes: SplitSizes) -> int:
        h, n, classes = self.heads, sizes.train, sizes.classes
        head = 6 * self.heads_bytes(sizes)  # weight, grad, two moments, best copy, scores
        per_row = h * n * classes * FLOAT32
        state = int((self.per_example_state + 3 * self.learned_state) * per_row)
        predictions = int(per_row * (int(self.train_map) + self.train_scores))
        if self.train_map:  # the rows' positives in training order, bools (ranking: evaluation's)
            predictions += n * classes
        labels = 2 * n * classes * FLOAT32  # the epoch's observed and full labels, as float32
        return head + state + predictions + labels + self.evaluation_bytes(sizes)

    def evaluation_bytes(self, sizes: SplitSizes) -> int:
        """What scoring the validation and test splits takes (scores and AP work, BoostLU's
        blocks)."""
        elements = self.heads * max(sizes.val, sizes.test) * sizes.classes
        # ranking a block of columns, for these scores or the training mAP's (not at once)
        scores = elements * FLOAT32 + ranking_bytes(max(elements, self.heads * sizes.train
                                                        * sizes.classes * self.train_map))
        return scores + self.scoring_work


def ranking_bytes(elements: int) -> int:
    """What ranking ``elements`` scores for their AP holds beside them
    (:class:`featcache.metrics.RankedScores`: a block of columns at a time)."""
    return min(elements, RANK_BLOCK) * RANK_BYTES


def labels_bytes(sizes: SplitSizes) -> int:
    """Observed (int8) and clean (uint8) labels of the three splits as tensors
    (:meth:`featcache.linear.data.SplitRows.label_tensors`)."""
    return 2 * (sizes.train + sizes.val + sizes.test) * sizes.classes


#: bytes per streamed read: whole HDF5 chunks adding up to about this much (smaller blocks
#: when the budget leaves no room for a window of these)
BLOCK_BYTES = 32 << 20
#: the smallest streamed read, in rows: below it each read's overhead outweighs its memory
MIN_BLOCK_ROWS = 64
#: validation and test stay in memory only while the training shuffle window keeps this many
#: blocks (a wider shuffle matters more than re-reading them every epoch)
MIN_WINDOW_BLOCKS = 8
#: what each worker process adds of its own (interpreter state it touches, allocator pools)
WORKER_BYTES = 128 << 20
#: share of the budget left unplanned (allocator slack, fragmentation, estimate error)
HEADROOM = 0.1
#: what a search process allocates besides the planned tensors (AP sorting indices, HDF5 and
#: allocator caches); measured with benchmarks.linear --out-of-core: one configuration of
#: 1,000,000 x 2,048 float16 (labels file read without its image paths, labels kept as int8
#: and uint8) held about 20 MB more than its plan without it
PROCESS_BYTES = 32 << 20

#: this process's resident size once torch and featcache were imported (see
#: :func:`mark_interpreter`): the libraries' own pages, which the budget does not count
_INTERPRETER_RESIDENT = [0]


def mark_interpreter() -> None:
    """Record the resident size of the interpreter as it is now (torch and featcache imported,
    nothing loaded yet): :func:`allocated_memory` counts only what comes after."""
    _INTERPRETER_RESIDENT[0] = resident_memory()


def allocated_memory() -> int:
    """What this process holds beyond the interpreter recorded by :func:`mark_interpreter`
    (everything it holds when none was recorded), once the memory it freed (reading the labels
    file leaves tens of MB of it) went back to the system."""
    release_freed_memory()
    return max(0, resident_memory() - _INTERPRETER_RESIDENT[0])


def release_freed_memory() -> None:
    """Collect garbage and hand the C allocator's freed pages back to the system (glibc's
    ``malloc_trim``; elsewhere only the collection), so the resident size counts what is held."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@dataclass(frozen=True)
class Placement:
    """Where each split's features live during a search, and why.

    ``jobs`` is the number of processes the budget allows when it is fewer than asked (0: as
    asked); results do not depend on it.
    """

    streamed: tuple[str, ...] = ()  # splits read from the file in blocks; empty: all in memory
    block_rows: int = 0  # file rows per read (whole HDF5 chunks)
    window_blocks: int = 0  # blocks of the training split shuffled together
    budget: int = 0
    estimate: int = 0  # planned peak memory beyond the interpreter
    forced: bool = False  # streaming was asked for (``--stream``), not needed
    jobs: int = 0  # processes the budget allows, when fewer than asked
    train_rows: int = 0  # rows of the training split (what a window is a share of)
    block_bytes: int = 0  # bytes of one read at the file's dtype
    #: whether losses train stacked in shared groups (False: the budget holds one loss's group
    #: at a time; the numbers are the same either way)
    stacked: bool = True

    @property
    def in_memory(self) -> bool:
        return not self.streamed

    @property
    def window_rows(self) -> int:
        """Training rows shuffled together (at most the whole split)."""
        return min(self.block_rows * self.window_blocks, self.train_rows) if self.streamed else self.train_rows

    def settings(self) -> dict:
        """What decides a streamed run's numbers (part of its fingerprint)."""
        return {"streamed": list(self.streamed), "block_rows": self.block_rows,
                "window_blocks": self.window_blocks}

    def record(self) -> dict:
        """The plan as results.json keeps it: sizes, budget, and what they mean for the shuffle."""
        share = self.window_rows / self.train_rows if self.train_rows else 1.0
        return {**self.settings(), "block_bytes": self.block_bytes,
                "window_rows": self.window_rows, "train_rows": self.train_rows,
                "window_share": share, "budget_bytes": self.budget,
                "planned_peak_bytes": self.estimate, "jobs": self.jobs or None,
                "shuffle": self.shuffle_note()}

    def shuffle_note(self) -> str:
        """What the block and window sizes mean for the shuffle, in words."""
        if self.in_memory:
            return "one permutation of every training row per epoch (the protocol's)"
        if self.window_rows >= self.train_rows:
            return ("every epoch permutes the blocks, then the rows of the whole split: a full "
                    "shuffle, drawn differently from the in-memory path's")
        share = self.window_rows / self.train_rows
        return (f"every epoch permutes the {-(-self.train_rows // self.block_rows)} blocks of "
                f"{plural(self.block_rows, 'row')}, then the rows of each window of "
                f"{plural(self.window_blocks, 'block')}: a batch mixes rows from "
                f"{plural(self.window_rows, 'row')} ({share:.1%} of the "
                "training split), not from all of them; every row is still seen once per epoch")

    def describe(self) -> str:
        budget = format_size(self.budget)
        fewer = f"; {self.jobs} process{'es' if self.jobs > 1 else ''} to fit the budget" if self.jobs else ""
        if self.in_memory:
            return (f"features in memory (about {format_size(self.estimate)} of the {budget} "
                    f"budget{fewer})")
        why = "as asked" if self.forced else f"they do not fit the {budget} budget in memory"
        return (f"streaming the {' and '.join(self.streamed)} features from the file ({why}): "
                f"blocks of {plural(self.block_rows, 'row')}, "
                f"{plural(self.window_blocks, 'block')} shuffled together "
                f"({self.window_rows} of {plural(self.train_rows, 'training row')}); planned peak about "
                f"{format_size(self.estimate)} beyond the interpreter{fewer}")


def plan_placement(sizes: SplitSizes, itemsize: int, chunk_rows: int, group: GroupShape,
                   concurrency: int, budget: int, resident: int,
                   force_stream: bool = False) -> Placement:
    """Keep every split in memory when the search fits ``budget``; else stream the training
    split with the largest shuffle window that fits, and validation (then test) too when
    keeping them would leave that window under :data:`MIN_WINDOW_BLOCKS` blocks.

    ``concurrency`` groups train at once; ``resident`` is what the process already holds
    beyond the interpreter. When the budget cannot hold that many processes, fewer are planned
    (``Placement.jobs``, down to one process, which forks no worker), the in-memory path
    before streaming. When not even one
    process has room for a window of :data:`BLOCK_BYTES` blocks, the blocks get smaller (down
    to :data:`MIN_BLOCK_ROWS` rows): the floor is the state of one group plus one block.
    """
    usable = int(budget * (1 - HEADROOM))
    layouts = _layouts(concurrency)
    everything = sum(sizes.features(s) for s in ("train", "val", "test"))
    # loading reads one official split whole at the file's dtype beside the float32 tensors
    loading = max(sizes.train + sizes.val, sizes.test) * sizes.dim * itemsize
    if not force_stream:
        for conc in layouts:
            estimate = _fixed(sizes, group, conc, resident) + everything + loading
            if estimate <= usable:
                return Placement(budget=budget, estimate=estimate, train_rows=sizes.train,
                                 jobs=_fewer(conc, concurrency))
    # blocks of BLOCK_BYTES or smaller ones of whole chunks, whichever leaves the widest window
    # (in rows: smaller blocks hold less memory in flight); the most processes whose widest
    # window shuffles MIN_WINDOW_BLOCKS standard blocks (or the whole split), else the widest
    # window of all; blocks of part of a chunk (each read decompresses the whole chunk) only
    # when nothing else fits
    standard = chunk_rows * max(1, BLOCK_BYTES // max(chunk_rows * sizes.dim * itemsize, 1))
    whole_chunks = [standard]
    while whole_chunks[-1] > chunk_rows:
        whole_chunks.append(max(chunk_rows, whole_chunks[-1] // 2 // chunk_rows * chunk_rows))
    part_chunks: list[int] = []
    while (part_chunks or whole_chunks)[-1] > MIN_BLOCK_ROWS:
        part_chunks.append(max(MIN_BLOCK_ROWS, (part_chunks or whole_chunks)[-1] // 2))
    wide_enough = min(MIN_WINDOW_BLOCKS * standard, sizes.train)
    for block_sizes in (whole_chunks, part_chunks):
        widest = None
        for conc in layouts:
            fixed = _fixed(sizes, group, conc, resident)
            for block_rows in block_sizes:
                plan = _streamed(sizes, itemsize, block_rows, group, conc, usable, fixed)
                if plan is None:
                    continue
                placement = Placement(plan[0], block_rows, plan[1], budget, plan[2], force_stream,
                                      _fewer(conc, concurrency), sizes.train,
                                      block_rows * sizes.dim * itemsize)
                if widest is None or placement.window_rows > widest.window_rows:
                    widest = placement
            if widest is not None and widest.window_rows >= wide_enough:
                return widest
        if widest is not None:
            return widest
    block = MIN_BLOCK_ROWS * sizes.dim * itemsize
    raise_budget(budget, fixed + _per_group(sizes, itemsize, MIN_BLOCK_ROWS, group) + 3 * block)


def _layouts(concurrency: int) -> list[int]:
    """Concurrent groups, from as asked down to one process."""
    return list(range(max(1, concurrency), 0, -1))


def _fewer(planned: int, asked: int) -> int:
    return planned if planned < asked else 0


def _fixed(sizes: SplitSizes, group: GroupShape, concurrency: int, resident: int) -> int:
    """What the search holds whatever the placement: labels, each group's state, workers."""
    workers = WORKER_BYTES * (concurrency if concurrency > 1 else 0)
    return (resident + PROCESS_BYTES + labels_bytes(sizes) + concurrency * group.bytes(sizes)
            + workers)


def _per_group(sizes: SplitSizes, itemsize: int, block_rows: int, group: GroupShape) -> int:
    """Per concurrent group: a block being read, its float32 copy and its scores."""
    return (block_rows * sizes.dim * itemsize + block_rows * sizes.dim * FLOAT32
            + 2 * block_rows * group.heads * sizes.classes * FLOAT32)


def _streamed(sizes: SplitSizes, itemsize: int, block_rows: int, group: GroupShape,
              concurrency: int, usable: int, fixed: int) -> tuple[tuple[str, ...], int, int] | None:
    """(streamed splits, window blocks, estimate) with blocks of ``block_rows``, or None when
    not even a window of one block fits."""
    block = block_rows * sizes.dim * itemsize
    per_group = _per_group(sizes, itemsize, block_rows, group)
    total_blocks = -(-(sizes.train + sizes.val) // block_rows)
    kept = ["test", "val"]
    streamed = ["train"]
    while True:
        in_memory = sum(sizes.features(s) for s in kept)
        room = usable - fixed - in_memory - concurrency * per_group - block
        # a window is read, then joined with the rows carried over: two copies at once
        window = room // max(2 * concurrency * block, 1)
        if window >= min(MIN_WINDOW_BLOCKS, total_blocks) or not kept:
            break
        streamed.append(kept.pop())  # val first, then test
    if window < 1:
        return None
    window = int(min(window, total_blocks))
    estimate = fixed + in_memory + concurrency * (per_group + 2 * window * block) + block
    return tuple(streamed), window, estimate


def raise_budget(budget: int, needed: int) -> NoReturn:
    raise OptionError(f"--max-memory {format_size(budget)} is too small for this search: it needs "
                      f"about {format_size(needed / (1 - HEADROOM))} even with the features "
                      f"streamed from the file in blocks of {plural(MIN_BLOCK_ROWS, 'row')} and one "
                      "process (labels, per-example state, predictions and evaluation grow with "
                      "the rows and classes); give a larger --max-memory")
