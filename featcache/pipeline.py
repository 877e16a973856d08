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
    record = "../docs/results/NAME.json"  # optional: a copy of results.json beside the
                                 # document, from which `featcache pipeline render` (and a
                                 # test) writes the same section again without the runs
    versus = "an"                # optional: each dataset's paired differences to this loss
                                 # (`featcache table cache/<dataset>/runs --run-id ID
                                 # --versus an`), recorded, and those that survive Holm's
                                 # correction named under the table

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
from dataclasses import dataclass, field
from pathlib import Path

from featcache.errors import InputError, OptionError, did_you_mean, name_list
from featcache.fileio import write_text_atomic
from featcache.paths import cache_root, dataset_dir
from featcache.progress import say
from featcache.protocol.documents import read_recipe, read_table_record
from featcache.protocol.results_table import ResultsTable
from featcache.protocol.runs import load_results
from featcache.sections import publish_section
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


def load_recipe(path: str | Path, overrides: dict[str, str] | None = None,
                cache: str | None = None) -> Recipe:
    """Read and check a recipe, with ``overrides`` applied to its variables."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"pipeline recipe {path} does not exist (`featcache pipeline list` "
                         "shows the ones in pipelines/)")
    document = read_recipe(path)
    variables = {str(k): str(v) for k, v in document.get("vars", {}).items()}
    unknown = sorted(set(overrides or {}) - set(variables))
    if unknown:
        raise OptionError(f"--set {', '.join(unknown)}: {path} has no such variable"
                          f"{did_you_mean(unknown[0], variables)}; its variables are "
                          f"{', '.join(sorted(variables)) or 'none'}")
    builtins = {"cache": str(cache_root(cache)), "recipe_dir": str(path.resolve().parent)}
    # a path built from {recipe_dir} or {cache} reads as the folder it is ('../..' resolved)
    variables = {k: os.path.normpath(_fill(v, builtins, path))
                 if any(f"{{{b}}}" in v for b in builtins) else _fill(v, builtins, path)
                 for k, v in variables.items()}
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
    """One line for each [vars] variable through which steps that will run (their
    ``skip_if_exists`` output is absent) read paths that do not exist: the steps, the first
    path, the variable's value and the ``--set`` that points it elsewhere."""
    missing: dict[str, list[tuple[int, str, str]]] = {}
    for number, step in enumerate(recipe.steps, start=1):
        if step.skip_if_exists and Path(step.skip_if_exists).exists():
            continue
        for value, name in step.inputs:
            if not Path(value).exists():
                missing.setdefault(name, []).append((number, step.name, value))
    lines = []
    for name, entries in missing.items():
        fix = (f"point it at the data with `featcache pipeline run {recipe.path} "
               f"--set {name}=PATH`")
        where = f"{{{name}}} is {recipe.variables[name]}"
        if len(entries) == 1:
            number, step_name, value = entries[0]
            lines.append(f"step {number} ({step_name}) reads {value}, which does not exist "
                         f"({where}): {fix}")
            continue
        readers = dict.fromkeys(f"{number} ({step_name})" for number, step_name, _ in entries)
        lines.append(f"{len(entries)} inputs do not exist ({where}), read by steps "
                     f"{name_list(list(readers), 3)}; the first: {entries[0][2]}; {fix}")
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
    and .json, the same table ``featcache table`` builds from those runs (and its ``record``
    and ``readme`` section, see :func:`publish_report`); for a sweep, results.md, .csv, .json
    and sweep.png."""
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
    document = report_document(recipe, results)
    write_text_atomic(out / "results.json", json.dumps(document, indent=2) + "\n")
    publish_report(recipe, document)
    return table, out / "results.md"


def report_document(recipe: Recipe, results: ResultsTable) -> dict:
    """What results.json holds: the table's cells (:meth:`ResultsTable.to_json`), what made
    them (``provenance``) and, with the report's ``versus``, each dataset's paired
    comparisons (``comparisons``)."""
    document = results.to_json()
    documents = [d for cell in results.cells.values() for d in cell.documents]
    created = sorted(str(d["created"])[:10] for d in documents if d.get("created"))
    document["provenance"] = {
        "command": f"featcache pipeline run pipelines/{recipe.path.name}",
        "run_id": recipe.report.get("run_id"),
        "runs_created": [created[0], created[-1]] if created else None,
        "featcache_versions": sorted({str(d["featcache_version"]) for d in documents
                                      if d.get("featcache_version")}),
        "numerics_versions": sorted({str(d["numerics_version"]) for d in documents
                                     if d.get("numerics_version") is not None}),
    }
    if recipe.report.get("versus"):
        document["comparisons"] = comparisons(results, recipe.report["versus"],
                                              recipe.report.get("run_id"))
    return document


def comparisons(results: ResultsTable, versus: str, run_id: str | None) -> dict:
    """Per dataset, each loss's paired difference to ``versus`` on the same resampled test
    images, Holm's correction over that dataset's comparisons: what ``featcache table
    cache/<dataset>/runs --run-id ID --versus LOSS`` prints, dataset by dataset."""
    from featcache.protocol.uncertainty import table_uncertainty
    from featcache.stats import Resampling

    plan = Resampling()
    found: dict[str, list[dict]] = {}
    method = ""
    for dataset in results.datasets:
        cells = {key: cell for key, cell in results.cells.items() if key[1] == dataset}
        if (versus, dataset) not in cells:
            continue
        unc = table_uncertainty(cells, plan, versus)
        method = unc.method()
        found[dataset] = [
            {"loss": loss, **mine.versus.to_json(), "survives_holm": mine.survives_holm}
            for loss in results.losses
            if (mine := unc.cells.get((loss, dataset))) is not None and mine.versus is not None]
    return {"versus": versus, "method": method,
            "command": f"featcache table cache/{{dataset}}/runs --run-id {run_id} --versus "
                       f"{versus}", "datasets": found}


def readme_block(document: dict) -> str:
    """The section a report writes into its ``readme``, from its results.json alone: the table,
    what made it, and the differences to the ``versus`` loss that survive Holm's correction."""
    from featcache.protocol.results_table import table_from_json

    parts = [table_from_json(document).markdown()]
    made = document.get("provenance") or {}
    if made.get("runs_created"):
        first, last = made["runs_created"]
        line = (f"Written by `{made['command']}` from runs made on {first}"
                + (f" to {last}" if last != first else ""))
        if made.get("featcache_versions"):
            line += f" by featcache {', '.join(made['featcache_versions'])}"
        if made.get("numerics_versions"):
            line += f", numerics version {', '.join(made['numerics_versions'])}"
        parts.append(line + ".")
    if made.get("note"):  # what the record itself says of where it came from
        parts.append(made["note"])
    compared = document.get("comparisons")
    if compared:
        parts.append(comparison_sentence(compared))
    return "\n\n".join(parts)


