"""``featcache losses``: every registered loss with its reference, summary and parameters."""

from __future__ import annotations

import shutil
import textwrap

import click

DATASETS = ("voc", "coco", "nuswide", "cub")


def format_value(value) -> str:
    """A default as shown: ``None`` means the data supplies it."""
    return "(labels file)" if value is None else f"{value:g}"


def describe(cls) -> dict[str, str]:
    """The text cells of one loss (a ``featcache.protocol.catalog.LossInfo``)."""
    params = ", ".join(f"{key}={format_value(param.default)} in {param.range}"
                       for key, param in cls.params.items())
    per_dataset = "; ".join(
        f"{dataset}: " + ", ".join(f"{k}={format_value(v)}" for k, v in cls.dataset_defaults[dataset].items())
        for dataset in DATASETS if dataset in cls.dataset_defaults
    )
    return {
        "name": cls.name,
        "reference": cls.reference,
        "year": str(cls.year or "-"),
        "paper": cls.paper or "-",
        "summary": cls.summary,
        "params": params or "none",
        "datasets": per_dataset or "-",
        "needs": ", ".join(cls.needs) or "-",
    }


def markdown_table(rows: list[dict[str, str]]) -> str:
    """A Markdown table of every loss (for the README)."""
    header = ("loss", "reference", "year", "paper", "what it does",
              "parameters (default in range)", "per-dataset defaults", "needs")
    keys = ("name", "reference", "year", "paper", "summary", "params", "datasets", "needs")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [f"`{row['name']}`"] + [row[key].replace("|", "\\|") for key in keys[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def text_table(rows: list[dict[str, str]], width: int) -> str:
    """A plain-text table: name, reference and summary, then the parameters under each loss."""
    name_w = max(len(row["name"]) for row in rows) + 2
    ref_w = min(max(len(row["reference"]) for row in rows), 26) + 2
    text_w = max(width - name_w - ref_w, 30)
    indent = " " * name_w
    lines = [f"{'LOSS':<{name_w}}{'REFERENCE':<{ref_w}}SUMMARY"]
    for row in rows:
        refs = textwrap.wrap(row["reference"], ref_w - 2) or [""]
        summary = textwrap.wrap(row["summary"], text_w) or [""]
        for i in range(max(len(refs), len(summary))):
            first = row["name"] if i == 0 else ""
            ref = refs[i] if i < len(refs) else ""
            text = summary[i] if i < len(summary) else ""
            lines.append(f"{first:<{name_w}}{ref:<{ref_w}}{text}".rstrip())
        details = [("paper", f"{row['paper']} ({row['year']})"), ("parameters", row["params"]),
                   ("per dataset", row["datasets"]), ("needs", row["needs"])]
        for label, value in details:
            if value != "-" or label == "parameters":
                lines.extend(textwrap.wrap(f"{label}: {value}", width - name_w,
                                           initial_indent=indent, subsequent_indent=indent + "  "))
    return "\n".join(lines)


def parameter_help(cls) -> str:
    """One loss in detail: its docstring's first paragraph and each parameter's meaning."""
    lines = [f"{cls.name} ({cls.reference}): {cls.paper} ({cls.year})", textwrap.dedent(cls.doc), ""]
    for key, param in cls.params.items():
        per_dataset = ", ".join(f"{d} {format_value(cls.dataset_defaults[d][key])}"
                                for d in DATASETS if key in cls.dataset_defaults.get(d, {}))
        extra = f" [{per_dataset}]" if per_dataset else ""
        lines.append(f"  {key} = {format_value(param.default)}{extra}, in {param.range}: "
                     f"{param.help}")
    if not cls.params:
        lines.append("  (no parameters)")
    if cls.needs:
        lines.append("  needs: " + ", ".join(cls.needs))
    if cls.handoff_state:
        lines.append("  hands to fine-tuning: " + ", ".join(cls.handoff_state))
    return "\n".join(lines)


@click.command("losses")
@click.argument("names", nargs=-1)
@click.option("--markdown", is_flag=True, default=False,
              help="Print one Markdown table (loss, reference, year, paper, summary, parameters "
                   "with defaults and ranges, per-dataset defaults, needs), e.g. for the README.")
def command(names: tuple[str, ...], markdown: bool) -> None:
    """List every loss: name, reference, paper and year, one-line summary, parameters with
    their defaults and valid ranges, per-dataset defaults (voc, coco, nuswide, cub) and what
    the data must offer.

    Give loss NAMES to see those losses in detail, each parameter explained. Training takes
    a parameter as `--param name=value`; `docs/losses.md` writes out every formula.
    """
    from featcache.protocol.catalog import catalog

    losses = catalog()
    classes = [losses.loss(name) for name in (names or losses.loss_names())]
    if names and not markdown:
        click.echo("\n\n".join(parameter_help(cls) for cls in classes))
        return
    rows = [describe(cls) for cls in classes]
    if markdown:
        click.echo(markdown_table(rows))
    else:
        click.echo(text_table(rows, shutil.get_terminal_size((100, 24)).columns))
