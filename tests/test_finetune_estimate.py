"""The time said before fine-tuning: measured on training steps of the grid's own batch sizes
(forward, backward, Adam) and evaluation batches, and advice when it is long on a CPU."""

from __future__ import annotations

import torch
from helpers_finetune import fresh_setup

from featcache.finetune import budget as budget_module
from featcache.finetune.budget import Budget, measure_seconds


def test_the_probe_times_the_grids_own_batch_sizes_with_the_optimizer_step(
        tmp_path_factory, monkeypatch):
    data, start = fresh_setup(tmp_path_factory.getbasetemp())
    probes = []
    real = budget_module._probe

    def spy(start, data, device, precision, batch, train):
        probes.append((batch, train))
        return real(start, data, device, precision, batch, train)

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
    assert "about 3.0 h of compute" in line
    assert "one configuration (e.g. --lr 1e-4 --batch-size 16): about 22 min" in line
    assert "--image-size 224" in line and "about a quarter" in line
    short = Budget(configs=1, epochs=1, keep="last", checkpoint_bytes=100, best_bytes=100,
                   seconds=120.0, device="cpu", image_size=224, dataset="voc")
    assert "shorten" not in short.line(10**12)
    gpu = Budget(configs=8, epochs=10, keep="last", checkpoint_bytes=100, best_bytes=100,
                 seconds=3 * 3600.0, device="cuda", image_size=448, dataset="voc")
    assert "shorten" not in gpu.line(10**12)
