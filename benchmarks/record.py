"""The benchmark record: every measured figure featcache shows, one JSON object per line.

``benchmarks/record.jsonl`` holds one row per figure: what was measured, its value and unit,
the device and machine, the date, the featcache version and commit, the command that measured
it, its settings and timed window, and the file it came from. ``docs/performance.md`` and the
README's at-a-glance table are rendered from it (between ``<!-- featcache record NAME: begin
-->`` and ``... end -->`` markers), and ``tests/test_generated_docs.py`` fails when a rendered
block differs from what the record gives.

Rows are appended by the benchmarks themselves when ``FEATCACHE_BENCH_RECORD=PATH`` is set
(``make bench RECORD=1`` sets it to this file): :func:`benchmarks._common.save` converts each
benchmark's JSON document with :func:`rows_from_document`. A document measured elsewhere (a
GPU machine's ``make gpu-check`` folder) is added afterwards:

    python -m benchmarks.record add docs/gpu-runs/2026-11-28-h200/gpu-check --command "..."
    python -m benchmarks.record render      # rewrite docs/performance.md and README.md's blocks
    python -m benchmarks.record check       # exit 1 when a rendered block is out of date
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from featcache.fileio import write_text_atomic
from featcache.sections import readme_section, replace_section
from featcache.tables import Table

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "benchmarks" / "record.jsonl"
#: the environment variable that makes every benchmark append its rows (to that file)
RECORD_ENV = "FEATCACHE_BENCH_RECORD"

#: every row's keys, in the order they are written
FIELDS = ("section", "benchmark", "what", "value", "unit", "settings", "window", "device",
          "machine", "date", "featcache", "commit", "recorded_in", "command", "load", "source",
          "glance", "note")
#: keys a row must hold (not None)
REQUIRED = ("section", "benchmark", "what", "value", "unit", "device", "date", "command")
#: the sections of docs/performance.md, in order, and what each says
SECTIONS = {
    "stage one": "Stage one: feature extraction (ResNet-50), images/s in steady state",
    "stage two": "Stage two: linear heads on cached features",
    "stage three": "Stage three: end-to-end fine-tuning (ResNet-50 + head, Adam, AN loss)",
    "demo": "`make demo`",
    "commands": "Commands a user runs often",
    "checksums": "Reading files with their checksums",
    "tests": "The test suite",
}
#: the generated blocks: (document, block name) -> renderer
DOCUMENTS = {"docs/performance.md": ("performance",), "README.md": ("performance-glance",)}


# ------------------------------------------------------------------------------ rows
def row(**values) -> dict:
    """A record row with every field, in :data:`FIELDS` order (missing ones None)."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown record fields: {', '.join(sorted(unknown))}")
    out = {name: values.get(name) for name in FIELDS}
    missing = [name for name in REQUIRED if out[name] is None]
    if missing:
        raise ValueError(f"a record row needs {', '.join(missing)}: {values}")
    return out


def read(path: str | os.PathLike = RECORD) -> list[dict]:
    """Every row of the record, checked (a bad line names its number)."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            found = json.loads(line)
            rows.append(row(**found))
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"{path}, line {number}: {exc}") from None
    return rows


def append(rows: Iterable[dict], path: str | os.PathLike = RECORD) -> int:
    """Append ``rows`` to the record (one JSON object per line); returns how many."""
    lines = [json.dumps(row(**r), ensure_ascii=False) for r in rows]
    if lines:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return len(lines)


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """``python -m benchmarks.extract --device cuda ...``: how a benchmark was run."""
    return shlex.join(["python", "-m", f"benchmarks.{module}",
                       *(sys.argv[1:] if argv is None else argv)])


def checkout_commit() -> str | None:
    """The short commit of this checkout ($FEATCACHE_COMMIT where there is no git)."""
    if os.environ.get("FEATCACHE_COMMIT"):
        return os.environ["FEATCACHE_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def keep(document: dict, source: str | os.PathLike) -> int:
    """Append ``document``'s rows to the record named by $FEATCACHE_BENCH_RECORD, if set
    (the benchmarks call this when they save their JSON file)."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return 0
    added = append(rows_from_document(document, source=_relative(source)), path)
    print(f"{added} rows added to the benchmark record {path}", flush=True)
    return added


