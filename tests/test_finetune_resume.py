"""Checkpoints: a run interrupted and resumed ends exactly like an uninterrupted one."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_finetune import NAME, copy_cache, finetune

from featcache.finetune import loop

ARGS = ("--loss", "role", "--epochs", "2", "--lr", "1e-3,1e-4", "--bsize", "4")
TIMING = ("seconds", "train_seconds", "eval_seconds", "images_per_second")


def _metrics(run_dir):
    """results.json's per-configuration records without the timings."""
    configs = json.loads((run_dir / "results.json").read_text())["configs"]
    for config in configs:
        config.pop("seconds")
        for epoch in config["epochs"]:
            for key in TIMING:
                epoch.pop(key, None)
    return configs


class Interrupted(Exception):
    pass


def _interrupt_after(monkeypatch, saves: int) -> None:
    """Raise right after the ``saves``-th checkpoint is written (as a crash would)."""
    real, count = loop.save_checkpoint, [0]

    def save_then_maybe_crash(path, payload):
        real(path, payload)
        count[0] += 1
        if count[0] == saves:
            raise Interrupted(f"injected interruption after checkpoint {saves}")

    monkeypatch.setattr(loop, "save_checkpoint", save_then_maybe_crash)


@pytest.fixture
def cache(tmp_path_factory, tmp_path):
    return copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")


def test_resume_after_an_interruption_equals_an_uninterrupted_run(cache, monkeypatch):
    assert finetune(cache, *ARGS, "--run-id", "whole").exit_code == 0
    root = cache / NAME / "finetune" / "role"

    # Interrupted in the second configuration, after its first epoch's checkpoint.
    _interrupt_after(monkeypatch, 3)
    with pytest.raises(Interrupted):
        finetune(cache, *ARGS, "--run-id", "cut")
    cut = root / "cut"
    assert not (cut / "results.json").exists()
    assert (cut / "configs" / "lr0.001-bs4" / "history.json").is_file()
    assert (cut / "configs" / "lr0.0001-bs4" / "checkpoint.pt").is_file()
    monkeypatch.undo()

    refused = finetune(cache, *ARGS, "--run-id", "cut")
    assert refused.exit_code == 1 and "--resume" in refused.output
    result = finetune(cache, *ARGS, "--resume")  # the newest unfinished run
    assert result.exit_code == 0, result.output
    assert _metrics(cut) == _metrics(root / "whole")
    whole = torch.load(root / "whole" / "best.pt", weights_only=True)
    resumed = torch.load(cut / "best.pt", weights_only=True)
    assert (whole["lr"], whole["epoch"]) == (resumed["lr"], resumed["epoch"])
    assert torch.equal(whole["handoff"]["phi"], resumed["handoff"]["phi"])
    for key, tensor in whole["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key
    assert not (cut / "configs" / "lr0.0001-bs4" / "checkpoint.pt").exists()  # cleaned up


def test_resume_refuses_an_incompatible_or_broken_checkpoint(cache, monkeypatch):
    _interrupt_after(monkeypatch, 1)
    with pytest.raises(Interrupted):
        finetune(cache, *ARGS, "--run-id", "cut")
    monkeypatch.undo()
    other = finetune(cache, "--loss", "role", "--epochs", "3", "--lr", "1e-3,1e-4", "--bsize", "4",
                     "--resume", "--run-id", "cut")
    assert other.exit_code == 1
    assert "cannot resume" in other.output and "epochs: 2 -> 3" in other.output

    checkpoint = cache / NAME / "finetune" / "role" / "cut" / "configs" / "lr0.001-bs4" / "checkpoint.pt"
    checkpoint.write_bytes(b"not a checkpoint")
    broken = finetune(cache, *ARGS, "--resume", "--run-id", "cut")
    assert broken.exit_code == 1 and "corrupt" in broken.output and str(checkpoint) in broken.output

    nothing = finetune(cache, "--loss", "an", "--init", "none", "--weights", "random", "--resume")
    assert nothing.exit_code == 1 and "no unfinished fine-tuning run" in nothing.output
