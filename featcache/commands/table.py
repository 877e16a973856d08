"""``featcache table``: a paper table rebuilt from finished runs' results.json files."""

from __future__ import annotations

import click

from featcache.commands.common import GENERATOR_SEED, FiniteFloat, overwrite_option
from featcache.errors import plural

#: the file endings each --format may be written to
TABLE_SUFFIXES = {"md": (".md", ".markdown", ".txt"), "csv": (".csv", ".txt"),
                  "latex": (".tex",), "json": (".json",)}


@click.command("table")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["md", "csv", "latex", "json"]), default="md",
              show_default=True, help="Markdown, CSV (plain numbers), LaTeX (booktabs) or JSON "
                                      "(every cell with each seed's selected configuration).")
@click.option("--per-class", is_flag=True, default=False,
              help="Per-class test AP instead: one table per dataset, classes as rows.")
@click.option("--out", default="-", show_default=True, help="Output file, or - for stdout.")
@click.option("--label", default="tab:featcache", show_default=True,
              help="LaTeX \\label of the table.")
@click.option("--run-id", default=None,
              help="Take only the runs of this run id (from the folders searched).")
@click.option("--all-runs", is_flag=True, default=False,
              help="Take every run found, pooling the seeds of the runs of one loss (they must "
                   "share their settings)  [default: the latest run of each loss].")
@click.option("--ci", is_flag=True, default=False,
              help="Add 95% bootstrap intervals: each cell reads mean [low, high] (test images "
                   "resampled, and seeds where there are several).")
@click.option("--versus", metavar="LOSS", default=None,
              help="Add each cell's difference to LOSS on the same resampled images, with its "
                   "paired interval, the share of resamples it wins, and Holm's correction "
                   "(implies --ci).")
@click.option("--sets", "sets_level", type=FiniteFloat(0, 1, min_open=True, max_open=True),
              default=None,
              help="Conformal label sets at this level (e.g. 0.9) beside each cell's mAP: the "
                   "share of each test image's true positives its set holds and the mean set "
                   "size, each with its 95% bootstrap interval, and the smallest top-k of the same "
                   "share (each run's records; docs/label-sets.md).")
@click.option("--sets-method", type=click.Choice(["rank", "threshold", "class"]), default="rank",
              show_default=True, help="How --sets calibrates (see `featcache predict --help`).")
@click.option("--resamples", type=click.IntRange(1, 1_000_000), default=1000, show_default=True,
              help="Bootstrap resamples of --ci / --versus.")
@click.option("--ci-seed", type=GENERATOR_SEED, default=0, show_default=True,
              help="Seed of the bootstrap's resampling (the same seed, the same intervals).")
