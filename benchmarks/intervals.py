"""Intervals and paired comparisons at VOC size: ``featcache table --ci --versus an`` over
every loss of one run, and ``featcache report`` beside the report of the code before them.

The data is benchmarks.linear's VOC-sized set (5,823 test images, 20 classes, 2,048-d; the
real VOC2012 label matrices when the shared data is there), trained once with ``--loss all``
(one configuration, one epoch: the scores are what is timed, not the training; the runs are
kept under cache/bench/data and reused). Then, each in a fresh process as a user runs it,
the median of ``--repeat`` runs (wall and CPU seconds, and whether torch was imported):

1. ``featcache table RUNS`` (no intervals: the part every table pays);
2. ``featcache table RUNS --ci --versus an --resamples R`` (the target: <= 10 s on 2 cores for
   31 losses and 1,000 resamples);
3. ``featcache report DATASET --runs bench-ci``, with ``--baseline REF`` also with featcache
   at git revision REF (before the intervals), side by side (the target: no more than twice
   that).

    python -m benchmarks.intervals                     # VOC-sized, --loss all, 1,000 resamples
    python -m benchmarks.intervals --baseline main     # + the report of the code at main
    python -m benchmarks.intervals --size tiny         # a check that it all runs (a minute)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks._common import BENCH_DIR, describe, machine, save
from benchmarks.commands import export_revision, measure
from featcache.tables import Table

ROOT = Path(__file__).resolve().parents[1]
RUN_ID = "bench-ci"


def dataset(size: str) -> Path:
    """The labels file of the benchmark's data set (built once)."""
    if size == "voc":
        from benchmarks.linear import synthetic_dataset

        return synthetic_dataset("voc")[0]
    sys.path.insert(0, str(ROOT / "tests"))
    from linear_fixtures import synthetic_dataset as small_dataset

    root = (BENCH_DIR / "data").resolve()
    if not (root / "ci-tiny" / "labels.h5").is_file():
        small_dataset(root, "ci-tiny", n_train=300, n_test=200, classes=6, dim=32)
    return root / "ci-tiny" / "labels.h5"


def train_runs(labels_path: Path, losses: str) -> list[Path]:
    """Every loss of ``losses`` trained once (one configuration, one epoch) under run id
    bench-ci; finished runs with the same settings are reused."""
    from featcache.linear.options import LinearOptions
    from featcache.linear.run import run_linear

    options = LinearOptions(dataset=labels_path.parent.name, losses=losses, run_id=RUN_ID,
                            cache=str(labels_path.parent.parent), epochs=1,
                            learning_rates=[1e-3], batch_sizes=[16], plots=False,
                            progress=False, device="cpu")
    outcome = run_linear(options, say=lambda line: None)
    return [run.run_dir for run in outcome.runs]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("voc", "tiny"), default="voc")
    parser.add_argument("--losses", default="all", help="the losses trained (--loss)")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median)")
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="also write the report with featcache at this git revision")
    args = parser.parse_args(argv)
    info = machine("cpu")
    labels_path = dataset(args.size).resolve()  # the baseline runs from its own folder
    runs = train_runs(labels_path, args.losses)
    root = labels_path.parent
    print(f"machine: {describe(info)}; {args.size}-sized data, {len(runs)} runs under "
          f"{root / 'runs'} (run id {RUN_ID})", flush=True)
    table_args = ["table", str(root / "runs"), "--run-id", RUN_ID]
    with tempfile.TemporaryDirectory() as tmp:
        report_args = ["report", str(root), "--runs", RUN_ID, "--out",
                       str(Path(tmp) / "report.html"), "--overwrite"]
        commands = [("table", table_args, "this checkout", str(ROOT)),
                    ("table --ci --versus an", [*table_args, "--ci", "--versus", "an",
                                                "--resamples", str(args.resamples)],
                     "this checkout", str(ROOT)),
                    ("report", report_args, "this checkout", str(ROOT))]
        if args.baseline:
            commands.append(("report", report_args, f"at {args.baseline}",
                             str(export_revision(args.baseline, Path(tmp)))))
        figures = Table(["command", "featcache", "wall s (median)", "CPU s (median)", "torch",
                         "load before"],
                        formats={"wall s (median)": "{:.2f}", "CPU s (median)": "{:.2f}",
                                 "load before": "{:.1f}"})
        document = {"benchmark": "intervals", "size": args.size, "runs": len(runs),
                    "resamples": args.resamples, "machine": info, "rows": []}
        for name, command, version, path in commands:
            row = measure(name, command, path, args.repeat) | {"featcache": version}
            document["rows"].append(row)
            figures.add(name, version, row["wall_median"], row["cpu_median"],
                        "yes" if row["imports_torch"] else "no", row["load_before"])
            print(f"  {name} ({version}): {row['wall_median']:.2f} s wall, "
                  f"{row['cpu_median']:.2f} CPU-s, load {row['load_before']:.1f}", flush=True)
    reports = [row for row in document["rows"] if row["command"].startswith("featcache report")]
    if len(reports) == 2:
        document["report_ratio"] = reports[0]["wall_median"] / reports[1]["wall_median"]
        print(f"  report: {document['report_ratio']:.2f} x the baseline's wall time")
    print(figures.markdown())
    document["table"] = figures.records()
    print(f"figures written to {save('intervals', document)} ({os.cpu_count()} CPUs)")
    return document


if __name__ == "__main__":
    main()
