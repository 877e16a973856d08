"""Declared experiment recipes (``pipelines/*.toml``): featcache commands run in order, then a table.

This module reads recipes and builds their report; ``featcache pipeline run``
(:mod:`featcache.commands.pipeline`) runs the steps through the command line.

A recipe is a TOML file::

    name = "real-features"
    description = "one line"

    [vars]                       # referenced as {name} in commands; --set name=value overrides
    shared = "../shared/data"

    [[steps]]
    name = "import scene"
    command = ["prepare", "features", "--npz", "{shared}/scene/scene.npz", "--name", "scene"]
    skip_if_exists = "{cache}/scene/labels.h5"     # optional: the step's output

    [report]                     # optional: one table over the runs the steps made
    stage = "linear"             # "linear" (runs/) or "finetune" (finetune/)
    run_id = "{run_id}"
    datasets = ["scene", "yeast"]
    losses = ["an", "an-ls"]     # optional; default: every loss found

``{cache}`` is always the cache root. Steps re-use finished work (features files are kept when
up to date, a linear run id that finished with the same settings is reused), so an
interrupted pipeline is resumed by running it again.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from featcache.errors import InputError, OptionError, did_you_mean
from featcache.fileio import write_text_atomic
from featcache.losses import loss_names
from featcache.paths import cache_root, dataset_dir
from featcache.published import PROTOCOL_DATASETS, published
from featcache.tables import Table

REPORT_STAGES = {"linear": "runs", "finetune": "finetune"}


@dataclass
class Step:
    name: str
    command: list[str]
    skip_if_exists: str | None = None


@dataclass
class Recipe:
    path: Path
    name: str
    description: str
    variables: dict[str, str]
    steps: list[Step]
    report: dict = field(default_factory=dict)


def load_recipe(path: str | Path, overrides: dict[str, str] | None = None,
                cache: str | None = None) -> Recipe:
    """Read and check a recipe, with ``overrides`` applied to its variables."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"pipeline recipe {path} does not exist (`featcache pipeline list` "
                         "shows the ones in pipelines/)")
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path} is not valid TOML: {exc}") from exc
    variables = {str(k): str(v) for k, v in document.get("vars", {}).items()}
    unknown = sorted(set(overrides or {}) - set(variables))
    if unknown:
        raise OptionError(f"--set {', '.join(unknown)}: {path} has no such variable"
                          f"{did_you_mean(unknown[0], variables)}; its variables are "
                          f"{', '.join(sorted(variables)) or 'none'}")
    variables.update(overrides or {})
    variables["cache"] = str(cache_root(cache))
    steps = []
    for number, raw in enumerate(document.get("steps", []), start=1):
        command = raw.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if not command or not all(isinstance(c, str) for c in command):
            raise InputError(f"{path}: step {number} needs a command (a list of strings)")
        steps.append(Step(name=str(raw.get("name", " ".join(command[:3]))),
                          command=[_fill(c, variables, path) for c in command],
                          skip_if_exists=_fill(raw["skip_if_exists"], variables, path)
                          if "skip_if_exists" in raw else None))
    report = {k: (_fill(v, variables, path) if isinstance(v, str) else v)
              for k, v in document.get("report", {}).items()}
    if report and report.get("stage", "linear") not in REPORT_STAGES:
        raise InputError(f"{path}: report.stage must be one of {', '.join(REPORT_STAGES)}")
    return Recipe(path=path, name=str(document.get("name", path.stem)),
                  description=str(document.get("description", "")), variables=variables,
                  steps=steps, report=report)


def _fill(text: str, variables: dict[str, str], path: Path) -> str:
    try:
        return text.format(**variables)
    except KeyError as exc:
        raise InputError(f"{path}: {{{exc.args[0]}}} is used but not defined in [vars]") from None


def write_report(recipe: Recipe, cache: str | None = None) -> tuple[Table, Path]:
    """The recipe's table over the runs its steps made, written as results.md, .csv and .json."""
    table = report_table(recipe.report, cache)
    out = cache_root(cache) / "pipelines" / recipe.name
    write_text_atomic(out / "results.md", f"# {recipe.name}\n\n{recipe.description}\n\n"
                      + table.markdown() + "\n")
    write_text_atomic(out / "results.csv", table.csv())
    write_text_atomic(out / "results.json", json.dumps(table.records(), indent=2) + "\n")
    return table, out / "results.md"


def report_table(report: dict, cache: str | None = None) -> Table:
    """Losses as rows, datasets as columns: selected test mAP (+- std over seeds), published beside."""
    stage = report.get("stage", "linear")
    run_id = report.get("run_id")
    datasets = list(report.get("datasets", []))
    if not run_id or not datasets:
        raise InputError("a pipeline report needs run_id and datasets")
    found: dict[str, dict[str, dict]] = {}
    for dataset in datasets:
        root = dataset_dir(dataset, cache) / REPORT_STAGES[stage]
        for results in sorted(root.glob(f"*/{run_id}/results.json")):
            found.setdefault(results.parent.parent.name, {})[dataset] = json.loads(results.read_text())
    registry_order = {name: i for i, name in enumerate(loss_names())}
    losses = list(report.get("losses")
                  or sorted(found, key=lambda name: registry_order.get(name, len(registry_order))))
    setting = "linear" if stage == "linear" else "finetune"
    columns = ["loss"]
    for dataset in datasets:
        columns.append(dataset)
        if dataset in PROTOCOL_DATASETS:
            columns.append(f"{dataset} (published)")
    table = Table(columns)
    for loss in losses:
        row: list = [loss]
        for dataset in datasets:
            document = found.get(loss, {}).get(dataset)
            row.append(_score(document))
            if dataset in PROTOCOL_DATASETS:
                row.append(published(setting, loss, dataset))
        table.add(*row)
    return table


def _score(document: dict | None) -> str | None:
    if document is None:
        return None
    summary = document.get("summary", {})
    mean = summary.get("test_map_mean", document["selection"]["test_map"])
    if summary.get("seeds", 1) > 1:
        return f"{mean:.2f} +- {summary['test_map_std']:.2f}"
    return f"{mean:.2f}"


def list_recipes(folder: str | Path = "pipelines") -> list[tuple[Path, str]]:
    """(path, description) of every recipe in ``folder``."""
    out = []
    for path in sorted(Path(folder).glob("*.toml")):
        try:
            description = tomllib.loads(path.read_text()).get("description", "")
        except tomllib.TOMLDecodeError:
            description = "(not valid TOML)"
        out.append((path, description))
    return out
