"""Helpers shared by the benchmarks: machine description and result files under cache/bench/."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from pathlib import Path

import torch

from featcache.fileio import write_json_atomic

BENCH_DIR = Path(os.environ.get("FEATCACHE_BENCH_DIR", "cache/bench"))


def machine(device: torch.device | str) -> dict:
    """What the figures were measured on."""
    device = torch.device(device)
    info = {
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "load": load_note(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def describe(info: dict) -> str:
    """One line naming the machine."""
    if "gpu" in info:
        return f"{info['gpu']} (torch {info['torch']})"
    return f"{info['cpu_count']}-core CPU, {info['torch_threads']} torch threads (torch {info['torch']})"


def save(name: str, document: dict, path: str | os.PathLike | None = None) -> Path:
    """Write a benchmark's figures to ``path`` (default cache/bench/<name>.json)."""
    return write_json_atomic(Path(path) if path else BENCH_DIR / f"{name}.json", document)


def synchronize(device: torch.device) -> None:
    """Wait for the device (a GPU runs asynchronously: time only finished work)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steady_rate(batches, work, warmup: int, timed: int, device: torch.device) -> dict:
    """Images/s of ``work(batch) -> images`` over ``timed`` batches after ``warmup`` untimed ones
    (worker start-up, cuDNN autotuning, allocator growth, nvJPEG start-up are paid there)."""
    iterator = iter(batches)
    for _ in range(warmup):
        work(next(iterator))
    synchronize(device)
    images, started = 0, time.perf_counter()
    for _ in range(timed):
        images += work(next(iterator))
    synchronize(device)
    seconds = time.perf_counter() - started
    return {"images_per_s": images / seconds, "images": images, "seconds": seconds,
            "warmup_batches": warmup, "timed_batches": timed}


def load_note() -> str:
    """The machine's load when a benchmark starts (other jobs distort CPU figures)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"
