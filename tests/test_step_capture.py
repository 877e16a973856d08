"""Stage two's training step as a CUDA graph records it, checked on the CPU.

A graph replays the operators its steps launched, with the scalars and the memory they had:
so every step of an epoch must launch the same operators on the same persistent tensors, and
none may read a value on the host. A ``TorchDispatchMode`` sees every operator of the step the
trainer captures (forward, the losses' terms and their backward, the optimizer), for every
shipped loss alone and for the largest stacked group; the graph path itself runs here with a
stand-in for the CUDA backend that replays what it recorded, as a CUDA graph does
(:class:`~featcache.linear.engine.replay.RecordedGraphs`), and gives the plain loop's numbers
bit for bit, for every loss, the largest group, and groups trained at once in threads while
one of them fails its capture.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import pytest
import torch
from linear_fixtures import every_kind_of_data
from torch.utils._python_dispatch import TorchDispatchMode

import featcache.linear.engine.graphs as graphs_module
import featcache.linear.engine.replay as replay_module
import featcache.linear.engine.trainer as trainer_module
from featcache.linear.engine.graphs import GRAPHS_ENV, STEPS_ENV, graphs_enabled
from featcache.linear.engine.member import Member
from featcache.linear.engine.replay import RecordedGraphs, Recorder
from featcache.linear.engine.search import SearchSpec
from featcache.linear.engine.stacking import Stackable, fit_all, stacked_groups
from featcache.linear.engine.steptrace import HostCopies, StepTrace
from featcache.linear.engine.trainer import GroupTrainer
from featcache.losses import loss_class, loss_names

EPOCHS = 2
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return every_kind_of_data(tmp_path_factory.mktemp("capture"))


@pytest.fixture
def graphed(monkeypatch):
    """The trainer's graph path on the CPU: steps that read their batch on the device, and a
    backend whose graphs run their steps again; returns the backends it made."""
    made: list[RecordedGraphs] = []

    def backend(device, joined=()):
        made.append(RecordedGraphs())
        return made[-1]

    monkeypatch.setattr(trainer_module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(trainer_module, "graph_backend", backend)
    monkeypatch.setenv(STEPS_ENV, "2")
    return made


def _fitted(name: str, data):
    pooled, spatial = data
    return loss_class(name).fit_data(spatial if loss_class(name).head.spatial else pooled)


def _member(name: str, data, lrs=(1e-2,)) -> Member:
    spec = SearchSpec(loss=name, learning_rates=lrs, batch_sizes=(16,), epochs=EPOCHS)
    return Member(name, tuple(spec.resolved(data.facts).configs(0)))


def _traced_epoch(trainer: GroupTrainer, epoch: int) -> list[tuple[StepTrace, HostCopies]]:
    """One epoch of the steps a graph records, each traced; then the epoch's end as in a run."""
    for member in trainer.members:
        member.loss.begin_epoch(epoch, trainer.epochs, member.state)
    rows = trainer.train_rows
    order = rows.order(trainer.order, trainer.batch_size)
    trainer.batches.begin(order)
    trainer.labels.fill(order)
    trainer.loss_sum.zero_()
    traces = []
    for _ in range(trainer.steps):
        trace, copies = StepTrace(), HostCopies()
        with copies, trace:
            trainer.device_step(epoch)
        traces.append((trace, copies))
    trainer.finish_epoch(epoch, trainer.loss_sum.clone(), trainer.running)
    return traces


def _reads(traces) -> list[str]:
    return sorted({read for trace, copies in traces for read in trace.host_reads + copies.calls})


