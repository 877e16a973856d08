"""The time said before fine-tuning: measured on training steps of the grid's own batch sizes
(forward, backward, Adam) and evaluation batches, and advice when it is long on a CPU."""

from __future__ import annotations

import torch
from helpers_finetune import fresh_setup

from featcache.finetune import budget as budget_module
from featcache.finetune.budget import SHORT_RUN_STEPS, Budget, measure_seconds, training_steps


def test_the_probe_times_the_grids_own_batch_sizes_with_the_optimizer_step(
        tmp_path_factory, monkeypatch):
    data, start = fresh_setup(tmp_path_factory.getbasetemp())
    probes = []
    real = budget_module._probe

    def spy(start, data, device, precision, batch, train, workers=0):
        probes.append((batch, train))
        return real(start, data, device, precision, batch, train, workers)

    stepped = []
    real_step = torch.optim.Adam.step
    monkeypatch.setattr(budget_module, "_probe", spy)
    monkeypatch.setattr(torch.optim.Adam, "step",
                        lambda self, *a, **k: stepped.append(1) or real_step(self, *a, **k))
    seconds = measure_seconds(start, data, "an", [8, 16, 8], 32, "fp32", torch.device("cpu"))
    assert sorted(probes) == [(8, True), (16, False), (16, True)]  # one probe per batch size
    assert stepped and seconds > 0


def test_a_long_cpu_estimate_says_how_to_shorten_it():
    budget = Budget(configs=8, epochs=10, keep="last", checkpoint_bytes=100, best_bytes=100,
                    seconds=3 * 3600.0, device="cpu", image_size=448, dataset="voc")
    line = budget.line(10**12)
    assert "about 3.0 h (measured on a few steps with their image decoding)" in line
    assert "one configuration (e.g. --lr 1e-4 --batch-size 16): about 22 min" in line
    assert "--image-size 224" in line and "about a quarter" in line
    short = Budget(configs=1, epochs=1, keep="last", checkpoint_bytes=100, best_bytes=100,
                   seconds=120.0, device="cpu", image_size=224, dataset="voc")
    assert "shorten" not in short.line(10**12)
    gpu = Budget(configs=8, epochs=10, keep="last", checkpoint_bytes=100, best_bytes=100,
                 seconds=3 * 3600.0, device="cuda", image_size=448, dataset="voc")
    assert "shorten" not in gpu.line(10**12)


def test_the_probe_decodes_the_runs_own_images_through_its_loader(tmp_path_factory, monkeypatch):
    """The estimate left out decoding (0.73 of the real time at 128 px): its steps now take
    their batches from the run's DataLoader, so each timed step includes reading the images."""
    from featcache.finetune.data import SplitImages

    data, start = fresh_setup(tmp_path_factory.getbasetemp())
    read = []
    real_item = SplitImages.__getitem__
    monkeypatch.setattr(SplitImages, "__getitem__",
                        lambda self, item: read.append(item) or real_item(self, item))
    per_image = budget_module._probe(start, data, torch.device("cpu"), "fp32", 4, train=True)
    assert per_image > 0
    # whole training batches of (row, flip) items (a probe past PROBE_SECONDS stops early)
    assert read and len(read) % 4 == 0 and all(isinstance(item, tuple) for item in read)


def test_cpu_training_leaves_a_core_to_decoding_whatever_the_workers(monkeypatch):
    """On 2 cores, 2 intra-op threads beside a decoding worker spun at their barriers: a
    fine-tuning step took 4x the CPU time of 1 thread. The count does not follow --workers
    (it changes a convolution's numbers)."""
    from featcache import runtime

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 2)
    cpu = torch.device("cpu")
    assert [runtime.training_threads(cpu, workers=w) for w in (0, 1, 8)] == [1, 1, 1]
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 16)
    assert [runtime.training_threads(cpu, workers=w) for w in (0, 1, 8)] == [15, 15, 15]
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)
    assert runtime.training_threads(cpu, workers=0) == 1
    assert runtime.training_threads(torch.device("cuda"), workers=1) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runtime.training_threads(cpu, workers=1) == 3


def test_overwrite_announces_every_configuration_it_will_train_again(tmp_path):
    """`make demo` run twice (--overwrite) said "fine-tuning 0 configurations" and no time:
    the finished configurations of the folder being replaced were counted as done."""
    from featcache.finetune.checkpoint import HISTORY
    from featcache.finetune.run import configs_to_train
    from featcache.protocol.grid import grid_points

    configs = grid_points([1e-4, 1e-3], [16])
    done = tmp_path / "configs" / configs[0].name()
    done.mkdir(parents=True)
    (done / HISTORY).write_text("{}")
    assert configs_to_train(configs, tmp_path, resume=False) == configs
    assert configs_to_train(configs, tmp_path, resume=True) == configs[1:]


def test_a_run_of_a_few_steps_is_not_timed_in_advance():
    """The probes (WARMUP + TIMED steps per batch size, and evaluation's) would cost a large
    share of a run of a few steps, such as the demo's one configuration x one epoch."""
    assert training_steps(240, [16], 1) == 15 <= SHORT_RUN_STEPS < training_steps(240, [16], 2)
    assert training_steps(250, [8, 16], 3) == (31 + 15) * 3
    budget = Budget(configs=1, epochs=1, keep="last", checkpoint_bytes=10, best_bytes=5,
                    short_steps=15)
    assert budget.line(10**9).endswith(
        "; a short run (15 training steps), not timed in advance (timing it would cost a good "
        "part of it)")
