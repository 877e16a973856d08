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

    [[steps]]                    # optional "each": one step per combination of the values
    name = "ROLE, k = {k}, seed {seed}"
    each = {k = "1.0,1.5,2.0", seed = ["0", "1"]}  # lists, or comma-separated (may use {vars})
    command = ["train-linear", "--dataset", "scene", "--loss", "role", "--param", "k={k}",
               "--seeds", "{seed}", "--run-id", "k{k}-s{seed}"]

    [report]                     # optional: one table over the runs the steps made
    stage = "linear"             # "linear" (runs/) or "finetune" (finetune/)
    run_id = "{run_id}"
    datasets = ["scene", "yeast"]
    losses = ["an", "an-ls"]     # optional; default: every loss found
    readme = "../README.md"      # optional, relative to the recipe: the table also replaces
                                 # the text between <!-- featcache pipeline NAME: begin -->
                                 # and <!-- featcache pipeline NAME: end --> there

A report with ``kind = "sweep"`` plots test mAP against one loss parameter instead: every
finished run of ``loss`` whose run id matches the glob ``run_id`` is a point at its selected
value of ``param`` (points with the same value: mean and standard deviation over runs and
seeds); runs matching ``reference_run_id`` (optional) draw a band, mean +- std. It writes
``sweep.png`` beside the table.

``{cache}`` is always the cache root and ``{recipe_dir}`` the recipe's folder (so that a
default path such as ``shared = "{recipe_dir}/../../shared/data"`` does not depend on the
working directory); [vars] values may use both. An argument that names a path through a
[vars] variable is a step input: a run refuses before its first step when an input of a step
that will run is missing (naming the ``--set`` that fixes it), and a dry run lists them; so
does each step that cannot run as written (its command, options and values, or a
``--dataset`` neither prepared nor prepared by an earlier step:
:mod:`featcache.commands.recipe_check`). Steps re-use finished work (features files are kept when
up to date, a linear run id that finished with the same settings is reused), so an
interrupted pipeline is resumed by running it again.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import statistics
import string
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from featcache.errors import FeatcacheWarning, InputError, OptionError, did_you_mean
from featcache.fileio import write_text_atomic
from featcache.paths import cache_root, dataset_dir
from featcache.progress import say
from featcache.protocol.results_table import ResultsTable
from featcache.protocol.runs import load_results
from featcache.schema import AnyOf, Flag, ListOf, MapOf, Number, Record, Text, read_document
from featcache.tables import Table

REPORT_STAGES = {"linear": "runs", "finetune": "finetune"}


@dataclass
class Step:
    name: str
    command: list[str]
    skip_if_exists: str | None = None
    #: (path, variable) for each argument that names a path through a [vars] variable: the
    #: step's inputs, checked before a run (and listed by a dry run) when missing
    inputs: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Recipe:
    path: Path
    name: str
    description: str
    variables: dict[str, str]
    steps: list[Step]
    report: dict = field(default_factory=dict)


#: options whose value a step writes (never checked as an input that must exist)
OUTPUT_OPTIONS = ("--out", "-o")
_WORD = AnyOf(Text(), Number(), Flag())
#: what a recipe may hold (the module docstring describes each key)
RECIPE_SCHEMA = Record(optional={
    "name": Text(),
    "description": Text(),
    "vars": MapOf(_WORD),
    "steps": ListOf(Record(
        required={"command": AnyOf(Text(), ListOf(Text(), at_least=1))},
        optional={"name": Text(), "skip_if_exists": Text(),
                  "each": MapOf(AnyOf(Text(), ListOf(_WORD, at_least=1)))})),
    "report": Record(optional={
        "stage": Text(), "kind": Text(), "run_id": Text(),
        "reference_run_id": Text(), "datasets": ListOf(Text(), at_least=1),
        "losses": ListOf(Text()), "readme": Text(), "loss": Text(), "param": Text()}),
})
#: the fix for a recipe that cannot be read
RECIPE_ADVICE = ("fix it by hand: the recipe format is described at the top of "
                 "featcache/pipeline.py, and pipelines/*.toml are examples")


def read_recipe_document(path: Path) -> dict:
    """The recipe in ``path`` as TOML, checked against :data:`RECIPE_SCHEMA`."""
    return read_document(path, RECIPE_SCHEMA, "pipeline recipe", RECIPE_ADVICE, kind="toml")


