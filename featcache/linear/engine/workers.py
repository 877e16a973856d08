"""Who trains which group: worker processes on the CPU, ranks under ``torchrun``.

A search is a list of independent groups (one per seed and batch size). Each group's numbers
depend only on the group: it trains with one intra-op thread on the CPU, its seeds derive
from the group, and no reduction crosses groups. So the groups can go anywhere:

- on the CPU, ``jobs`` worker processes train one group each at a time. Processes, not
  threads: a training step is many small operations, and threads would queue on Python's
  global interpreter lock (measured: 25-40 % slower than processes on 2 cores). Workers are
  forked, so they share the features already in memory instead of copying them;
- under ``torchrun`` every rank (one per GPU, or CPU processes with gloo) takes its share of
  the groups, balanced by their cost, and every rank receives every group's results;
- on one GPU, up to :func:`cuda_groups` groups train at once, each in a thread with streams of
  its own (their steps are replayed CUDA graphs and chains of small kernels: the host waits,
  the GPU has room for several);
- otherwise (``jobs=1``) the groups train one after the other. So do they on the
  CPU in a process that has used CUDA (or another accelerator): autograd's device threads and
  CUDA's state do not survive ``fork`` (a forked worker's first backward pass would fail with
  "Unable to handle autograd's threading in combination with fork-based multiprocessing"), so
  there the groups train in the process itself, one after the other (:func:`fork_is_safe`).

Ctrl-C (:mod:`featcache.interrupt`): forked workers inherit the command's signal handler, so
each stops at its next step (the signal reaches them from the terminal, or is passed on by the
main process) and its :class:`~featcache.errors.Interrupted` comes back through its future; the
pool then cancels the groups not started and ends its workers before the error goes on, so no
worker outlives the command. Under ``torchrun`` the ranks agree on the failure before
exchanging results (:meth:`Ranks.together`), so no rank waits for one that stopped.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext
from typing import TypeVar

import torch
import torch.distributed as dist

from featcache.environment import CUDA_GROUPS
from featcache.interrupt import check_stop, die_with_parent
from featcache.linear.engine.streams import LEASE, give_back
from featcache.runtime import Ranks, intraop_threads

G = TypeVar("G")
R = TypeVar("R")

#: what forked workers read: the running search's training function, by key
_TASKS: dict[int, Callable] = {}
#: ``FEATCACHE_CUDA_GROUPS=N``: groups trained at once on one GPU
CUDA_GROUPS_ENV = "FEATCACHE_CUDA_GROUPS"
#: groups trained at once on one GPU by default: the batch sizes of a search, and the groups of
#: ``--loss all``, overlap (a group's step is a chain of small kernels that leaves most of the
#: GPU idle)
GROUPS_AT_ONCE = 4


def balance(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Indices of ``costs`` for each worker: the costliest first, each to the least loaded
    worker (longest-processing-time first; ties to the lower worker, so it is deterministic)."""
    loads = [0.0] * workers
    shares: list[list[int]] = [[] for _ in range(workers)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        shares[worker].append(index)
        loads[worker] += costs[index]
    return [sorted(share) for share in shares]


def map_groups(run: Callable[[G], R], groups: Sequence[G], costs: Sequence[float],
               device: torch.device, jobs: int, job: Ranks | None = None,
               on_result: Callable[[int, G, R], None] | None = None,
               on_start: Callable[[G], None] | None = None,
               on_idle: Callable[[], None] | None = None) -> list[R]:
    """``run(group)`` for every group wherever it runs; the results in the order of
    ``groups``, and each passed to ``on_result(index, group, result)`` as soon as it is known.

    Locally ``jobs`` workers (at most; started as groups need them) take the groups in their
    order, ``on_start(group)`` told as each is handed to a worker, and ``on_idle()`` called
    once, here, the first time a worker process is left without a group while others still
    train (a core is free). Under ``torchrun``
    (``job.world > 1``) this rank trains its share, balanced by ``costs``, and every rank
    receives every result once all ranks are done (``on_result`` is then called in the order
    of ``groups`` on every rank; ``on_start`` and ``on_idle`` are not).
    """
    if job is not None and job.world > 1:
        mine = balance(costs, job.world)[job.rank]
        local = dict(zip(mine, job.together(
            lambda: _run_local(run, [groups[i] for i in mine], device, min(jobs, len(mine)))),
            strict=True))
        everyone: list[dict[int, R] | None] = [None] * job.world
        dist.all_gather_object(everyone, local)
        merged = {index: result for part in everyone for index, result in (part or {}).items()}
        results = [merged[i] for i in range(len(groups))]
        for index, result in enumerate(results):
            if on_result is not None:
                on_result(index, groups[index], result)
        return results
    return _run_local(run, groups, device, jobs, on_result, on_start, on_idle)


def _run_local(run: Callable[[G], R], groups: Sequence[G], device: torch.device, jobs: int,
               on_result: Callable[[int, G, R], None] | None = None,
               on_start: Callable[[G], None] | None = None,
               on_idle: Callable[[], None] | None = None) -> list[R]:
    results: dict[int, R] = {}
    started = on_start or (lambda task: None)

    def keep(index: int, task: G, result: R) -> None:
        results[index] = result
        if on_result is not None:
            on_result(index, task, result)

    at_once = groups_at_once(device)
    if at_once > 1 and len(groups) > 1:
        if device.type == "cuda":  # what this thread queued (the data) is there for every group
            torch.cuda.current_stream(device).synchronize()
        with ThreadPoolExecutor(max_workers=at_once) as threads, \
                intraop_threads(1) if device.type == "cpu" else nullcontext():
            _schedule(threads, lambda task: threads.submit(_on_own_stream, run, device, task),
                      groups, at_once, keep, started)
        return [results[index] for index in range(len(groups))]
    jobs = max(1, jobs) if device.type == "cpu" and fork_is_safe() else 1
    with intraop_threads(1) if device.type == "cpu" else nullcontext():
        if jobs == 1:
            for index, task in enumerate(groups):
                started(task)
                keep(index, task, run(task))
        elif "fork" not in multiprocessing.get_all_start_methods():  # pragma: no cover - Windows
            with ThreadPoolExecutor(max_workers=jobs) as threads:
                _schedule(threads, lambda task: threads.submit(run, task), groups, jobs, keep,
                          started)
        else:
            key = id(run)
            _TASKS[key] = run
            try:
                with ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker,
                                         mp_context=multiprocessing.get_context("fork")) as pool:
                    _schedule(pool, lambda task: pool.submit(_run_task, key, task), groups, jobs,
                              keep, started, on_idle)
            finally:
                del _TASKS[key]
    return [results[index] for index in range(len(groups))]


