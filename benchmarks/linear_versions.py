"""Stage two's search at this checkout and at another git revision, side by side.

The searches of ``--loss`` (default ``an``: the 8-configuration x 25-epoch grid; several losses,
comma-separated, train stacked as ``--loss all`` trains them) on the VOC-sized data of
``benchmarks.linear`` (``--size``), run by :func:`run_searches` with ``--jobs`` CPU workers. Each
run is a fresh process (imports not timed; a 2-epoch warm-up first, for the allocator and the
workers), and the two versions alternate ``--repeat`` times, so that both meet the same load.
Each run records the wall seconds of the searches, the CPU seconds other processes took
meanwhile, the load before it, and every loss's selected test mAP (the numbers must agree:
a change of speed that moves a number is a change of behaviour).

    python -m benchmarks.linear_versions --baseline c566011            # an, both versions x 5
    python -m benchmarks.linear_versions --baseline c566011 --loss an,an-ls,epr,hill --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._common import Busy, save
from benchmarks.commands import export_revision
from benchmarks.linear import synthetic_dataset
from featcache.tables import Table

ROOT = Path(__file__).resolve().parents[1]
#: the child: the searches of the given losses on the given files, timed after a warm-up
#: (the engine's module moved to featcache.linear.engine; older revisions have it one up)
SEARCH = """
import json, sys, time
try:
    from featcache.linear.engine.search import SearchSpec, run_searches
except ImportError:
    from featcache.linear.search import SearchSpec, run_searches
from featcache.linear.data import load_linear_data
labels, features, losses, jobs = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
data = load_linear_data(labels, features)
run_searches(data, [SearchSpec(loss=loss, epochs=2) for loss in losses], progress=False, jobs=jobs)
started = time.perf_counter()
results = run_searches(data, [SearchSpec(loss=loss) for loss in losses], progress=False, jobs=jobs)
seconds = time.perf_counter() - started
print("RESULT " + json.dumps({"seconds": seconds, "test_map": {
    r.spec.loss: r.selected.best.test_map for r in results}}))
"""


def run_once(path: str, labels: Path, features: Path, losses: str, jobs: int) -> dict:
    """One fresh process of featcache at ``path``: the searches' seconds and selected test mAPs,
    the wall time around the whole process and what other processes took meanwhile."""
    with Busy() as busy:
        done = subprocess.run([sys.executable, "-c", SEARCH, str(labels.resolve()),
                               str(features.resolve()), losses, str(jobs)], cwd=path,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": path})
    if done.returncode:
        raise SystemExit(f"the search at {path} failed:\n{done.stderr}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return {**json.loads(line[len("RESULT "):]), **busy.record()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", metavar="REF", required=True,
                        help="the git revision to run beside this checkout")
    parser.add_argument("--loss", default="an", help="one loss, or several comma-separated")
    parser.add_argument("--size", default="voc", choices=("voc", "coco"))
    parser.add_argument("--jobs", type=int, default=2, help="CPU worker processes")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each version")
    args = parser.parse_args(argv)
    labels, features, source = synthetic_dataset(args.size)
    document: dict = {"benchmark": "linear_versions", "loss": args.loss, "size": args.size,
                      "labels": source, "jobs": args.jobs, "cpu_count": os.cpu_count(),
                      "baseline": args.baseline, "versions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"this checkout": str(ROOT),
                    f"at {args.baseline}": str(export_revision(args.baseline, Path(tmp)))}
        runs: dict[str, list[dict]] = {name: [] for name in versions}
        for index in range(args.repeat):
            for name, path in versions.items():
                found = run_once(path, labels, features, args.loss, args.jobs)
                runs[name].append(found)
                print(f"  {index + 1}/{args.repeat} {name}: {found['seconds']:.2f} s "
                      f"(other processes {found['other_processes_cpu_seconds']:.1f} CPU-s, "
                      f"load {found['load_before']:.2f})", flush=True)
    table = Table(["featcache", "search s (median)", "min", "max", "others CPU-s (median)",
                   "selected test mAP"],
                  formats={"search s (median)": "{:.2f}", "min": "{:.2f}", "max": "{:.2f}",
                           "others CPU-s (median)": "{:.1f}"})
    for name, found in runs.items():
        seconds = [r["seconds"] for r in found]
        maps = {json.dumps(r["test_map"], sort_keys=True) for r in found}
        document["versions"][name] = {"runs": found, "median_seconds": statistics.median(seconds)}
        table.add(name, statistics.median(seconds), min(seconds), max(seconds),
                  statistics.median(r["other_processes_cpu_seconds"] for r in found),
                  "; ".join(f"{k} {v:.4f}" for k, v in found[0]["test_map"].items())
                  + ("" if len(maps) == 1 else " (differs between runs)"))
    first, second = (document["versions"][name]["runs"][0]["test_map"] for name in runs)
    document["same_numbers"] = first == second
    document["table"] = table.records()
    print(table.markdown())
    print("the same selected test mAPs" if first == second else "THE NUMBERS DIFFER")
    path = save(f"linear-versions-{args.loss.replace(',', '+')}", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
