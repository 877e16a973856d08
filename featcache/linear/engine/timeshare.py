"""A run's wall clock divided among the tasks that shared it: what each loss of ``--loss all``
really cost.

The losses of a run train as stacked groups on shared workers, so a group's wall time is
shared by its losses, and the groups running at the same moment share that moment. Each
instant is split equally among the tasks running then (each group training and evaluating its
epochs); :func:`~featcache.linear.engine.search.run_searches` splits a task's share among
its group's losses by their heads (every head of a group takes the same steps). The shares add
up to the time some worker was busy: never more than the run's wall time.

A task's share is known exactly once it has finished: the tasks running beside it had started
by then (a task still running counts from its start, :meth:`Timeline.started`).
"""

from __future__ import annotations

from collections import defaultdict


class Timeline:
    """When each task of a run ran, and for which stacked group (its ``piece``)."""

    def __init__(self) -> None:
        self._running: dict[int, tuple[object, float]] = {}  # id(task) -> (task, start)
        self._done: list[tuple[float, float, int]] = []  # (began, ended, piece)

    def started(self, task: object, at: float) -> None:
        """``task`` was handed to a worker at ``at`` (wall clock)."""
        self._running[id(task)] = (task, at)  # the task is kept, so that its id stays its own

    def finished(self, task: object, began: float, ended: float, piece: int) -> None:
        """``task``, working for group ``piece``, ran from ``began`` to ``ended``."""
        self._running.pop(id(task), None)
        self._done.append((began, max(began, ended), piece))

    def busy_seconds(self, piece: int) -> float:
        """The finished tasks of group ``piece``: their durations added up (they may overlap
        other groups' tasks, and each other's)."""
        return sum(ended - began for began, ended, done in self._done if done == piece)

    def shares(self, now: float) -> dict[int, float]:
        """Each group's share of the wall clock so far, over its finished tasks: every instant
        divided equally among the tasks running then (the finished ones, and those still
        running from their start to ``now``)."""
        events: list[tuple[float, int, int]] = []  # (time, +1 start / -1 end, interval)
        intervals = [*self._done, *((start, max(start, now), -1)
                                    for _, start in self._running.values())]
        for number, (began, ended, _) in enumerate(intervals):
            if ended > began:
                events += [(began, 1, number), (ended, -1, number)]
        events.sort(key=lambda event: (event[0], event[1]))  # ends before starts at one time
        found: dict[int, float] = defaultdict(float)
        active: set[int] = set()
        last = None
        for time, kind, number in events:
            if active and last is not None and time > last:
                each = (time - last) / len(active)
                for running in active:
                    piece = intervals[running][2]
                    if piece >= 0:
                        found[piece] += each
            last = time
            if kind > 0:
                active.add(number)
            else:
                active.discard(number)
        return dict(found)
