"""``featcache report``: one self-contained HTML page of a dataset's runs, both stages.

:func:`write_report` finds the finished runs under ``<cache>/<dataset>/`` (``runs/`` and
``finetune/``), optionally a subset (``runs``), and the CAM figures ``featcache cam`` wrote
there, and writes the page (:mod:`featcache.report.page`). It reads only the files the stages
wrote (``results.json``, the PNGs), so it sits beside the Python API above the stages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from featcache.errors import InputError
from featcache.fileio import refuse_existing, write_text_atomic
from featcache.report.page import GENERATOR, render_page
from featcache.report.runs import find_cam_figures, find_runs, select_runs

#: the page's name in the dataset folder when ``out`` is not given
DEFAULT_NAME = "report.html"


def build_report(dataset_dir: str | Path, runs: Sequence[str] = (), title: str | None = None) -> str:
    """The HTML page of the finished runs under ``dataset_dir`` (``runs``: a subset, see
    :func:`featcache.report.runs.select_runs`)."""
    root = Path(dataset_dir)
    if not root.is_dir():
        raise InputError(f"{root} is not a dataset folder (no such directory); give "
                         "cache/<dataset>, e.g. cache/voc")
    every = find_runs(root)
    if not every:
        raise InputError(f"{root} holds no finished run (no runs/<loss>/<run-id>/results.json or "
                         "finetune/<loss>/<run-id>/results.json); train one with "
                         f"`{train_command(root)}`")
    chosen = select_runs(every, runs)
    datasets = sorted({run.document["dataset"] for run in chosen})
    if len(datasets) > 1:
        raise InputError(f"{root} holds runs of several datasets ({', '.join(datasets)}); a "
                         "report covers one")
    figures = find_cam_figures(root)
    if runs:  # the figures of the runs chosen, none of the others
        figures = [figure for figure in figures if figure.shows_only(chosen)]
    return render_page(datasets[0], chosen, every, figures, root, title)


def train_command(root: Path) -> str:
    """The stage-two command that trains a run into the dataset folder ``root``."""
    import shlex

    from featcache.paths import cache_root

    command = f"featcache train-linear --dataset {shlex.quote(root.name)}"
    if root.parent.resolve() != cache_root().resolve():
        command += f" --cache {shlex.quote(str(root.parent))}"
    return command


def write_report(dataset_dir: str | Path, out: str | Path | None = None,
                 runs: Sequence[str] = (), title: str | None = None,
                 overwrite: bool = False) -> Path:
    """Write the report page (default ``<dataset_dir>/report.html``) atomically."""
    path = Path(out) if out is not None else Path(dataset_dir) / DEFAULT_NAME
    refuse_existing(path, overwrite or is_report(path))
    write_text_atomic(path, build_report(dataset_dir, runs, title), overwrite=True)
    return path


def is_report(path: str | Path) -> bool:
    """Whether ``path`` is a page ``featcache report`` wrote (a new report may replace it
    without ``--overwrite``; any other file is kept unless asked): its generator tag, or for a
    page written before the tag, its header line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as page:
            head = page.read(1 << 18)
    except OSError:
        return False
    return (f'<meta name="generator" content="{GENERATOR} ' in head
            or re.search(r"; written \S+ by featcache \S+ from ", head) is not None)


__all__ = ["DEFAULT_NAME", "build_report", "is_report", "write_report"]