@pytest.mark.parametrize("name", loss_names())
def test_every_losss_step_is_as_capturable_as_it_declares(name, data, graphed):
    """Steps 1 and 2 of every epoch (step 0 may make the epoch's constants) launch the same
    operators with the same scalars on the same tensors, and read nothing on the host, unless
    the loss declares it cannot be captured; its steps change between epochs only where it
    declares a schedule."""
    fitted = _fitted(name, data)
    trainer = GroupTrainer(fitted, [_member(name, fitted)], EPOCHS, "clean", "none", CPU)
    assert trainer.steps >= 3
    loss = loss_class(name)
    by_epoch = []
    for epoch in range(EPOCHS):  # a schedule changes the step from the first epoch to the second
        later = _traced_epoch(trainer, epoch)[1:]
        if not loss.capturable:
            assert _reads(later), f"{name} declares a step that cannot be captured"
            return
        assert not _reads(later), f"{name}'s step reads values on the host: {_reads(later)}"
        first, second = (trace.signature() for trace, _ in later[:2])
        assert first == second, f"{name}: two steps of epoch {epoch} differ"
        by_epoch.append(first)
    changes = len(set(by_epoch)) > 1
    assert changes == loss.scheduled, (f"{name}'s step {'changes' if changes else 'stays'} "
                                       f"from epoch to epoch; it declares scheduled="
                                       f"{loss.scheduled}")


def _stacked(data, graphs: bool):
    pooled, _ = data
    names = [n for n in loss_names() if not loss_class(n).head.spatial]
    fitted = fit_all(pooled, [loss_class(n) for n in names])
    searches = [Stackable(loss_class(n), f, EPOCHS, "clean", "none")
                for n, f in zip(names, fitted, strict=True)]
    members = [[_member(s.loss.name, s.data)] for s in searches]
    return stacked_groups(searches, members, graphs=graphs)


def test_the_largest_stacked_group_on_cuda_steps_alike_and_reads_nothing_on_the_host(data,
                                                                                      graphed):
    groups = _stacked(data, graphs=True)
    largest = max(groups, key=lambda g: g.heads)
    assert len(largest.members) >= 15
    trainer = GroupTrainer(largest.data, [m for _, m in largest.members], EPOCHS, "clean",
                           "none", CPU)
    by_epoch = []
    for epoch in range(EPOCHS):
        later = _traced_epoch(trainer, epoch)[1:]
        assert not _reads(later)
        assert later[0][0].signature() == later[1][0].signature()
        by_epoch.append(later[0][0].signature())
    assert len(set(by_epoch)) == 1  # one graph serves every epoch


