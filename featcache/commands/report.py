"""``featcache report``: one self-contained HTML page of a dataset's runs."""

from __future__ import annotations

import click

from featcache.commands.common import overwrite_option


@click.command("report")
@click.argument("dataset_dir", type=click.Path())
@click.option("--out", type=click.Path(), default=None,
              help="The HTML file to write  [default: DATASET_DIR/report.html].")
@click.option("--runs", "run_patterns", multiple=True, metavar="PATTERN[,PATTERN...]",
              help="Only these runs (repeatable or comma-separated): a run id, <loss>/<run-id> "
                   "or runs|finetune/<loss>/<run-id>, shell patterns allowed (demo-*)  "
                   "[default: every finished run].")
@click.option("--title", default=None, help="The page's title  [default: featcache report: "
                                            "<dataset>].")
@overwrite_option
def command(dataset_dir, out, run_patterns, title, overwrite):
    """Write one HTML page of the finished runs of DATASET_DIR (cache/<dataset>), both stages.

    \b
    The page holds, from the runs' results.json files: the loss table of each stage (test
    mAP mean ± sd over seeds, published numbers beside ours, sortable), every run's learning
    curves grouped by loss (val and test mAP per epoch, the selected point marked), per-class
    AP as a heatmap (losses x classes; the classes a loss gains or loses on `an` outlined),
    each fine-tuned run beside its linear start, the CAM figures `featcache cam` wrote under
    DATASET_DIR, and for every number the command, settings and fingerprint that made it.
    It is self-contained (inline CSS, SVG and images, no URL): open it from disk. A report
    written before is replaced; any other existing file only with --overwrite.
      featcache report cache/voc --runs real-features --out voc.html
    """
    from pathlib import Path

    from featcache.paths import check_out
    from featcache.report import DEFAULT_NAME, is_report, write_report

    target = Path(dataset_dir) / DEFAULT_NAME if out is None else Path(out)
    replaced = target.is_file() and is_report(target)  # a page it wrote: replaced as asked
    check_out(target, "--out" if out is not None else "the report", (".html", ".htm"),
              "an HTML page", overwrite=overwrite or replaced)
    patterns = [p.strip() for value in run_patterns for p in value.split(",") if p.strip()]
    path = write_report(dataset_dir, out, patterns, title, overwrite or replaced)
    click.echo(f"report -> {path}" + (" (replacing the report written there before)"
                                      if replaced else ""))
