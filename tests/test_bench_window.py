"""The benchmarks' timing windows cannot time a pre-filled queue (benchmarks/window.py).

A loader whose workers take a known time per image (a sleep) has a known top rate; a queue is
filled before the window by a slow warm-up. The drained window measures no more than the top
rate; skipping the drain times the pre-filled queue, and that figure is refused.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import _common
from benchmarks.window import BatchTap, PrefilledWindow
from featcache.errors import OptionError

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SECONDS_PER_IMAGE = 0.005
WORKERS, BATCH, PREFETCH = 3, 4, 4
#: the loader's top rate: each worker makes at most one image per SECONDS_PER_IMAGE
TOP_RATE = WORKERS / SECONDS_PER_IMAGE


class SlowImages(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int):
        time.sleep(SECONDS_PER_IMAGE)
        return torch.tensor(index)


def tapped_loader() -> BatchTap:
    return BatchTap(DataLoader(SlowImages(), batch_size=BATCH, num_workers=WORKERS,
                               prefetch_factor=PREFETCH))


def slow_warmup(pause: float):
    """A work function that lingers over the warm-up batches, so that the queue fills."""
    calls = {"n": 0}

    def work(batch) -> int:
        calls["n"] += 1
        if calls["n"] <= 2:
            time.sleep(pause)
        return len(batch)
    return work


def test_a_drained_window_is_never_faster_than_the_loader():
    tap = tapped_loader()
    result = _common.steady_rate(tap, slow_warmup(0.3), 2, 12, torch.device("cpu"), tap=tap)
    window = result["window"]
    assert window["queue_depth"] == WORKERS * PREFETCH and window["drained_batches"] >= 1
    assert window["paced_by"] == "loader"  # the consumer waited: the figure is the workers' pace
    assert result["images_per_s"] < 1.15 * TOP_RATE, result


def test_timing_a_prefilled_queue_is_refused(monkeypatch):
    """Without the drain (as the benchmarks were), a window of 9 batches after a queue of 12
    filled during a slow warm-up takes every batch from the queue: refused."""
    monkeypatch.setattr(_common, "drain", lambda batches, tap: 0)
    tap = tapped_loader()
    with pytest.raises(PrefilledWindow, match=r"decode only: the consumer took .* images/s while "
                                              r".*: the window drew on batches decoded before it "
                                              r"opened \(\d+ ready when it opened.*pass a larger "
                                              r"--timed"):
        _common.steady_rate(tap, slow_warmup(0.3), 2, 9, torch.device("cpu"), tap=tap,
                            what="decode only")


def test_a_prefilled_queue_the_consumer_waits_past_is_timed_at_the_workers_pace(monkeypatch):
    """Without the drain, a window longer than the queue waits for the workers in the end: the
    figure is then their pace, which no queue filled before the window inflates."""
    monkeypatch.setattr(_common, "drain", lambda batches, tap: 0)
    tap = tapped_loader()
    result = _common.steady_rate(tap, slow_warmup(0.3), 2, 36, torch.device("cpu"), tap=tap)
    window = result["window"]
    assert window["paced_by"] == "loader" and window["decoded_before_window"] >= 6
    assert window["consumed_images_per_s"] > result["images_per_s"]  # the queue inflated that one
    assert result["images_per_s"] < 1.15 * TOP_RATE, result


def test_a_full_queue_that_stays_full_is_a_consumer_bound_window(monkeypatch):
    """When the work, not the loader, is the limit, the queue is as full when the window closes
    as when it opened: nothing timed was paid for before, and the figure stands."""
    monkeypatch.setattr(_common, "drain", lambda batches, tap: 0)
    tap = tapped_loader()

    def work(batch) -> int:  # 4 images in 40 ms: slower than the loader's 4 in 7 ms
        time.sleep(0.04)
        return len(batch)

    result = _common.steady_rate(tap, work, 2, 12, torch.device("cpu"), tap=tap)
    window = result["window"]  # not refused:
    assert window["decoded_before_window"] >= WORKERS  # the queue was full ...
    assert window["ready_after_window"] >= WORKERS  # ... and stayed full
    assert result["images_per_s"] < 1.1 * BATCH / 0.04  # the rate is the work's


class LockstepBatches(Dataset):
    """Workers that take the same time per batch finish together: output comes in bursts."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int):
        if index % BATCH == 0:
            time.sleep(0.08)
        return torch.tensor(index)


def test_workers_in_lockstep_are_timed_by_their_pace_not_by_where_the_window_ends():
    """4 workers that finish together make bursts of 4 batches: 14 batches from the start of a
    burst end just after the third, 14 counted in 3 periods that make 12 (17 % high). The
    workers' own pace is the loader's rate wherever the window's ends fall."""
    tap = BatchTap(DataLoader(LockstepBatches(), batch_size=BATCH, num_workers=4, prefetch_factor=2))
    result = _common.steady_rate(tap, len, 2, 14, torch.device("cpu"), tap=tap)
    top = 4 * BATCH / 0.08
    assert result["window"]["paced_by"] == "loader"
    assert result["images_per_s"] < 1.08 * top, (result, top)


def test_a_window_too_short_for_the_workers_is_refused_before_it_runs():
    tap = tapped_loader()
    with pytest.raises(OptionError, match=r"--timed 8: .* too short for 3 DataLoader workers.*"
                                          r"pass --timed 9 or more"):
        _common.steady_rate(tap, len, 2, 8, torch.device("cpu"), tap=tap)
    assert tap.count == 0  # refused before any batch was asked for


@pytest.mark.parametrize("benchmark", ["extract", "finetune"])
def test_the_benchmarks_refuse_a_short_window_in_one_line(benchmark):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{benchmark}", "--workers", "4",
                           "--timed", "8"], cwd=repo, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(repo)))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: --timed 8: a timed window of 8 batches is too short for 4 DataLoader workers (each "
        "is part-way through a batch when it opens and closes); pass --timed 12 or more"]


@pytest.mark.slow
def test_the_extraction_benchmark_times_every_loader_row_in_an_honest_window(tmp_path):
    """benchmarks.extract on the CPU at a toy size: every row read through a loader carries its
    window (drained, checked), and the device decoder's rows run (decode_jpeg on the CPU)."""
    from benchmarks import extract

    document = extract.main(["--backbone", "resnet18", "--image-size", "32", "--batch-size", "4",
                             "--workers", "1", "--warmup", "1", "--timed", "3", "--gpu-decode",
                             "--skip-baseline", "--data-root", str(tmp_path),
                             "--out", str(tmp_path / "extract.json")])
    figures = document["figures"]
    assert set(figures) == {"forward only", "device decode alone", "decode only, PIL",
                            "end to end, ours (PIL)", "decode only, --gpu-decode",
                            "end to end, ours (--gpu-decode)"}
    for what, figure in figures.items():
        window = figure.get("window")
        if what in ("forward only", "device decode alone"):
            assert window is None
            continue
        assert window["workers"] == 1 and window["queue_depth"] == 2, what
        assert figure["images_per_s"] == window["images_per_s"] > 0, (what, window)
    # one pass per row: warm-up, drain, window and the look after it never ran out of images
    assert document["images"] == 4 * extract.batches_per_row(1, 3, 1)