def keep_folder(folder: str | os.PathLike, command: str) -> int:
    """Append the rows of a folder's benchmark documents (a gpu-check's) to the record named
    by $FEATCACHE_BENCH_RECORD, if set, each under its own command or else ``command``."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return 0
    added = sum(append(rows_from_document(json.loads(p.read_text(encoding="utf-8")), command,
                                          _relative(p)), path)
                for p in _documents([str(folder)]))
    print(f"{added} rows added to the benchmark record {path}", flush=True)
    return added


# ------------------------------------------------------------------------------ converters
def _relative(path: str | os.PathLike) -> str:
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _context(document: dict, command: str | None, source: str | None,
             commit: str | None) -> dict:
    """The fields every row of one document shares."""
    info = document.get("machine", {})
    device = info.get("gpu") or f"{info.get('cpu_count')}-core {info.get('cpu', 'CPU')} CPU"
    host = f"{info.get('cpu_count')} CPU cores, torch {info.get('torch')}"
    command = document.get("command") or command
    if not command:
        raise SystemExit(f"{source}: the document does not say which command made it: give "
                         "--command")
    return {"device": device, "machine": host, "date": str(info.get("date", ""))[:10] or None,
            "featcache": info.get("featcache"), "commit": info.get("commit") or commit,
            "command": command, "load": info.get("load"), "source": source}


#: rows timed without a DataLoader (the others' windows are checked by benchmarks/window.py)
NO_LOADER = ("forward only", "device decode alone", "compute only")


def _window(what: str, result: dict) -> str:
    """A timed window in a few words (benchmarks/window.py's account, where there is one)."""
    timed = f"{result['timed_batches']} timed batches after {result['warmup_batches']}"
    window = result.get("window")
    if what.startswith(NO_LOADER):
        return f"{timed}, no loader"
    if window is None:
        return (f"{timed}; the window was not checked (before benchmarks/window.py): a queue "
                "filled before it may inflate the rate")
    return (f"{timed}, queue of {window['queue_depth']} drained, paced by "
            f"{window['paced_by']}")


def _extract_rows(document: dict, shared: dict) -> list[dict]:
    settings = document["settings"]
    size = settings["image_size"]
    text = (f"{size} px, batch {settings['batch_size']}, {settings['workers']} workers, "
            f"{settings['precision']}" + (", --jpeg-draft" if settings.get("jpeg_draft") else ""))
    out = []
    for what, result in document["figures"].items():
        what = what.replace("end to end, baseline", "end to end, plain loop")
        headline = what.startswith("end to end")
        out.append(row(section="stage one", benchmark="extract", what=what,
                       value=result["images_per_s"], unit="img/s", settings=text,
                       window=_window(what, result),
                       glance=f"stage one, {size} px, {what}" if headline else None, **shared))
    for what, ratio in document.get("ratio", {}).items():
        out.append(row(section="stage one", benchmark="extract", what=f"{what} / plain loop",
                       value=ratio, unit="x", settings=text, **shared))
    if document.get("pil_ms_per_image_per_core"):
        out.append(row(section="stage one", benchmark="extract",
                       what=f"PIL decode + resize to {size} px, per image and core",
                       value=document["pil_ms_per_image_per_core"], unit="ms", settings=text,
                       **shared))
    return out


def _finetune_rows(document: dict, shared: dict) -> list[dict]:
    settings = document["settings"]
    out = []
    for figure in document["figures"]:
        text = (f"{settings['image_size']} px, batch {figure['batch_size']}, "
                f"{settings['workers']} workers, {settings['precision']}"
                + (", compiled" if settings.get("compile") else ""))
        results = [(f"{what}, ours", result) for what, result in figure["ours"].items()]
        if figure.get("baseline"):
            results.append(("end to end, plain loop", figure["baseline"]))
        for what, result in results:
            out.append(row(section="stage three", benchmark="finetune", what=what,
                           value=result["images_per_s"], unit="img/s", settings=text,
                           window=_window(what, result),
                           glance=(f"stage three, batch {figure['batch_size']}, {what}"
                                   if what.startswith("end to end") else None), **shared))
        if figure.get("ratio"):
            out.append(row(section="stage three", benchmark="finetune",
                           what="end to end, ours / plain loop", value=figure["ratio"], unit="x",
                           settings=text, **shared))
    return out


def _table_rows(document: dict, shared: dict, benchmark: str) -> list[dict]:
    """Rows of a stage-two benchmark's printed table (``document["table"]``: what, seconds,
    speed-up)."""
    out = []
    for entry in document.get("table", []):
        what = entry["what"]
        if entry.get("seconds") is None:
            continue
        out.append(row(section="stage two", benchmark=benchmark, what=what,
                       value=entry["seconds"], unit="s", settings="VOC-sized features",
                       **shared))
        if entry.get("speed-up"):
            out.append(row(section="stage two", benchmark=benchmark,
                           what=f"featcache's search against {what}", value=entry["speed-up"],
                           unit="x", settings="VOC-sized features", **shared))
    if benchmark == "linear_floor" and document.get("times_kernel_floor"):
        which = f"--loss {document.get('loss', 'all')}"
        out.append(row(section="stage two", benchmark=benchmark,
                       what=f"the whole {which} command over its kernel floor",
                       value=document["times_kernel_floor"], unit="x",
                       settings="VOC-sized features", **shared))
    return out


def _gpu_check_rows(document: dict, shared: dict, folder: Path | None) -> list[dict]:
    """A gpu-check's own figures (fine-tuning's compile cost, stage two's timing rows) and
    its benchmarks' rows where their JSON files are not beside it (older runs)."""
    out = []
    for result in document["results"]:
        name, numbers = result["name"], result.get("numbers") or {}
        if result["status"] != "pass":
            continue
        if name == "fine-tune: --compile":
            out.append(row(section="stage three", benchmark="gpu_check",
                           what="--compile: compiling, paid once", unit="s",
                           value=numbers["compile_seconds_estimate"],
                           settings=f"shapes dataset, batch {document['sizes']['finetune_batch']}",
                           window="first epoch less the second", **shared))
        elif name == "benchmark: stage two":
            for key, seconds in numbers["seconds"].items():
                what = {"search": "the default an search (8 configurations x 25 epochs)",
                        "command": "the whole featcache train-linear --loss an command",
                        "all_losses": "featcache train-linear --loss all"}[key]
                out.append(row(section="stage two", benchmark="gpu_check", what=what,
                               value=seconds, unit="s", settings="VOC-sized features",
                               glance=f"stage two, {what}", **shared))
        elif name.startswith("benchmark: extraction") or name == "benchmark: fine-tuning":
            kind = "finetune" if "fine-tuning" in name else "extract"
            size = numbers["settings"].get("image_size")
            beside = f"bench-{kind}" + (f"-{size}" if kind == "extract" else "") + ".json"
            if folder is not None and (folder / beside).is_file():
                continue  # its own document gives the rows, with their windows
            out += _gpu_check_benchmark(kind, numbers, shared)
    return out


def _gpu_check_benchmark(kind: str, numbers: dict, shared: dict) -> list[dict]:
    settings = numbers["settings"]
    window = ("the timed window was not checked (before benchmarks/window.py): the queue "
              "filled before it may inflate decoding rows")
    out = []
    for what, rate, ratio in numbers["rows"]:
        if kind == "extract":
            section = "stage one"
            text = (f"{settings['image_size']} px, batch {settings['batch_size']}, "
                    f"{settings['workers']} workers, {settings['precision']}")
        else:
            section = "stage three"
            batch, what = what.split(", ", 1)
            text = (f"{settings['image_size']} px, {batch}, {settings['workers']} workers, "
                    f"{settings['precision']}")
            what = what.replace("baseline", "plain loop")
        out.append(row(section=section, benchmark=kind, what=what, value=rate, unit="img/s",
                       settings=text, window=window, **shared))
        if ratio is not None and ratio != 1.0:
            out.append(row(section=section, benchmark=kind, what=f"{what} / plain loop",
                           value=ratio, unit="x", settings=text, **shared))
    return out


def rows_from_document(document: dict, command: str | None = None, source: str | None = None,
                       commit: str | None = None, version: str | None = None) -> list[dict]:
    """The record rows of one benchmark's JSON document (extract, finetune, linear,
    linear_floor, gpu-check; others give none). ``command``, ``commit`` and ``version`` stand
    in where the document does not say (documents made before they recorded them)."""
    shared = _context(document, command, source, commit)
    shared["featcache"] = shared["featcache"] or version
    kind = document.get("benchmark") or document.get("check")
    if kind == "extract":
        return _extract_rows(document, shared)
    if kind == "finetune":
        return _finetune_rows(document, shared)
    if kind in ("linear", "linear_floor"):
        return _table_rows(document, shared, kind)
    if kind == "gpu-check":
        folder = Path(source).parent if source else None
        return _gpu_check_rows(document, shared, folder)
    return []


# ------------------------------------------------------------------------------ rendering
def _value(row: dict) -> str:
    value, unit = row["value"], row["unit"]
    if unit == "x":
        return f"{value:.2f}x"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}"


