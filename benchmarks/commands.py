"""How long the metadata commands take as a user runs them: ``featcache losses``,
``backbones``, ``info``, ``table`` and ``--help``, each in a fresh process.

For each command: the wall time and the CPU time (user + system) of the process, the median of
``--repeat`` runs, its ``python -X importtime`` total (the sum of the top-level imports) and
whether it imported torch. ``--baseline REF`` runs the same commands with featcache as it was at
git revision REF (exported to a temporary folder and put first on PYTHONPATH), side by side in
the same run, so that a saving is measured against the code before it under the same load.
The load average is recorded before and after every command: on a shared machine the CPU time
is the steadier figure.

    python -m benchmarks.commands                       # this checkout
    python -m benchmarks.commands --baseline c483152    # and the code at c483152, side by side
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import BENCH_DIR, save
from featcache.tables import Table

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import sys\nfrom featcache.cli import cli\ntry:\n    cli.main(sys.argv[1:], "
         "prog_name='featcache')\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
         "sys.stderr.write('TORCH %d\\n' % ('torch' in sys.modules))\n")


def inputs(root: Path) -> dict[str, list[str]]:
    """The commands, with a small labels and features file and one finished run to read."""
    dataset = root / "cmd-bench"
    if not (dataset / "runs").exists():
        sys.path.insert(0, str(ROOT / "tests"))
        from linear_fixtures import synthetic_dataset

        synthetic_dataset(root, "cmd-bench")
        subprocess.run([sys.executable, "-m", "featcache", "train-linear", "--dataset",
                        "cmd-bench", "--cache", str(root), "--loss", "an", "--epochs", "1",
                        "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots", "--device",
                        "cpu", "--run-id", "bench"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {"--help": ["--help"], "losses": ["losses"], "losses an": ["losses", "an"],
            "backbones": ["backbones"], "info": ["info", str(dataset)],
            "table": ["table", str(dataset / "runs")]}


def run_once(args: list[str], pythonpath: str, importtime: bool = False) -> dict:
    """One fresh process running ``featcache ARGS``: wall and CPU seconds, torch imported or not."""
    flags = ["-X", "importtime"] if importtime else []
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *flags, "-c", PROBE, *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": pythonpath},
                          cwd=pythonpath)  # python -c puts the working folder first on sys.path
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        raise RuntimeError(f"featcache {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    out = {"wall": wall, "cpu": (after.children_user - before.children_user)
           + (after.children_system - before.children_system),
           "torch": re.search(r"^TORCH 1$", done.stderr, re.M) is not None}
    if importtime:  # top-level imports (no indentation before the name) summed, microseconds
        top = re.findall(r"^import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", done.stderr, re.M)
        out["import_seconds"] = sum(int(cumulative) for cumulative, _ in top) / 1e6
    return out


def measure(name: str, args: list[str], pythonpath: str, repeat: int) -> dict:
    load_before = os.getloadavg()[0]
    runs = [run_once(args, pythonpath) for _ in range(repeat)]
    imports = run_once(args, pythonpath, importtime=True)
    return {"command": "featcache " + " ".join(args), "wall_median": statistics.median(
        r["wall"] for r in runs), "cpu_median": statistics.median(r["cpu"] for r in runs),
            "walls": [round(r["wall"], 3) for r in runs], "cpus": [round(r["cpu"], 3) for r in runs],
            "import_seconds": imports["import_seconds"], "imports_torch": imports["torch"],
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def export_revision(revision: str, target: Path) -> Path:
    """featcache as it was at ``revision``, exported under ``target``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "featcache"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (median)")
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="also run featcache at this git revision, side by side")
    args = parser.parse_args(argv)
    commands = inputs((BENCH_DIR / "data").resolve())
    versions = {"this checkout": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            versions[f"at {args.baseline}"] = str(export_revision(args.baseline, Path(tmp)))
        table = Table(["command", "featcache", "wall s (median)", "CPU s (median)",
                       "imports s", "torch", "load before"],
                      formats={"wall s (median)": "{:.2f}", "CPU s (median)": "{:.2f}",
                               "imports s": "{:.2f}", "load before": "{:.1f}"})
        document = {"benchmark": "commands", "cpu_count": os.cpu_count(), "repeat": args.repeat,
                    "baseline": args.baseline, "rows": []}
        for name, command in commands.items():
            for version, path in versions.items():  # side by side: same command, both codes
                row = measure(name, command, path, args.repeat)
                row["featcache"] = version
                document["rows"].append(row)
                table.add(name, version, row["wall_median"], row["cpu_median"],
                          row["import_seconds"], "yes" if row["imports_torch"] else "no",
                          row["load_before"])
                print(f"  {name} ({version}): {row['wall_median']:.2f} s wall, "
                      f"{row['cpu_median']:.2f} CPU-s, load {row['load_before']:.1f}", flush=True)
    print(table.markdown())
    document["table"] = table.records()
    path = save("commands", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