class Touched(TorchDispatchMode):
    """The memory one branch of a step reads and writes, as (storage, first byte, end byte),
    leaving out what the branch allocated itself (its temporaries)."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple] = []
        self.writes: list[tuple] = []
        self._own: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written = {id(t) for t in replay_module._written(func, args, kwargs)}
        for value in replay_module._leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and value.numel() and not func.is_view:
                extent = _extent(value)  # a view reads nothing; what reads it is seen
                if extent[0] not in self._own:
                    (self.writes if id(value) in written else self.reads).append(extent)
        out = func(*args, **kwargs)
        inputs = {_extent(v)[0] for v in replay_module._leaves((args, kwargs))
                  if isinstance(v, torch.Tensor) and v.numel()}
        for value in replay_module._leaves(out):
            if isinstance(value, torch.Tensor) and value.numel():
                storage = _extent(value)[0]
                if storage not in inputs:
                    self._own.add(storage)
        return out


def _extent(tensor: torch.Tensor) -> tuple[int, int, int]:
    size = tensor.element_size()
    span = sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.storage_offset() * size
    return tensor.untyped_storage().data_ptr(), start, start + (span + 1) * size


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _touched_by_branches(trainer: GroupTrainer) -> list[Touched]:
    """What each branch of the second step of the second epoch touches (after a first epoch
    and the epoch's first step, as a captured step)."""
    _traced_epoch(trainer, 0)
    for member in trainer.members:
        member.loss.begin_epoch(1, trainer.epochs, member.state)
    order = trainer.train_rows.order(trainer.order, trainer.batch_size)
    trainer.batches.begin(order)
    trainer.labels.fill(order)
    trainer.device_step(1)  # the epoch's first step may make its constants
    branches: list[Touched] = []
    original = trainer.branches.run

    def watched(part):
        def run():
            branches.append(Touched())
            with branches[-1]:
                return part()
        return run

    trainer.branches.run = lambda parts: original([watched(part) for part in parts])
    trainer.device_step(1)
    return branches


def test_a_steps_branches_write_nothing_another_branch_touches(data, graphed):
    """On CUDA each loss's share of a step runs on a branch of its own, concurrently with the
    others: for every group a GPU makes of the pooled losses, a captured step's branches
    write no memory another branch reads or writes (on the CPU they run in turn, so a race
    there would not show in the numbers)."""
    for group in _stacked(data, graphs=True):
        if len(group.members) < 2:
            continue
        trainer = GroupTrainer(group.data, [m for _, m in group.members], EPOCHS, "clean",
                               "none", CPU)
        branches = _touched_by_branches(trainer)
        assert len(branches) == len(group.members)
        assert all(branch.writes for branch in branches)  # its training predictions at least
        for i, mine in enumerate(branches):
            for j, theirs in enumerate(branches):
                if i != j:
                    clash = [(w, t) for w in mine.writes for t in theirs.reads + theirs.writes
                             if _overlap(w, t)]
                    assert not clash, (group.members[i][1].loss, group.members[j][1].loss)


def test_on_cuda_losses_that_cannot_be_captured_or_follow_a_schedule_stack_apart(data):
    def group_of(groups):
        return {m.loss: i for i, g in enumerate(groups) for _, m in g.members}

    on_cpu, on_cuda = group_of(_stacked(data, graphs=False)), group_of(_stacked(data, True))
    assert on_cpu["opml-sp"] == on_cpu["an"] == on_cpu["gr"]  # the CPU stacks them all
    assert len({on_cuda["opml-sp"], on_cuda["an"], on_cuda["gr"]}) == 3
    assert on_cuda["gr"] == on_cuda["ll-r"] == on_cuda["splc"]  # scheduled alike
    assert on_cuda["an"] == on_cuda["bce"] == on_cuda["opml"]


#: the graph path's runs: three epochs (a schedule's graphs captured again, then reused) of
#: four steps (two-step graphs and one-step remainders, replayed in every epoch)
REPLAY_EPOCHS, REPLAY_BATCH = 3, 16


def _results(name: str, data, lrs=(1e-2, 1e-3), epochs=EPOCHS, batch_size=16):
    fitted = _fitted(name, data)
    spec = SearchSpec(loss=name, learning_rates=lrs, batch_sizes=(batch_size,), epochs=epochs)
    member = Member(name, tuple(spec.resolved(fitted.facts).configs(0)))
    trainer = GroupTrainer(fitted, [member], epochs, "clean", "none", CPU)
    return trainer, trainer.run(progress=False, position=0)[0]


def _same(ours, theirs, name: str) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert a.config == b.config and a.best_epoch == b.best_epoch, name
        assert a.epochs == b.epochs, name  # every epoch's record, train and test mAP included
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias), name
        assert torch.equal(a.test_ap, b.test_ap), name
        for key in a.state:
            assert torch.equal(a.state[key], b.state[key]), (name, key)


