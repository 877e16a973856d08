"""What a dataset's report shows: its finished runs of both stages, and its CAM figures.

Runs are found where the stages write them, ``<dataset dir>/runs/<loss>/<run-id>/`` (stage
two) and ``<dataset dir>/finetune/<loss>/<run-id>/`` (stage three), by their ``results.json``
(a folder without one is unfinished and left out). CAM figures are the PNGs under the dataset
folder that ``featcache cam`` wrote (its PNG "Software" text).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from featcache.errors import InputError
from featcache.protocol.runs import RESULTS, load_results

#: stage -> the folder of the dataset directory that holds its runs
STAGE_FOLDERS = {"linear": "runs", "finetune": "finetune"}
#: what ``featcache cam`` writes into a PNG's "Software" text (featcache.api.cam.CAM_SOFTWARE)
CAM_SOFTWARE = "featcache cam"
#: the PNG text listing a CAM figure's runs (featcache.api.cam.CAM_RUNS)
CAM_RUNS = "featcache runs"
#: a row label of a CAM figure made before CAM_RUNS was written: "an, linear\ndemo, test mAP 61.2"
OLD_CAM_ROW = re.compile(r"^(?P<loss>[^,\n]+), (?P<stage>linear|fine-tuned)\n(?P<id>.+?), test mAP ")


@dataclass
class Run:
    """One finished run: where it is and its results document."""

    path: Path
    document: dict

    @property
    def stage(self) -> str:
        return self.document.get("stage", "linear")

    @property
    def loss(self) -> str:
        return self.document["loss"]

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def name(self) -> str:
        """``runs/an/demo`` or ``finetune/role/demo``: the folder under the dataset directory."""
        return f"{STAGE_FOLDERS.get(self.stage, self.stage)}/{self.loss}/{self.run_id}"

    @property
    def anchor(self) -> str:
        """The HTML id of the run's section."""
        return "run-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name.replace("/", "--"))


@dataclass
class CamFigure:
    """A PNG written by ``featcache cam``: the image it maps and the runs (one row each)."""

    path: Path
    title: str
    rows: str
    #: the runs it shows, as ``Run.name`` (``runs/an/demo``); None when not known
    runs: list[str] | None = None

    def shows_only(self, runs: Sequence[Run]) -> bool:
        """Whether every run of the figure is among ``runs`` (unknown runs: no)."""
        names = {run.name for run in runs}
        return self.runs is not None and all(name in names for name in self.runs)


def find_runs(dataset_dir: Path) -> list[Run]:
    """Every finished run of both stages under ``dataset_dir``, oldest first."""
    runs = []
    for stage, folder in STAGE_FOLDERS.items():
        for results in sorted((dataset_dir / folder).glob(f"*/*/{RESULTS}")):
            document = load_results(results.parent)
            if document.get("stage", "linear") != stage:
                raise InputError(f"{results} is a {document.get('stage')} run inside "
                                 f"{dataset_dir / folder}, which holds runs of stage {stage!r}")
            runs.append(Run(results.parent, document))
    return sorted(runs, key=lambda run: (run.document.get("created", ""), run.name))


def select_runs(runs: Sequence[Run], patterns: Sequence[str]) -> list[Run]:
    """The runs that ``--runs`` names: run ids, ``<loss>/<run-id>`` or ``<stage
    folder>/<loss>/<run-id>``, shell patterns allowed (``demo-*``). A pattern that matches no
    run is refused, naming the runs there are."""
    if not patterns:
        return list(runs)
    chosen: list[Run] = []
    for pattern in patterns:
        hits = [run for run in runs if any(fnmatch.fnmatchcase(text, pattern) for text in
                                           (run.run_id, f"{run.loss}/{run.run_id}", run.name))]
        if not hits:
            ids = sorted({run.run_id for run in runs})
            raise InputError(f"--runs {pattern!r} matches no finished run; run ids here: "
                             + (", ".join(ids) if ids else "none"))
        chosen += [run for run in hits if run not in chosen]
    return [run for run in runs if run in chosen]


def find_cam_figures(dataset_dir: Path) -> list[CamFigure]:
    """The PNGs ``featcache cam`` wrote anywhere under ``dataset_dir``."""
    from PIL import Image

    figures = []
    for path in sorted(dataset_dir.rglob("*.png")):
        if path.name == "curves.png":
            continue
        try:
            with Image.open(path) as image:
                text = dict(getattr(image, "text", {}) or {})
        except OSError:
            continue
        if text.get("Software") == CAM_SOFTWARE:
            figures.append(CamFigure(path, text.get("Title", ""), text.get("Description", ""),
                                     _figure_runs(text)))
    return figures


def _figure_runs(text: dict) -> list[str] | None:
    """The runs a CAM figure shows, from its PNG text (an older figure: from its row labels)."""
    try:
        runs = json.loads(text[CAM_RUNS])
    except (KeyError, ValueError):
        rows = [OLD_CAM_ROW.match(label) for label in text.get("Description", "").split("; ")]
        if not rows or not all(rows):
            return None
        return [f"{'finetune' if row['stage'] == 'fine-tuned' else 'runs'}/{row['loss']}/"
                f"{row['id']}" for row in rows if row]
    return [str(name) for name in runs] if isinstance(runs, list) else None
