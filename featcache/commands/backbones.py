"""``featcache backbones``: every registered backbone with its weights, width and preprocessing."""

from __future__ import annotations

import click


def describe(spec) -> dict:
    """The cells of one backbone (a ``featcache.protocol.catalog.BackboneInfo``; whether its
    library is installed and its default weights are on this machine are looked up, never
    downloaded)."""
    from featcache.backbones.hub import EXTRA

    pre = spec.preprocess
    if pre["resize"] == "squash":
        resize = f"squash to s x s, {pre['interpolation']}"
    else:
        resize = f"shorter side to s/{pre['crop_pct']:g}, centre crop, {pre['interpolation']}"
    installed = spec.library_installed()
    return {
        "name": spec.name,
        "library": spec.library,
        "model": spec.model,
        "weights": spec.default_weights,
        "dim": spec.dim,
        "size": spec.default_image_size,
        "preprocess": f"{resize}; mean {_triple(pre['mean'])} std {_triple(pre['std'])}",
        "pooling": spec.pooling,
        "text": "yes" if spec.has_text else "-",
        "available": ("yes" if installed else f"needs featcache[{EXTRA}]") + _weights_note(spec, installed),
        "summary": spec.summary,
    }


def _availability(available: str) -> str:
    """The ``available`` column in words: 'yes...' means the library is installed."""
    return "library installed" + available[len("yes"):] if available.startswith("yes") else available


def _triple(values) -> str:
    return "/".join(f"{v:.3g}" for v in values)


def _weights_note(spec, installed: bool) -> str:
    """'' or '; weights cached' / '; weights not cached' for the default weights."""
    cached = spec.weights_cached() if installed else None
    if cached is None:
        return ""
    return "; weights cached" if cached else "; weights not cached"


@click.command("backbones")
@click.option("--all", "show_all", is_flag=True, default=False,
              help="Also list the tiny random test networks (test-vit, test-convnext, test-clip).")
@click.option("--markdown", is_flag=True, default=False, help="Print one Markdown table.")
def command(show_all: bool, markdown: bool) -> None:
    """List every backbone `featcache features --backbone` takes: library and model, default
    weights (`--weights`), pooled feature width, default input size (`--image-size`), native
    preprocessing (`--preprocess native`), how the pooled feature is made, whether it has a text
    tower (`--text`), and whether it can run here (library installed, default weights cached).

    timm and open_clip backbones need the extra: pip install 'featcache[backbones]'.
    """
    from featcache.protocol.catalog import catalog
    from featcache.tables import Table

    rows = [describe(info) for info in catalog().backbone_list(testing=show_all)]
    columns = ["name", "library", "model", "weights", "dim", "size", "preprocess", "pooling",
               "text", "available"]
    table = Table(columns)
    for row in rows:
        table.add(*(row[c] for c in columns))
    if markdown:
        click.echo(table.markdown())
        return
    for row in rows:
        click.echo(f"{row['name']:<18}{row['summary']}")
        click.echo(f"{'':<18}{row['library']} {row['model']}, weights {row['weights']}, "
                   f"{row['dim']}-d, {row['size']} px, pooling {row['pooling']}, "
                   f"{'text tower (--text)' if row['text'] == 'yes' else 'no text tower'}; "
                   f"{_availability(row['available'])}")
        click.echo(f"{'':<18}preprocess: {row['preprocess']}")
