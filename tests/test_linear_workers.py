"""Who runs which group (:mod:`featcache.linear.engine.workers`): worker processes, at most
``jobs`` at a time, or this process where forking is unsafe; the numbers the same either way."""

from __future__ import annotations

import os

import pytest
import torch

from featcache.linear.engine.workers import map_groups

CPU = torch.device("cpu")


def _square(task):
    kind, value = task
    return kind, value * value, os.getpid()


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_group_runs_once_and_the_results_come_back_in_the_groups_order(jobs):
    seen = []
    groups = [("group", v) for v in range(4)]
    results = map_groups(_square, groups, [1.0] * 4, CPU, jobs,
                         on_result=lambda index, task, result: seen.append((index, task)))
    assert [(kind, value) for kind, value, _ in results] == [("group", v * v) for v in range(4)]
    assert sorted(seen) == list(enumerate(groups))
    if jobs == 2:  # in worker processes, not in this one
        assert {pid for _, _, pid in results} - {os.getpid()} == {pid for _, _, pid in results}


def test_more_jobs_than_cores_are_capped_and_said(tmp_path, cache_dir):
    """Issue 36, item 13: `--jobs 100000` on 2 cores started about 67 worker processes."""
    from faults import run
    from linear_fixtures import synthetic_dataset

    from featcache.runtime import usable_cpus

    synthetic_dataset(cache_dir)
    pools = tmp_path / "pools.txt"
    prelude = f"""
import concurrent.futures as _futures
_init = _futures.ProcessPoolExecutor.__init__
def _recorded(self, max_workers=None, *args, **kwargs):
    with open({str(pools)!r}, "a") as out:
        out.write(f"{{max_workers}}\\n")
    _init(self, max_workers, *args, **kwargs)
_futures.ProcessPoolExecutor.__init__ = _recorded
"""
    result = run(["train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "1", "--lr",
                  "1e-2,1e-3", "--bsize", "8,16", "--seeds", "0,1", "--jobs", "100000",
                  "--quiet", "--no-plots", "--device", "cpu"], cwd=tmp_path, prelude=prelude)
    assert result.returncode == 0, result.stderr
    cores = usable_cpus()
    said = (f"--jobs 100000: {cores} CPU{'s' if cores > 1 else ''} can run {cores} worker "
            f"process{'es' if cores > 1 else ''} at once (one core each); running {cores}")
    assert said in result.stderr.splitlines()
    started = [int(n) for n in pools.read_text().split()] if pools.exists() else []
    assert all(n <= cores for n in started), started  # never more processes than cores


def test_where_forking_is_unsafe_the_groups_train_here_with_the_same_numbers(monkeypatch,
                                                                              tmp_path):
    """A process that has used CUDA cannot fork workers whose first backward pass would fail
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing";
    the GPU check reproduces it for real): there every group trains in this process, and the
    numbers are those of the forked workers."""
    import concurrent.futures

    from linear_fixtures import synthetic_dataset

    import featcache.linear.engine.schedule as schedule
    import featcache.linear.engine.workers as workers
    from featcache.linear.data import load_linear_data
    from featcache.linear.engine.search import SearchSpec, run_searches

    labels, features = synthetic_dataset(tmp_path, n_train=64, n_test=24, classes=4, dim=8)
    data = load_linear_data(labels, features)
    specs = [SearchSpec(loss=name, learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=2)
             for name in ("an", "role")]
    forked = run_searches(data, specs, CPU, progress=False, jobs=2)

    def no_pool(*args, **kwargs):
        raise AssertionError("a worker process was started where forking is unsafe")

    for module in (workers, schedule):
        monkeypatch.setattr(module, "fork_is_safe", lambda: False)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    monkeypatch.setattr(workers, "ProcessPoolExecutor", no_pool)
    here = run_searches(data, specs, CPU, progress=False, jobs=2)
    for a, b in zip(forked, here, strict=True):
        assert a.selected.config == b.selected.config
        assert [h.epochs for s in a.seeds for h in s.heads] == [
            h.epochs for s in b.seeds for h in s.heads]


def test_fork_is_safe_until_cuda_is_initialised(monkeypatch):
    from featcache.linear.engine.workers import fork_is_safe

    assert fork_is_safe() == (not torch.cuda.is_initialized())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not fork_is_safe()


def _sleep_for(task):
    import time

    time.sleep(task)
    return task


def test_on_idle_is_called_once_when_a_worker_has_nothing_left_while_others_train():
    """Two workers, three groups: once the last group is handed out, the first worker to
    finish leaves a core free while the other still trains; ``on_idle`` runs then, once, in
    this process (the writer prepares what it needs meanwhile)."""
    calls, finished_before = [], []
    seen: list[int] = []
    map_groups(_sleep_for, [0.05, 1.5, 0.05], [1.0] * 3, CPU, 2,
               on_result=lambda index, task, result: seen.append(index),
               on_idle=lambda: (calls.append(os.getpid()), finished_before.append(list(seen))))
    assert calls == [os.getpid()]
    assert 1 not in finished_before[0]  # the long group was still training
    assert sorted(seen) == [0, 1, 2]


@pytest.mark.parametrize("jobs", [1, 2])
def test_on_idle_is_not_called_when_no_worker_ever_waits_beside_another(jobs):
    """One worker (the groups one after another), or a single group: no worker is ever left
    free while another trains."""
    calls: list[int] = []
    groups = [0.01] if jobs == 2 else [0.01, 0.01]
    map_groups(_sleep_for, groups, [1.0] * len(groups), CPU, jobs,
               on_idle=lambda: calls.append(1))
    assert calls == []
