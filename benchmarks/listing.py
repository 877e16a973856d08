"""What ``featcache table`` and ``featcache report`` cost on a set of many classes (issue 45:
on 100,000 classes ``table`` took minutes to print a short table).

One finished linear run of a synthetic set of ``--classes`` classes (60 training and 30 test
images: the cost is the classes', not the images') is trained once under the benchmark folder;
then each command runs ``--repeat`` times in a fresh process: ``table RUNS`` (Markdown),
``table RUNS --format csv`` and ``report DATASET --out FILE``. Wall and CPU seconds (median)
and the output's size are recorded, with the load average. ``--baseline REF`` runs the same
commands with featcache as it was at git revision REF, side by side under the same load.

    python -m benchmarks.listing                        # 100,000 classes, this checkout
    python -m benchmarks.listing --baseline main        # and the code at main, side by side
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import BENCH_DIR, save
from benchmarks.commands import export_revision
from featcache.tables import Table

ROOT = Path(__file__).resolve().parents[1]


def prepare(root: Path, classes: int) -> Path:
    """The dataset folder with its finished run (made once, then reused)."""
    dataset = root / f"listing-{classes}"
    if not (dataset / "runs" / "an" / "bench" / "results.json").is_file():
        sys.path.insert(0, str(ROOT / "tests"))
        from linear_fixtures import synthetic_dataset

        synthetic_dataset(root, dataset.name, n_train=60, n_test=30, classes=classes)
        subprocess.run([sys.executable, "-m", "featcache", "train-linear", "--dataset",
                        dataset.name, "--cache", str(root), "--loss", "an", "--epochs", "1",
                        "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots", "--device",
                        "cpu", "--run-id", "bench"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return dataset


def run_once(args: list[str], pythonpath: str, out: Path) -> dict:
    """``featcache ARGS`` in a fresh process: wall and CPU seconds, bytes written."""
    before = os.times()
    started = time.perf_counter()
    with open(out, "w") as sink:
        done = subprocess.run([sys.executable, "-m", "featcache", *args], stdout=sink,
                              stderr=subprocess.PIPE, text=True, cwd=pythonpath,
                              env={**os.environ, "PYTHONPATH": pythonpath})
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        raise RuntimeError(f"featcache {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return {"wall": wall, "cpu": (after.children_user - before.children_user)
            + (after.children_system - before.children_system)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs per command (median)")
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="also run featcache at this git revision, side by side")
    args = parser.parse_args(argv)
    dataset = prepare((BENCH_DIR / "data").resolve(), args.classes)
    versions = {"this checkout": str(ROOT)}
    table = Table(["command", "featcache", "wall s (median)", "CPU s (median)", "output bytes",
                   "load before"],
                  formats={"wall s (median)": "{:.2f}", "CPU s (median)": "{:.2f}",
                           "load before": "{:.1f}"})
    document = {"benchmark": "listing", "classes": args.classes, "cpu_count": os.cpu_count(),
                "repeat": args.repeat, "baseline": args.baseline, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            versions[f"at {args.baseline}"] = str(export_revision(args.baseline, Path(tmp)))
        report = Path(tmp) / "report.html"
        commands = {"table": ["table", str(dataset / "runs")],
                    "table csv": ["table", str(dataset / "runs"), "--format", "csv"],
                    "report": ["report", str(dataset), "--out", str(report), "--overwrite"]}
        for name, command in commands.items():
            for version, path in versions.items():  # side by side: same command, both codes
                load = os.getloadavg()[0]
                printed = Path(tmp) / "stdout"
                runs = [run_once(command, path, printed) for _ in range(args.repeat)]
                size = (report if name == "report" else printed).stat().st_size
                row = {"command": name, "featcache": version, "load_before": round(load, 2),
                       "wall_median": statistics.median(r["wall"] for r in runs),
                       "cpu_median": statistics.median(r["cpu"] for r in runs),
                       "output_bytes": size}
                document["rows"].append(row)
                table.add(name, version, row["wall_median"], row["cpu_median"], size, load)
                print(f"  {name} ({version}): {row['wall_median']:.2f} s wall, "
                      f"{row['cpu_median']:.2f} CPU-s, {size} bytes, load {load:.1f}", flush=True)
    print(table.markdown())
    document["table"] = table.records()
    path = save("listing", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
