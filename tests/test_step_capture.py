"""Stage two's training step as a CUDA graph records it, checked on the CPU.

A graph replays the operators its steps launched, with the scalars and the memory they had:
so every step of an epoch must launch the same operators on the same persistent tensors, and
none may read a value on the host. A ``TorchDispatchMode`` sees every operator of the step the
trainer captures (forward, the losses' terms and their backward, the optimizer), for every
shipped loss alone and for the largest stacked group; the graph path itself runs here with a
stand-in for the CUDA backend and gives the plain loop's numbers bit for bit.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from linear_fixtures import every_kind_of_data

import featcache.linear.engine.trainer as trainer_module
from featcache.linear.engine.graphs import GRAPHS_ENV, STEPS_ENV, RerunGraphs, graphs_enabled
from featcache.linear.engine.member import Member
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
    made: list[RerunGraphs] = []

    def backend(device, refuse=False):
        made.append(RerunGraphs(refuse=refuse))
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


def test_on_cuda_losses_that_cannot_be_captured_or_follow_a_schedule_stack_apart(data):
    def group_of(groups):
        return {m.loss: i for i, g in enumerate(groups) for _, m in g.members}

    on_cpu, on_cuda = group_of(_stacked(data, graphs=False)), group_of(_stacked(data, True))
    assert on_cpu["opml-sp"] == on_cpu["an"] == on_cpu["gr"]  # the CPU stacks them all
    assert len({on_cuda["opml-sp"], on_cuda["an"], on_cuda["gr"]}) == 3
    assert on_cuda["gr"] == on_cuda["ll-r"] == on_cuda["splc"]  # scheduled alike
    assert on_cuda["an"] == on_cuda["bce"] == on_cuda["opml"]


def _results(name: str, data, lrs=(1e-2, 1e-3)):
    fitted = _fitted(name, data)
    trainer = GroupTrainer(fitted, [_member(name, fitted, lrs)], EPOCHS, "clean", "none", CPU)
    return trainer, trainer.run(progress=False, position=0)[0]


def _same(ours, theirs, name: str) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert a.config == b.config and a.best_epoch == b.best_epoch, name
        assert a.epochs == b.epochs, name  # every epoch's record, train and test mAP included
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias), name
        assert torch.equal(a.test_ap, b.test_ap), name
        for key in a.state:
            assert torch.equal(a.state[key], b.state[key]), (name, key)


@pytest.mark.parametrize("name", ["role", "gr", "opml-sp", "ignore"])
def test_graphed_steps_give_the_plain_loops_numbers(name, data, monkeypatch, caplog):
    """Many steps per graph, the batch chosen on the device: the plain loop's numbers, bit for
    bit; a graph captured once serves every epoch, again each epoch for a schedule; a step
    that reads the host trains without graphs and says so once."""
    _, plain = _results(name, data)
    monkeypatch.setattr(trainer_module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(trainer_module, "graph_backend", lambda device: RerunGraphs())
    monkeypatch.setenv(STEPS_ENV, "2")
    with caplog.at_level(logging.WARNING):
        trainer, graphed = _results(name, data)
    _same(graphed, plain, name)
    stats = trainer.graphs.stats()
    assert trainer.adam.step_count == EPOCHS * trainer.steps
    warned = [r for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    if not loss_class(name).capturable:
        assert "_linalg_svd" in stats["failed"] and stats["captures"] == 0
        assert len(warned) == 1
        return
    assert not warned and stats["failed"] is None and stats["replays"] > 0
    if loss_class(name).scheduled:
        assert stats["captures"] >= EPOCHS - 1
    else:
        assert stats["captures"] <= 2  # one graph per number of steps a replay takes


def test_a_group_whose_capture_fails_trains_without_graphs_and_says_so_once(data, monkeypatch,
                                                                            caplog):
    _, plain = _results("role", data)
    monkeypatch.setattr(trainer_module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(trainer_module, "graph_backend", lambda device: RerunGraphs(refuse=True))
    with caplog.at_level(logging.WARNING):
        trainer, graphed = _results("role", data)
    _same(graphed, plain, "role")
    stats = trainer.graphs.stats()
    assert stats["failed"].startswith("its capture failed: RuntimeError: operation not permitted")
    assert stats["captures"] == 0 and stats["replays"] == 0
    assert len([r for r in caplog.records if "without CUDA graphs" in r.getMessage()]) == 1


def test_graphs_are_for_cuda_only_and_can_be_switched_off(monkeypatch):
    assert graphs_enabled(CPU) is False
    assert graphs_enabled(torch.device("cuda", 1)) is True
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert graphs_enabled(torch.device("cuda", 1)) is False


def test_the_gpu_checks_of_stage_two_pass_on_the_cpu_with_the_stand_in(data, monkeypatch):
    """``make gpu-check``'s graph checks, run here on the CPU with graphs that run their steps
    again: the code the first GPU runs, exercised before it does."""
    import featcache.linear.engine.search as search_module
    from benchmarks import gpu_check_linear as checks

    pooled, _ = data
    for module in (trainer_module, search_module):
        monkeypatch.setattr(module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(trainer_module, "graph_backend", lambda device: RerunGraphs())
    monkeypatch.setattr(checks, "EPOCHS", 2)
    monkeypatch.setattr(checks, "LOSSES", ("an", "role", "gr", "opml-sp"))
    monkeypatch.setattr(search_module, "usable_cpus", lambda: 1)  # in this process, as on a GPU
    monkeypatch.setenv(STEPS_ENV, "2")
    _, numbers = checks.graphs_vs_eager(None, data=pooled)
    assert numbers["largest_difference"] == 0.0
    assert {g["failed"] is not None for g in numbers["groups"]} == {True, False}

    @contextlib.contextmanager
    def refused():
        with monkeypatch.context() as patch:
            patch.setattr(trainer_module, "graph_backend", lambda device: RerunGraphs(refuse=True))
            yield

    _, numbers = checks.capture_failure_and_device(None, data=pooled, provoke=refused)
    assert numbers["largest_difference"] == 0.0 and numbers["next_group"]["captures"] > 0


def test_groups_trained_at_once_in_threads_give_each_groups_numbers(data, monkeypatch):
    """What a GPU does with several groups (each in a thread of its own), run on the CPU: the
    numbers of the groups trained one after the other, every group started and kept once."""
    import featcache.linear.engine.search as search_module
    from featcache.linear.engine import workers
    from featcache.linear.engine.search import run_searches

    pooled, _ = data
    specs = [SearchSpec(loss=name, learning_rates=(1e-2,), batch_sizes=(8, 16), epochs=EPOCHS)
             for name in ("an", "role")]
    monkeypatch.setattr(search_module, "usable_cpus", lambda: 1)
    alone = run_searches(pooled, specs, CPU, progress=False)
    monkeypatch.setattr(workers, "groups_at_once", lambda device: 3)
    together = run_searches(pooled, specs, CPU, progress=False)
    for a, b in zip(together, alone, strict=True):
        for seed_a, seed_b in zip(a.seeds, b.seeds, strict=True):
            _same(seed_a.heads, seed_b.heads, a.spec.loss)