def _on_graphs(monkeypatch, backend=lambda device, joined=(): RecordedGraphs()) -> None:
    """The trainer's graph path on the CPU, its graphs made by ``backend``."""
    monkeypatch.setattr(trainer_module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(trainer_module, "graph_backend", backend)
    monkeypatch.setenv(STEPS_ENV, "2")


@pytest.mark.parametrize("name", loss_names())
def test_replayed_graphs_give_the_plain_loops_numbers_for_every_loss(name, data, monkeypatch,
                                                                     caplog):
    """Many steps per graph, the batch chosen on the device, each graph replaying the
    operators it recorded with the recorded scalars on the recorded tensors (not the Python
    step again): the plain loop's numbers, bit for bit; a graph captured once serves every
    epoch, again each epoch for a schedule; a step that reads the host trains without graphs
    and says so once."""
    run = functools.partial(_results, name, data, epochs=REPLAY_EPOCHS,
                            batch_size=REPLAY_BATCH)
    _, plain = run()
    _on_graphs(monkeypatch)
    with caplog.at_level(logging.WARNING):
        trainer, graphed = run()
    _same(graphed, plain, name)
    stats = trainer.graphs.stats()
    assert trainer.adam.step_count == REPLAY_EPOCHS * trainer.steps
    warned = [r for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    if not loss_class(name).capturable:
        assert "_linalg_svd" in stats["failed"] and stats["captures"] == 0
        assert len(warned) == 1
        return
    assert not warned and stats["failed"] is None
    assert stats["replays"] >= REPLAY_EPOCHS  # every epoch replays graphs
    if not loss_class(name).scheduled:
        assert stats["captures"] <= 2  # one graph per number of steps a replay takes


def test_the_largest_stacked_group_replayed_gives_the_plain_loops_numbers(data, monkeypatch):
    groups = _stacked(data, graphs=True)
    largest = max(groups, key=lambda g: g.heads)

    def run():
        trainer = GroupTrainer(largest.data, [m for _, m in largest.members], REPLAY_EPOCHS,
                               "clean", "none", CPU)
        return trainer, trainer.run(progress=False, position=0)

    _, plain = run()
    _on_graphs(monkeypatch)
    trainer, graphed = run()
    for (_, member), ours, theirs in zip(largest.members, graphed, plain, strict=True):
        _same(ours, theirs, member.loss)
    assert trainer.graphs.stats()["replays"] > 0 and trainer.graphs.stats()["failed"] is None


def test_the_stand_in_replays_what_was_recorded_not_the_python_step(data, monkeypatch):
    """What a CUDA graph gets wrong, the stand-in gets wrong too: with the check that
    captures a scheduled step again switched off, the epoch's scalars stay those baked into
    the first capture, and the numbers move (gr's K and V follow the epoch)."""
    _, plain = _results("gr", data, epochs=REPLAY_EPOCHS, batch_size=REPLAY_BATCH)
    _on_graphs(monkeypatch)
    original = graphs_module.GraphedSteps._traced

    def same_signature(self, step, judged):
        original(self, step, judged)
        return ("one step for every epoch",)

    monkeypatch.setattr(graphs_module.GraphedSteps, "_traced", same_signature)
    trainer, stale = _results("gr", data, epochs=REPLAY_EPOCHS, batch_size=REPLAY_BATCH)
    assert trainer.graphs.stats()["captures"] <= 2
    assert any(a.epochs != b.epochs for a, b in zip(stale, plain, strict=True))


def test_a_group_whose_capture_fails_trains_without_graphs_and_says_so_once(data, monkeypatch,
                                                                            caplog):
    _, plain = _results("role", data)
    _on_graphs(monkeypatch, lambda device, joined=(): RecordedGraphs(refuse=True))
    with caplog.at_level(logging.WARNING):
        trainer, graphed = _results("role", data)
    _same(graphed, plain, "role")
    stats = trainer.graphs.stats()
    assert stats["failed"].startswith("its capture failed: RuntimeError: operation not permitted")
    assert stats["captures"] == 0 and stats["replays"] == 0
    assert len([r for r in caplog.records if "without CUDA graphs" in r.getMessage()]) == 1


class FailingMidCapture(RecordedGraphs):
    """A capture that fails in its second step, after the first has run its operators (a CUDA
    error inside a capture): what they wrote must be undone for the plain steps after it."""

    def recorder(self):
        class Failing(Recorder):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if any(op[0] is torch.ops.aten._fused_adam_.default for op in self.ops):
                    raise RuntimeError("CUDA error: operation not permitted when stream is "
                                       "capturing")
                return super().__torch_dispatch__(func, types, args, kwargs)

        return Failing()


class FailingReplay(RecordedGraphs):
    """Graphs whose second replay raises what a broken capture of another group's makes
    (the H200's error of 2026-11-28): an error the capture's fallback cannot contain."""

    def capture(self, record):
        graph = super().capture(record)
        replay = graph.replay

        def failing():
            if self.replayed >= 1:
                raise RuntimeError("CUDA error: dependency created on uncaptured work in "
                                   "another stream")
            replay()

        graph.replay = failing
        return graph


def test_groups_at_once_stay_exact_while_one_capture_fails_and_one_error_escapes(
        data, monkeypatch, caplog):
    """What a GPU does with several groups, each in a thread of its own, run on the CPU with
    replayed graphs: one group's capture fails midway (the fallback undoes what it wrote and
    trains step by step), another's error escapes its capture (it trains again from the start
    without graphs); neither ends the search, and every group has its numbers."""
    import featcache.linear.engine.search as search_module
    from featcache.linear.engine import workers
    from featcache.linear.engine.search import run_searches

    pooled, _ = data
    specs = [SearchSpec(loss=name, learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16),
                        epochs=REPLAY_EPOCHS) for name in ("an", "role", "ll-cp")]
    monkeypatch.setattr(search_module, "usable_cpus", lambda: 1)
    monkeypatch.setattr(search_module, "captures_apart", lambda device: True)
    alone = run_searches(pooled, specs, CPU, progress=False)

    made = []

    def backend(device, joined=()):
        kinds = {1: FailingMidCapture, 2: FailingReplay}
        made.append(kinds.get(len(made), RecordedGraphs)())
        return made[-1]

    _on_graphs(monkeypatch, backend)
    monkeypatch.setattr(workers, "groups_at_once", lambda device: 3)
    with caplog.at_level(logging.WARNING):
        together = run_searches(pooled, specs, CPU, progress=False)
    for a, b in zip(together, alone, strict=True):
        for seed_a, seed_b in zip(a.seeds, b.seeds, strict=True):
            _same(seed_a.heads, seed_b.heads, a.spec.loss)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "its capture failed: RuntimeError: CUDA error" in m]) == 1
    assert len([m for m in messages if "trained again from the start without CUDA graphs"
                in m and "dependency created on uncaptured work" in m]) == 1
    assert len(made) == 4 and sum(g.replayed for g in made) > 0  # the retried group: none