def comparison_sentence(compared: dict) -> str:
    """``Differences to `an` that survive Holm's correction ...: scene: `epr` -4.65, ...;
    yeast: none.``"""
    per_dataset = []
    for dataset, rows in compared["datasets"].items():
        kept = [row for row in rows if row.get("survives_holm")]
        kept.sort(key=lambda row: row["estimate"])
        per_dataset.append(f"{dataset}: " + (", ".join(
            f"`{row['loss']}` {row['estimate']:+.2f}" for row in kept) or "none"))
    command = compared["command"].replace("{dataset}", "<dataset>")
    return (f"Differences to `{compared['versus']}` that survive Holm's correction over each "
            f"dataset's comparisons (paired bootstrap over the test images; `{command}` prints "
            "every difference with its interval): " + "; ".join(per_dataset) + ".")


def publish_report(recipe: Recipe, document: dict) -> None:
    """Copy ``document`` (results.json) to the report's ``record`` and write its section of
    the report's ``readme`` from it."""
    if recipe.report.get("record"):
        path = _beside(recipe, "record")
        write_text_atomic(path, json.dumps(document, indent=2) + "\n")
        say(f"{path}: the record of this table")
    if recipe.report.get("readme"):
        _write_readme_section(recipe, document)


def _write_readme_section(recipe: Recipe, document: dict) -> Path:
    """The report's section of its ``readme``, written from ``document``; said when done."""
    readme = _beside(recipe, "readme")
    if publish_section(readme, recipe.name, readme_block(document)):
        say(f"{readme}: the {recipe.name} section now holds this table")
    return readme


def _beside(recipe: Recipe, key: str) -> Path:
    """The file a report key names, relative to the recipe's folder."""
    return Path(os.path.normpath(recipe.path.parent / recipe.report[key]))


def render_report(recipe: Recipe) -> Path:
    """Write the report's ``readme`` section again from its ``record`` (no run is read)."""
    missing = [key for key in ("record", "readme") if not recipe.report.get(key)]
    if missing:
        raise InputError(f"{recipe.path}: its [report] has no {' or '.join(missing)}: nothing "
                         "to render")
    path = _beside(recipe, "record")
    if not path.is_file():
        raise InputError(f"{path} does not exist: run the recipe first (`featcache pipeline run "
                         f"{recipe.path}`)")
    document = read_table_record(path, f"make it again: `featcache pipeline run {recipe.path}`")
    return _write_readme_section(recipe, document)


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
            description = read_recipe(path).get("description", "")
        except InputError:
            description = "(not a valid recipe: `featcache pipeline run` on it says why)"
        out.append((path, description))
    return out