def load_recipe(path: str | Path, overrides: dict[str, str] | None = None,
                cache: str | None = None) -> Recipe:
    """Read and check a recipe, with ``overrides`` applied to its variables."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"pipeline recipe {path} does not exist (`featcache pipeline list` "
                         "shows the ones in pipelines/)")
    document = read_recipe_document(path)
    variables = {str(k): str(v) for k, v in document.get("vars", {}).items()}
    unknown = sorted(set(overrides or {}) - set(variables))
    if unknown:
        raise OptionError(f"--set {', '.join(unknown)}: {path} has no such variable"
                          f"{did_you_mean(unknown[0], variables)}; its variables are "
                          f"{', '.join(sorted(variables)) or 'none'}")
    builtins = {"cache": str(cache_root(cache)), "recipe_dir": str(path.resolve().parent)}
    variables = {k: _fill(v, builtins, path) for k, v in variables.items()}
    variables.update(overrides or {})
    variables.update(builtins)
    steps = []
    for number, raw in enumerate(document.get("steps", []), start=1):
        command = raw.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if not command or not all(isinstance(c, str) for c in command):
            raise InputError(f"{path}: step {number} needs a command (a list of strings)")
        for values in _combinations(raw.get("each", {}), variables, path, number):
            scope = {**variables, **values}
            filled = [_fill(c, scope, path) for c in command]
            # an output (the value of --out) is written by the step, not read: not an input
            outputs = {i + 1 for i, word in enumerate(command) if word in OUTPUT_OPTIONS}
            inputs = [(value, name)
                      for i, (template, value) in enumerate(zip(command, filled, strict=True))
                      if i not in outputs
                      for name in _user_variables(template, variables, builtins)
                      if "/" in value or os.sep in value]
            steps.append(Step(name=_fill(str(raw.get("name", " ".join(command[:3]))), scope, path),
                              command=filled,
                              skip_if_exists=_fill(raw["skip_if_exists"], scope, path)
                              if "skip_if_exists" in raw else None,
                              inputs=inputs))
    report = {k: (_fill(v, variables, path) if isinstance(v, str) else v)
              for k, v in document.get("report", {}).items()}
    if report and report.get("stage", "linear") not in REPORT_STAGES:
        raise InputError(f"{path}: report.stage must be one of {', '.join(REPORT_STAGES)}")
    return Recipe(path=path, name=str(document.get("name", path.stem)),
                  description=str(document.get("description", "")), variables=variables,
                  steps=steps, report=report)


def _user_variables(template: str, variables: dict[str, str], builtins: dict[str, str]) -> list[str]:
    """The [vars] variables (not {cache} or {recipe_dir}) that ``template`` refers to."""
    names = [field_name for _, field_name, _, _ in string.Formatter().parse(template) if field_name]
    return [n for n in names if n in variables and n not in builtins][:1]


def missing_inputs(recipe: Recipe) -> list[str]:
    """One line for each input path of a step that will run (its ``skip_if_exists`` output is
    absent) that does not exist, naming the variable and the ``--set`` that points it elsewhere."""
    lines = []
    for number, step in enumerate(recipe.steps, start=1):
        if step.skip_if_exists and Path(step.skip_if_exists).exists():
            continue
        for value, name in step.inputs:
            if not Path(value).exists():
                lines.append(f"step {number} ({step.name}) reads {value}, which does not exist "
                             f"({{{name}}} is {recipe.variables[name]!r}): point it at the data "
                             f"with `featcache pipeline run {recipe.path} --set {name}=PATH`")
    return lines


def _combinations(each, variables: dict[str, str], path: Path, number: int) -> list[dict[str, str]]:
    """Every combination of a step's ``each`` values (one empty combination without ``each``)."""
    if not isinstance(each, dict):
        raise InputError(f"{path}: step {number}: 'each' must be a table of name = values")
    clash = sorted(set(each) & set(variables))
    if clash:
        raise InputError(f"{path}: step {number}: 'each' reuses the variable name {clash[0]!r}")
    axes = []
    for name, values in each.items():
        if isinstance(values, str):
            values = [v.strip() for v in _fill(values, variables, path).split(",") if v.strip()]
        else:
            values = [_fill(str(v), variables, path) for v in values]
        if not values:
            raise InputError(f"{path}: step {number}: 'each' gives {name!r} no values")
        axes.append([(name, value) for value in values])
    return [dict(combination) for combination in itertools.product(*axes)]


def _fill(text: str, variables: dict[str, str], path: Path) -> str:
    try:
        return text.format(**variables)
    except KeyError as exc:
        raise InputError(f"{path}: {{{exc.args[0]}}} is used but not defined in [vars]") from None


def write_report(recipe: Recipe, cache: str | None = None) -> tuple[Table, Path]:
    """The recipe's report over the runs its steps made: for a table, results.md, .csv, .tex
    and .json, the same table ``featcache table`` builds from those runs; for a sweep,
    results.md, .csv, .json and sweep.png."""
    out = cache_root(cache) / "pipelines" / recipe.name
    if recipe.report.get("kind", "table") == "sweep":
        table = sweep_table(recipe.report, cache, plot=out / "sweep.png")
        write_text_atomic(out / "results.md", f"# {recipe.name}\n\n{recipe.description}\n\n"
                          + table.markdown() + "\n")
        write_text_atomic(out / "results.csv", table.csv())
        write_text_atomic(out / "results.json", json.dumps(table.records(), indent=2) + "\n")
        return table, out / "results.md"
    results = report_table(recipe.report, cache)
    table = results.table()
    write_text_atomic(out / "results.md", f"# {recipe.name}\n\n{recipe.description}\n\n"
                      + table.markdown() + "\n\n" + results.configurations().markdown() + "\n")
    write_text_atomic(out / "results.csv", results.flat_table().csv())
    write_text_atomic(out / "results.tex", table.latex(label=f"tab:{recipe.name}") + "\n"
                      + results.configurations(runs=False).latex(
                          label=f"tab:{recipe.name}-configurations"))
    write_text_atomic(out / "results.json", json.dumps(results.to_json(), indent=2) + "\n")
    if recipe.report.get("readme"):
        publish_section(recipe.path.parent / recipe.report["readme"], recipe.name,
                        table.markdown())
    return table, out / "results.md"