def test_graphs_are_for_cuda_only_and_can_be_switched_off(monkeypatch):
    assert graphs_enabled(CPU) is False
    assert graphs_enabled(torch.device("cuda", 1)) is True
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert graphs_enabled(torch.device("cuda", 1)) is False


def test_the_gpu_checks_of_stage_two_pass_on_the_cpu_with_the_stand_in(data, monkeypatch):
    """``make gpu-check``'s graph checks, run here on the CPU with replayed graphs: the code
    the first GPU runs, exercised before it does."""
    import featcache.linear.engine.search as search_module
    from benchmarks import gpu_check_linear as checks

    pooled, _ = data
    _on_graphs(monkeypatch)
    monkeypatch.setattr(search_module, "captures_apart", lambda device: True)
    monkeypatch.setattr(checks, "EPOCHS", 2)
    monkeypatch.setattr(checks, "LOSSES", ("an", "role", "gr", "ll-cp", "opml-sp"))
    monkeypatch.setattr(search_module, "usable_cpus", lambda: 1)  # in this process, as on a GPU
    _, numbers = checks.graphs_vs_eager(None, data=pooled)
    assert numbers["largest_difference"] == 0.0 and numbers["differing"] == []
    assert {g["failed"] is not None for g in numbers["groups"]} == {True, False}
    assert numbers["warnings"] and all("opml-sp" in line for line in numbers["warnings"])

    @contextlib.contextmanager
    def refused():
        with monkeypatch.context() as patch:
            patch.setattr(trainer_module, "graph_backend",
                          lambda device, joined=(): RecordedGraphs(refuse=True))
            yield

    _, numbers = checks.capture_failure_and_device(None, data=pooled, provoke=refused)
    assert numbers["largest_difference"] == 0.0 and numbers["next_group"]["captures"] > 0
