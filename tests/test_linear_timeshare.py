"""How a run's wall clock is shared among its tasks (featcache.linear.engine.timeshare),
against hand-computed shares."""

from __future__ import annotations

import pytest

from featcache.linear.engine.timeshare import Timeline


def test_each_instant_is_split_among_the_tasks_running_then():
    timeline = Timeline()
    a, b, c = object(), object(), object()
    for task in (a, b):
        timeline.started(task, 0.0)
    timeline.finished(a, 0.0, 10.0, piece=0)
    timeline.started(c, 11.0)  # still running: counted from its start
    timeline.finished(b, 0.0, 12.0, piece=1)
    # [0, 10]: a and b (5 each); [10, 11]: b alone; [11, 12]: b and c (0.5 each)
    assert timeline.shares(now=14.0) == pytest.approx({0: 5.0, 1: 6.5})
    timeline.finished(c, 11.0, 14.0, piece=0)
    assert timeline.shares(now=20.0) == pytest.approx({0: 5.0 + 0.5 + 2.0, 1: 6.5})
    assert sum(timeline.shares(now=20.0).values()) == pytest.approx(14.0)  # the busy time
    assert timeline.busy_seconds(0) == pytest.approx(13.0)


def test_tasks_one_after_the_other_keep_their_own_times():
    timeline = Timeline()
    first, second = object(), object()
    timeline.finished(first, 1.0, 3.0, piece=0)
    timeline.finished(second, 3.0, 7.5, piece=1)
    assert timeline.shares(now=8.0) == pytest.approx({0: 2.0, 1: 4.5})