def section_markers(name: str) -> tuple[str, str]:
    """The comments around the part of a document a recipe's report owns."""
    return (f"<!-- featcache pipeline {name}: begin -->",
            f"<!-- featcache pipeline {name}: end -->")


def readme_section(text: str, name: str) -> str:
    """The text between recipe ``name``'s markers (InputError when they are missing)."""
    begin, end = section_markers(name)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise InputError(f"no section between {begin} and {end}")
    return text[start + len(begin):stop].strip("\n")


def publish_section(path: Path, name: str, content: str) -> None:
    """Replace the text between recipe ``name``'s markers in ``path`` (a report's ``readme``)
    with ``content``, so a document's table is always the last run's. Without the markers the
    document is left alone and a warning says what to add."""
    begin, end = section_markers(name)
    text = path.read_text() if path.is_file() else ""
    try:
        readme_section(text, name)
    except InputError:
        warnings.warn(f"{path} has no {begin} ... {end} section: its table was not updated "
                      "(add the two lines where the table belongs)", FeatcacheWarning,
                      stacklevel=2)
        return
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    write_text_atomic(path, f"{head}{begin}\n{content.strip()}\n{end}{tail}")
    say(f"{path}: the {name} section now holds this table")


def report_table(report: dict, cache: str | None = None) -> ResultsTable:
    """Losses as rows, datasets as columns: test mAP (mean +- sd over seeds), published beside."""
    stage = report.get("stage", "linear")
    run_id = report.get("run_id")
    datasets = list(report.get("datasets", []))
    if not run_id or not datasets:
        raise InputError("a pipeline report needs run_id and datasets")
    documents = []
    for dataset in datasets:
        root = dataset_dir(dataset, cache) / REPORT_STAGES[stage]
        for results in sorted(root.glob(f"*/{run_id}/results.json")):
            documents.append((str(results.parent), load_results(results.parent)))
    if not documents:
        raise InputError(f"no finished {stage} run {run_id!r} for {', '.join(datasets)}: the "
                         "report has nothing to show")
    return ResultsTable.from_documents(documents, datasets=datasets,
                                       losses=report.get("losses"))


def _run_scores(document: dict) -> list[float]:
    """The selected test mAP of each seed of a run (stage two may hold several seeds)."""
    seeds = document.get("seeds")
    if seeds:
        return [seed["selected"]["test_map"] for seed in seeds]
    return [document["selection"]["test_map"]]


def _sweep_runs(report: dict, key: str, dataset: str, cache: str | None) -> list[dict]:
    root = dataset_dir(dataset, cache) / REPORT_STAGES[report.get("stage", "linear")] / report["loss"]
    return [load_results(path.parent)
            for path in sorted(root.glob(f"{report[key]}/results.json"))]


def sweep_table(report: dict, cache: str | None = None, plot: Path | None = None) -> Table:
    """Test mAP against one loss parameter: one row per (dataset, value), mean +- std over the
    matching runs and their seeds, and the reference runs' mean +- std beside (``plot``: the
    figure, one panel per dataset)."""
    missing = [key for key in ("loss", "param", "run_id", "datasets") if not report.get(key)]
    if missing:
        raise InputError(f"a sweep report needs {', '.join(missing)}")
    param = report["param"]
    table = Table(["dataset", param, "runs", "test mAP", "std", "reference", "reference std"],
                  formats={param: "{:.4g}"})
    panels = []
    for dataset in report["datasets"]:
        points: dict[float, list[float]] = {}
        for document in _sweep_runs(report, "run_id", dataset, cache):
            points.setdefault(float(document["selection"]["params"][param]), []).extend(
                _run_scores(document))
        reference = [score for document in (_sweep_runs(report, "reference_run_id", dataset, cache)
                                            if report.get("reference_run_id") else [])
                     for score in _run_scores(document)]
        band = (statistics.fmean(reference), _std(reference)) if reference else None
        for value in sorted(points):
            scores = points[value]
            table.add(dataset, value, len(scores), statistics.fmean(scores), _std(scores),
                      *(band or (None, None)))
        panels.append((dataset, {v: points[v] for v in sorted(points)}, band))
    if plot is not None and any(points for _, points, _ in panels):
        from featcache.protocol.plots import plot_sweep

        plot_sweep(panels, param, plot, title=f"{report['loss']}: test mAP against {param}")
    return table


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def list_recipes(folder: str | Path = "pipelines") -> list[tuple[Path, str]]:
    """(path, description) of every recipe in ``folder``."""
    out = []
    for path in sorted(Path(folder).glob("*.toml")):
        try:
            description = read_recipe_document(path).get("description", "")
        except InputError:
            description = "(not a valid recipe: `featcache pipeline run` on it says why)"
        out.append((path, description))
    return out