def _run_key(row: dict) -> tuple:
    return (row["date"], row["device"], row["commit"] or row["recorded_in"] or "", row["command"])


def runs(rows: Sequence[dict]) -> dict[tuple, int]:
    """Each distinct run (date, device, commit, command) and its number, newest first."""
    keys = sorted({_run_key(r) for r in rows}, key=lambda k: (k[0], k[1], k[2], k[3]),
                  reverse=True)
    return {key: number for number, key in enumerate(keys, start=1)}


def _code(row: dict) -> str:
    if row["commit"]:
        return f"featcache {row['featcache'] or '?'} at {row['commit']}"
    return f"recorded in commit {row['recorded_in']}" if row["recorded_in"] else "commit unknown"


def render_performance(rows: Sequence[dict]) -> str:
    """docs/performance.md's generated block: per section, one table per run (newest first),
    then the runs (date, device, machine, code, command, load, files)."""
    numbers = runs(rows)
    parts = []
    for section, title in SECTIONS.items():
        mine = [r for r in rows if r["section"] == section]
        if not mine:
            continue
        parts.append(f"### {title}")
        for key, number in numbers.items():
            members = [r for r in mine if _run_key(r) == key]
            if not members:
                continue
            table = Table(["what", "value", "settings", "window"])
            for r in members:
                table.add(r["what"] + (f" ({r['note']})" if r["note"] else ""), _value(r),
                          r["settings"] or "", r["window"] or "")
            parts.append(f"**R{number}**, {key[0]}, {key[1]}:\n\n{table.markdown()}")
    lines = ["### The runs", ""]
    for key, number in numbers.items():
        first = next(r for r in rows if _run_key(r) == key)
        members = [r for r in rows if _run_key(r) == key]
        sources = sorted({r["source"] for r in members if r["source"]})
        loads = sorted({r["load"] for r in members if r["load"]})
        text = (f"- **R{number}**: {first['date']}, {first['device']}"
                + (f" ({first['machine']})" if first["machine"] else "")
                + f", {_code(first)}: `{first['command']}`")
        if loads:
            text += "; " + "; ".join(loads)
        if sources:
            text += "; from " + ", ".join(f"`{s}`" for s in sources)
        lines.append(text)
    parts.append("\n".join(lines))
    return "\n\n".join(parts)


