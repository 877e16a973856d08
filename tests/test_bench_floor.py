"""``benchmarks.linear_floor``: the plan it times is the run's, and its floors add up.

Speed is never asserted here; the shapes taken from the plan, the kernels' rows and the
floors' arithmetic (checked against sums written out by hand) are.
"""

from __future__ import annotations

import pytest
import torch
from linear_fixtures import synthetic_dataset

from benchmarks.linear_floor import GroupShape, floors, plan_shapes, step_kernels
from featcache.linear.data import load_linear_data
from featcache.linear.engine.search import SearchSpec, stacked_plan
from featcache.protocol.grid import BATCH_SIZES, LEARNING_RATES, LINEAR_EPOCHS
from featcache.protocol.loss_choice import choose_losses


def test_the_shapes_are_those_of_the_groups_loss_all_trains(tmp_path):
    data = load_linear_data(*synthetic_dataset(tmp_path))
    losses, shapes = plan_shapes(data)
    assert losses == choose_losses("all", data.facts)[0]
    groups = stacked_plan(data, [SearchSpec(loss=name) for name in losses])
    assert [(s.heads, s.batch_size, s.losses) for s in shapes] == [
        (g.heads, g.batch_size, len(g.members)) for g in groups]
    # every loss's default grid: one head per learning rate, in one group per batch size
    for batch in BATCH_SIZES:
        assert sum(s.losses for s in shapes if s.batch_size == batch) == len(losses)
    assert sum(s.heads for s in shapes) >= len(losses) * len(LEARNING_RATES) * len(BATCH_SIZES)
    assert {s.epochs for s in shapes} == {LINEAR_EPOCHS}
    assert all(s.steps == len(data.train) // s.batch_size for s in shapes)
    assert all(s.eval_rows == len(data.val) + len(data.test) for s in shapes)
    # the many losses that share the features and the labels stack: fewer groups than losses
    assert len(shapes) < len(losses) * len(BATCH_SIZES)


def test_a_step_is_the_gather_the_faster_layout_of_each_matmul_and_adam():
    train = torch.rand(50, 12, generator=torch.Generator().manual_seed(0))
    found = step_kernels(train, heads=3, batch=8, classes=5, calls=2, repeats=1)
    assert all(value > 0 for value in found.values())
    assert found["step"] == pytest.approx(
        found["gather"] + min(found["forward, per-head bmm"], found["forward, one wide mm"])
        + min(found["gradient, per-head bmm"], found["gradient, one wide mm"])
        + found["adam, one fused call"])


def test_the_floors_add_up_the_plan_by_hand():
    shapes = [GroupShape(losses=2, heads=8, batch_size=4, steps=10, epochs=3, eval_rows=7),
              GroupShape(losses=1, heads=4, batch_size=8, steps=5, epochs=3, eval_rows=7)]
    timings = [{"steps": {(8, 4): {"step": 100.0}, (4, 8): {"step": 50.0}},
                "scores": {8: 1000.0, 4: 400.0}, "sgemm_gflops": 10.0},
               {"steps": {(8, 4): {"step": 300.0}, (4, 8): {"step": 150.0}},
                "scores": {8: 3000.0, 4: 800.0}, "sgemm_gflops": 30.0}]
    found = floors(shapes, timings, cores=2, classes=5, dim=6)
    # mean of the cores: steps 200 and 100 us, scoring 2000 and 600 us
    cpu = 3 * (10 * 200 + 2000) / 1e6 + 3 * (5 * 100 + 600) / 1e6
    assert found["kernel_cpu_seconds"] == pytest.approx(cpu)
    assert found["kernel_floor_seconds"] == pytest.approx(cpu / 2)
    # forward and gradient: 2 x (2 B D L H) per step; scoring: 2 N D L H per epoch
    training = 3 * 10 * 2 * (2 * 4 * 6 * 5 * 8) + 3 * 5 * 2 * (2 * 8 * 6 * 5 * 4)
    scoring = 3 * 2 * 7 * 6 * 5 * 8 + 3 * 2 * 7 * 6 * 5 * 4
    assert found["training_gflop"] == pytest.approx(training / 1e9)
    assert found["scoring_gflop"] == pytest.approx(scoring / 1e9)
    assert found["peak_gflops"] == pytest.approx(40.0)  # the cores' mean, times the cores
    assert found["arithmetic_floor_seconds"] == pytest.approx((training + scoring) / 40e9)
    assert [g["cpu_seconds"] for g in found["groups"]] == pytest.approx(
        [3 * (10 * 200 + 2000) / 1e6, 3 * (5 * 100 + 600) / 1e6])


def test_main_writes_the_floors_beside_the_target(tmp_path, monkeypatch, capsys):
    import benchmarks._common
    import benchmarks.linear_floor as floor

    labels, features = synthetic_dataset(tmp_path)
    monkeypatch.setattr(floor, "synthetic_dataset", lambda size: (labels, features, "toy"))
    monkeypatch.setattr(benchmarks._common, "BENCH_DIR", tmp_path / "bench")
    threads = torch.get_num_threads()
    document = floor.main(["--jobs", "1", "--calls", "1", "--repeats", "1", "--target", "99"])
    assert (tmp_path / "bench" / "linear-floor-cpu.json").exists()
    assert document["cores"] == 1 and document["target_seconds"] == 99
    assert document["kernel_floor_seconds"] == pytest.approx(document["kernel_cpu_seconds"])
    assert [row["what"].split(":")[0] for row in document["table"]] == [
        "target for --loss all (1 core)", "arithmetic floor", "kernel floor"]
    assert "| kernel floor" in capsys.readouterr().out
    assert torch.get_num_threads() == threads, "timing on one thread here leaves the caller's"
