"""--keep-checkpoints and the budget said before fine-tuning starts: what stays on disk, how
large it is (checked against the files written), and an early refusal when it cannot fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers_finetune import NAME, ROLE_ONE_CONFIG, copy_cache, finetune, shared_run
from test_finetune_resume import _metrics

from featcache import fileio
from featcache.finetune import loop
from featcache.finetune.budget import Budget, plan_budget
from featcache.finetune.checkpoint import load_checkpoint
from featcache.finetune.data import load_finetune_data
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.start import resolve_start
from featcache.runtime import single_process

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)

GRID = ROLE_ONE_CONFIG
CONFIG = "lr0.001-bs4"


@pytest.fixture
def cache(tmp_path_factory, tmp_path):
    return copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")


def test_keep_all_keeps_every_epoch_and_keep_best_none_yet_resumes_to_the_same_numbers(
        cache, monkeypatch, tmp_path_factory):
    # trained once per session (test_faults_interrupt compares a stopped and resumed run with it)
    every = shared_run(tmp_path_factory.getbasetemp(), "all", *GRID, "--keep-checkpoints", "all")
    root = cache / NAME / "finetune" / "role"
    config_dir = every.run_dir / "configs" / CONFIG
    assert sorted(p.name for p in config_dir.glob("*.pt")) == ["epoch-001.pt", "epoch-002.pt"]
    for epoch in (1, 2):
        path = config_dir / f"epoch-{epoch:03d}.pt"
        identity = torch.load(path, weights_only=True)["identity"]
        assert load_checkpoint(path, identity)["epoch"] == epoch
    assert "--keep-checkpoints all keeps every epoch's checkpoint and the best weights" in every.output

    # The budget's sizes are those of the files written.
    data = load_finetune_data(cache / NAME / "labels.h5")
    start = resolve_start(FinetuneOptions(dataset=NAME, loss="role", init=str(
        cache / NAME / "runs" / "role" / "linear-role"), cache=str(cache)), data,
        single_process(torch.device("cpu")))
    budget = plan_budget(start, data, "role", identity["params"], 1, 2, "all")
    written = (config_dir / "epoch-001.pt").stat().st_size
    assert abs(budget.checkpoint_bytes - written) / written < 0.02
    best = (every.run_dir / "best.pt").stat().st_size
    assert abs(budget.best_bytes - best) / best < 0.02

    # best: no training checkpoint at all; an interrupted configuration starts over on --resume.
    calls = {"n": 0}
    real = loop.ConfigTrainer.run_epoch

    def crash_in_second_epoch(self, epoch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected crash")
        return real(self, epoch)

    monkeypatch.setattr(loop.ConfigTrainer, "run_epoch", crash_in_second_epoch)
    with pytest.raises(RuntimeError, match="injected crash"):
        finetune(cache, *GRID, "--run-id", "best", "--keep-checkpoints", "best")
    monkeypatch.undo()
    assert not list((root / "best" / "configs").rglob("*.pt"))
    resumed = finetune(cache, *GRID, "--run-id", "best", "--keep-checkpoints", "best", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert _metrics(root / "best") == _metrics(every.run_dir)
    assert sorted(p.name for p in (root / "best").rglob("*.pt")) == ["best.pt"]


def test_the_budget_is_said_first_and_a_disk_too_small_is_refused_before_the_run_folder(
        cache, monkeypatch):
    real = fileio.shutil.disk_usage
    monkeypatch.setattr(fileio.shutil, "disk_usage", lambda path: SimpleNamespace(free=300_000_000)
                        if "finetune" in str(path) or "cache" in str(path) else real(path))

    def not_for_a_short_run(*args, **kwargs):
        raise AssertionError("a run of a few steps is not timed in advance")

    monkeypatch.setattr("featcache.finetune.run.measure_seconds", not_for_a_short_run)
    refused = finetune(cache, *GRID, "--run-id", "small")
    assert refused.exit_code == 1
    lines = refused.output.splitlines()
    budget = next(line for line in lines if line.startswith("fine-tuning 1 configuration x 2"))
    assert "--keep-checkpoints last keeps the latest epoch's checkpoint and the best weights" in budget
    assert "300.0 MB free" in budget and "training steps), not timed in advance" in budget
    error = next(line for line in lines if line.startswith("Error: "))
    assert "not enough free space in" in error and "for the checkpoints of this run" in error
    assert "--keep-checkpoints best needs the least" in error and "300.0 MB free" in error
    assert not (cache / NAME / "finetune" / "role" / "small").exists()
    # the best weights alone fit: --keep-checkpoints best trains
    fits = finetune(cache, *GRID[:3], "1", *GRID[4:], "--run-id", "small", "--keep-checkpoints",
                    "best")
    assert fits.exit_code == 0, fits.output


def test_peak_disk_of_each_policy():
    budget = Budget(configs=3, epochs=4, keep="last", checkpoint_bytes=300, best_bytes=100)
    assert budget.peak_bytes == 2 * 100 + 2 * 300  # a replaced file exists twice for a moment
    budget.keep = "best"
    assert budget.peak_bytes == 2 * 100
    budget.keep = "all"
    assert budget.peak_bytes == 2 * 100 + (3 * 4 + 1) * 300