def render_glance(rows: Sequence[dict]) -> str:
    """The README's at-a-glance table: each headline figure (rows marked ``glance``), the
    newest measurement on each device, devices as columns."""
    latest: dict[tuple[str, str], dict] = {}
    for r in rows:
        if not r["glance"]:
            continue
        key = (r["glance"], r["device"])
        if key not in latest or r["date"] >= latest[key]["date"]:
            latest[key] = r
    devices = sorted({device for _, device in latest}, key=lambda d: ("CPU" in d, d))
    order = list(SECTIONS)
    figures = sorted({(order.index(r["section"]), r["glance"]) for r in latest.values()})
    table = Table(["what", *devices])
    for _, glance in figures:
        table.add(glance, *[f"{_value(found)} ({found['date']})"
                            if (found := latest.get((glance, device))) else None
                            for device in devices])
    return table.markdown()


RENDERERS = {"performance": render_performance, "performance-glance": render_glance}


def rendered(document: str, text: str, rows: Sequence[dict]) -> str:
    """``text`` (the document's contents) with each of its record blocks rendered again."""
    for name in DOCUMENTS[document]:
        text = replace_section(text, name, RENDERERS[name](rows), kind="record")
    return text


def stale_blocks(rows: Sequence[dict], root: Path = REPO) -> list[str]:
    """The generated blocks that differ from what the record gives (``document: block``)."""
    stale = []
    for document, names in DOCUMENTS.items():
        text = (root / document).read_text(encoding="utf-8")
        for name in names:
            if readme_section(text, name, kind="record") != RENDERERS[name](rows).strip("\n"):
                stale.append(f"{document}: {name}")
    return stale


# ------------------------------------------------------------------------------ command line
def _documents(paths: Sequence[str]) -> list[Path]:
    """JSON documents named, a folder standing for the benchmark documents in it."""
    found = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.glob("*.json")
                            if p.name.startswith(("bench-", "gpu-check")))
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"{path} does not exist")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.record",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="append the rows of benchmark JSON documents (or of the "
                                     "bench-*.json and gpu-check.json files of a folder)")
    add.add_argument("paths", nargs="+")
    add.add_argument("--command", default=None,
                     help="the command that made them, where a document does not say")
    add.add_argument("--commit", default=None, help="the commit of the code measured")
    add.add_argument("--featcache", default=None, help="the featcache version measured")
    add.add_argument("--record", default=str(RECORD))
    sub.add_parser("render", help="rewrite docs/performance.md's and README.md's record blocks")
    sub.add_parser("check", help="exit 1 when a rendered block differs from the record")
    args = parser.parse_args(argv)
    if args.action == "add":
        total = 0
        for path in _documents(args.paths):
            document = json.loads(path.read_text(encoding="utf-8"))
            found = rows_from_document(document, args.command, _relative(path), args.commit,
                                       args.featcache)
            total += append(found, args.record)
            print(f"{path}: {len(found)} rows")
        print(f"{total} rows added to {args.record}; now run `python -m benchmarks.record "
              "render`")
        return 0
    rows = read()
    if args.action == "render":
        for document in DOCUMENTS:
            path = REPO / document
            write_text_atomic(path, rendered(document, path.read_text(encoding="utf-8"), rows))
            print(f"{document}: rendered from {len(rows)} rows of {_relative(RECORD)}")
        return 0
    stale = stale_blocks(rows)
    for block in stale:
        print(f"{block} differs from {_relative(RECORD)}: run `python -m benchmarks.record "
              "render`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
