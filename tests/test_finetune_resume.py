"""Checkpoints: a run interrupted and resumed ends exactly like an uninterrupted one."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from helpers_finetune import NAME, ROLE_TWO_CONFIGS, copy_cache, finetune, shared_run

from featcache.finetune import loop

pytestmark = pytest.mark.slow  # fine-tunes, stops and resumes a network (`make test-fast` leaves it out)

ARGS = ROLE_TWO_CONFIGS
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


def test_resume_after_an_interruption_equals_an_uninterrupted_run(cache, monkeypatch,
                                                                  tmp_path_factory):
    # the uninterrupted run: trained once per session (test_tensorboard_log reads its logs)
    uninterrupted = shared_run(tmp_path_factory.getbasetemp(), "whole", *ARGS).run_dir
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
    assert _metrics(cut) == _metrics(uninterrupted)
    whole = torch.load(uninterrupted / "best.pt", weights_only=True)
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


def test_resume_with_fewer_visible_gpus_restores_what_matches_and_warns(monkeypatch):
    from featcache.errors import FeatcacheWarning
    from featcache.finetune.checkpoint import restore_rng_states, rng_states

    saved = rng_states()
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(3)]  # written on 3 GPUs
    saved["cuda"] = states
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((device, state)))
    with pytest.warns(FeatcacheWarning, match="3 GPUs and 1 is visible now: restored 1, left 2"):
        restore_rng_states(saved)
    assert [d for d, _ in restored] == [0] and torch.equal(restored[0][1], states[0])

    restored.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # more GPUs than saved: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_rng_states(saved)
    assert [d for d, _ in restored] == [0, 1, 2]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # resumed on the CPU
    with pytest.warns(FeatcacheWarning, match="0 are visible now: restored 0, left 3"):
        restore_rng_states(saved)
    assert torch.equal(torch.get_rng_state(), saved["torch"])