def _schedule(pool: Executor, submit: Callable[[G], Future], groups: Sequence[G], jobs: int,
              keep: Callable[[int, G, R], None], started: Callable[[G], None],
              idle: Callable[[], None] | None = None) -> None:
    """Run ``groups`` on ``pool`` in their order, at most ``jobs`` at a time (so that a failure
    leaves the rest unstarted; ``started`` told as each is submitted); each result to ``keep``;
    ``idle()`` once, the first time a worker is left without a group while others train.
    The first failure cancels the rest."""
    waiting = list(enumerate(groups))[::-1]
    running: dict[Future, tuple[int, G]] = {}
    try:
        while waiting or running:
            while len(running) < jobs and waiting:
                index, task = waiting.pop()
                started(task)
                running[submit(task)] = (index, task)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                index, task = running.pop(future)
                keep(index, task, future.result())
            if idle is not None and not waiting and 0 < len(running) < jobs:
                idle()
                idle = None
    except BrokenProcessPool:
        check_stop()  # a worker ended by a signal meant for the command: a stop, not a failure
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise


def cuda_groups() -> int:
    """Groups trained at once on one GPU (``FEATCACHE_CUDA_GROUPS``, default
    :data:`GROUPS_AT_ONCE`): each in a thread of its own, on its own streams."""
    return int(CUDA_GROUPS.value(GROUPS_AT_ONCE))


def groups_at_once(device: torch.device) -> int:
    """Groups trained at once in threads of this process on ``device``: :func:`cuda_groups` on
    a GPU; one elsewhere (CPU workers are processes)."""
    return cuda_groups() if device.type == "cuda" else 1


def _on_own_stream(run: Callable[[G], R], device: torch.device, task: G) -> R:
    """``run(task)`` in this thread on a stream of its own on a CUDA ``device``, leased to it
    alone (:mod:`~featcache.linear.engine.streams`: the device's default stream would order it
    after every other group's work, and a stream of PyTorch's pool may be another group's),
    finished before it returns."""
    if device.type != "cuda":
        return run(task)
    with torch.cuda.device(device):
        taken = LEASE.take(device, 1)
        stream = taken[0] if taken else torch.cuda.default_stream(device)
        try:
            with torch.cuda.stream(stream):
                result = run(task)
            stream.synchronize()
        finally:
            give_back(taken)
    return result


def fork_is_safe() -> bool:
    """Whether worker processes may be forked from this process: not once CUDA (or another
    accelerator PyTorch starts autograd threads for) has been initialised here."""
    for name in ("cuda", "xpu"):
        backend = getattr(torch, name, None)
        initialised = getattr(backend, "is_initialized", None)
        if initialised is not None and initialised():
            return False
    return True


def _start_worker() -> None:
    torch.set_num_threads(1)
    die_with_parent()  # a main process killed with kill -9 leaves no worker behind


def _run_task(key: int, group: object) -> object:
    return _TASKS[key](group)