@overwrite_option
def command(run_dirs, fmt, per_class, out, label, run_id, all_runs, ci, versus, sets_level,
            sets_method, resamples, ci_seed, overwrite):
    """Rebuild a results table from RUN_DIRS: run folders, or folders holding runs (searched
    for results.json), e.g. cache/voc/runs cache/coco/runs.

    \b
    Where a searched folder holds several runs of one loss, the latest is taken (the command
    says which); --run-id ID takes the runs of that id, --all-runs every run. Run folders
    named one by one are all taken.

    \b
    Rows are losses, columns datasets; a cell is the test mAP, mean ± sd over every seed of
    the runs found for it (runs of one loss and dataset must share their settings except the
    seeds), with the published number and the difference where the protocol has one and the
    best mean per dataset in bold. The caption says the stage, datasets, backbone and weights,
    grid, epochs, validation labels and seeds. Markdown and LaTeX add each seed's selected
    configuration; JSON holds it per cell. Classes without a test positive are named.

    \b
    --ci reads each run's test scores (test-scores.h5; for an older stage-two run, its
    best.pt and features file) and adds a 95% bootstrap interval to every cell; --versus an
    compares every loss with an on the same resampled images (docs/uncertainty.md).
    """
    import json

    from featcache.errors import OptionError
    from featcache.fileio import write_text_atomic
    from featcache.paths import check_out
    from featcache.protocol.results_table import ResultsTable

    if run_id is not None and all_runs:
        raise OptionError("--run-id and --all-runs choose runs in two ways: give one")
    if out != "-":
        check_out(out, "--out", TABLE_SUFFIXES[fmt], f"--format {fmt}", overwrite=overwrite)
    if per_class and (ci or versus):
        raise OptionError("--per-class takes no --ci or --versus: the per-class paired "
                          "intervals are the heatmap of `featcache report`")
    results = ResultsTable.from_paths(run_dirs, run_id=run_id, all_runs=all_runs)
    for line in results.chosen:
        click.echo(f"note: {line}", err=True)
    if sets_level is not None:
        text = _with_sets(results, fmt, label, sets_level, sets_method, per_class or ci or versus)
    elif ci or versus:
        text = _with_intervals(results, fmt, label, versus, resamples, ci_seed)
    elif fmt == "json":
        text = json.dumps(results.to_json(per_class=per_class), indent=2) + "\n"
    elif per_class and fmt == "csv":
        text = results.per_class_flat().csv()
    elif per_class:
        tables = [results.per_class(dataset) for dataset in results.datasets]
        text = _render(tables, fmt, label)
    else:
        text = _render([results.table()], fmt, label, results)
    if out == "-":
        click.echo(text, nl=False)
    else:  # not through featcache.api, whose import loads torch
        write_text_atomic(out, text, overwrite=overwrite)
        click.echo(f"table of {plural(len(results.losses), 'loss', 'losses')} x "
                   f"{plural(len(results.datasets), 'dataset')} "
                   f"-> {out}")


def _with_intervals(results, fmt: str, label: str, versus: str | None, resamples: int,
                    seed: int) -> str:
    """The table with intervals (and comparisons with ``versus``) in ``fmt``."""
    import json

    from featcache.errors import OptionError, did_you_mean
    from featcache.protocol.uncertainty import table_uncertainty
    from featcache.protocol.uncertainty_table import (
        flat_interval_table,
        interval_json,
        interval_table,
    )
    from featcache.stats import Resampling

    if versus is not None and versus not in results.losses:
        raise OptionError(f"--versus {versus}: no run of that loss among the runs tabulated "
                          f"({', '.join(results.losses)}){did_you_mean(versus, results.losses)}")
    unc = table_uncertainty(results.cells, Resampling(resamples, seed), versus)
    if fmt == "json":
        return json.dumps(interval_json(results, unc), indent=2) + "\n"
    if fmt == "csv":
        return flat_interval_table(results, unc).csv()
    table = interval_table(results, unc)
    if fmt == "latex":
        return (table.latex(label=label) + "\n"
                + results.configurations(runs=False).latex(label=f"{label}-configurations"))
    return table.markdown() + "\n\n" + results.configurations().markdown() + "\n"


def _with_sets(results, fmt: str, label: str, level: float, method: str, other: bool) -> str:
    """The label-set table in ``fmt`` (``other``: a table option it cannot take was given)."""
    import json

    from featcache.errors import OptionError
    from featcache.protocol.label_sets_table import flat_sets_table, label_sets_table

    if other:
        raise OptionError("--sets is a table of its own (mAP, share and set size with their "
                          "intervals): give it without --per-class, --ci and --versus")

    if fmt == "json":
        return json.dumps(flat_sets_table(results, level, method).records(), indent=2) + "\n"
    if fmt == "csv":
        return flat_sets_table(results, level, method).csv()
    table = label_sets_table(results, level, method)
    return table.latex(label=label) if fmt == "latex" else table.markdown() + "\n"


def _render(tables, fmt: str, label: str, results=None) -> str:
    if fmt == "csv":
        return results.flat_table().csv()
    if fmt == "latex":
        parts = [table.latex(label=label if len(tables) == 1 else f"{label}-{i}")
                 for i, table in enumerate(tables)]
        if results is not None:
            parts.append(results.configurations(runs=False).latex(
                label=f"{label}-configurations"))
        return "\n".join(parts)
    parts = [table.markdown() for table in tables]
    if results is not None:
        parts.append(results.configurations().markdown())
    return "\n\n".join(parts) + "\n"
