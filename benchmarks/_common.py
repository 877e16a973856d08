"""Helpers shared by the benchmarks: machine description and result files under cache/bench/."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks import record
from benchmarks.window import BatchTap, account, check_window, closes, drain
from featcache import __version__
from featcache.errors import FeatcacheError
from featcache.fileio import write_json_atomic

BENCH_DIR = Path(os.environ.get("FEATCACHE_BENCH_DIR", "cache/bench"))


def machine(device: torch.device | str) -> dict:
    """What the figures were measured on, and with which code."""
    device = torch.device(device)
    info = {
        "featcache": __version__,
        "commit": record.checkout_commit(),
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


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Environment variables set to ``values`` while it is open, as they were afterwards."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def describe(info: dict) -> str:
    """One line naming the machine."""
    if "gpu" in info:
        return f"{info['gpu']} (torch {info['torch']})"
    return f"{info['cpu_count']}-core CPU, {info['torch_threads']} torch threads (torch {info['torch']})"


def save(name: str, document: dict, path: str | os.PathLike | None = None) -> Path:
    """Write a benchmark's figures to ``path`` (default cache/bench/<name>.json), and append
    their rows to the benchmark record when $FEATCACHE_BENCH_RECORD names it
    (:mod:`benchmarks.record`)."""
    written = write_json_atomic(Path(path) if path else BENCH_DIR / f"{name}.json", document)
    record.keep(document, written)
    return written


def synchronize(device: torch.device) -> None:
    """Wait for the device (a GPU runs asynchronously: time only finished work)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steady_rate(batches, work, warmup: int, timed: int, device: torch.device,
                tap: BatchTap | None = None, what: str = "the benchmark") -> dict:
    """Images/s of ``work(batch) -> images`` over ``timed`` batches after ``warmup`` untimed ones
    (worker start-up, cuDNN autotuning, allocator growth, nvJPEG start-up are paid there).

    ``batches`` fed by a DataLoader come with its :class:`~benchmarks.window.BatchTap` (batch i
    of ``batches`` is the loader's batch i): the window is then an honest one
    (:mod:`benchmarks.window`): refused when too short for the loader's workers, opened on a
    drained queue; the figure is the workers' own pace when the consumer waited for them (it
    does not depend on where the window's ends fall among their bursts, nor on a queue filled
    before), else the rate the consumer took batches at, refused when the queue fell and the
    workers made batches more than 10 % slower than that (the window drew on a queue filled
    before it).
    """
    if tap is not None:
        check_window(timed, tap.workers)
    iterator = iter(batches)
    for _ in range(warmup):
        work(_take(iterator, what))
    drained = drain(iterator, tap) if tap is not None else 0
    synchronize(device)
    images, count, opened = 0, 0, time.monotonic()
    while count < timed or (tap is not None and not closes(tap, count, timed)):
        images += work(_take(iterator, what))
        count += 1
    synchronize(device)
    closed = time.monotonic()
    seconds = closed - opened
    result = {"images_per_s": images / seconds, "images": images, "seconds": seconds,
              "warmup_batches": warmup, "timed_batches": count}
    if tap is not None:
        result["window"] = account(tap, warmup, drained, count, (opened, closed), images, what)
        result["images_per_s"] = result["window"]["images_per_s"]
    return result


def _take(iterator, what: str):
    try:
        return next(iterator)
    except StopIteration:
        raise FeatcacheError(f"{what}: the generated images ran out before the timed window "
                             "ended (please report this)") from None


def load_note() -> str:
    """The machine's load when a benchmark starts (other jobs distort CPU figures)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def _busy_cpu_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot (Linux /proc/stat)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:  # pragma: no cover - not Linux
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Busy:
    """Wall time of a block and the CPU time other processes took meanwhile (a measurement
    on a shared machine is only as good as that number is small)."""

    def __enter__(self) -> Busy:
        self.load = os.getloadavg()[0]
        self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall, busy, own = self._start
        self.seconds = time.perf_counter() - wall
        self.others = max(0.0, (_busy_cpu_seconds() - busy) - (_own_cpu_seconds() - own))

    def record(self) -> dict:
        return {"seconds": self.seconds, "other_processes_cpu_seconds": round(self.others, 2),
                "load_before": round(self.load, 2)}

    def note(self) -> str:
        return (f"other processes used {self.others:.1f} CPU-s during these {self.seconds:.1f} s "
                f"(load {self.load:.2f} before)")


def tree_memory(pid: int, fields: tuple[str, ...] = ("Rss", "Pss")) -> tuple[int, ...]:
    """Sums in bytes of ``fields`` of /proc/PID/smaps_rollup (default: RSS and PSS) over process
    ``pid`` and its descendants (Linux). ``Pss_Anon`` leaves out the libraries' file pages, whose
    share of PSS changes with how many other processes map the same files."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    totals = dict.fromkeys(fields, 0)
    todo = [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                name = line.split(":", 1)[0]
                if name in totals:
                    totals[name] += int(line.split()[1]) * 1024
        except OSError:
            continue
    return tuple(totals[field] for field in fields)
