"""``featcache cam``: class activation maps of trained runs on one image, as a PNG figure."""

from __future__ import annotations

import click

from featcache.commands.common import FiniteFloat, device_option, overwrite_option


@click.command("cam")
@click.option("--run", "run_paths", required=True, multiple=True, type=click.Path(),
              help="A finished run folder (stage two or three); repeat to compare runs, one row "
                   "each (e.g. --run runs/an/ID --run runs/ll-r/ID).")
@click.argument("image", type=click.Path(dir_okay=False))
@click.option("--class", "class_names", multiple=True,
              help="A class to map (repeatable)  [default: the --top most probable].")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True,
              help="Map the K most probable classes (of the first run, so rows compare).")
@click.option("--out", required=True, type=click.Path(),
              help="The PNG to write.")
@click.option("--alpha", type=FiniteFloat(0, 1), default=0.6, show_default=True,
              help="Opacity of the map's brightest spot over the image (fainter where the map "
                   "is low).")
@click.option("--cmap", default="magma", show_default=True,
              help="A matplotlib colour map (perceptually uniform ones read best: magma, "
                   "viridis, inferno).")
@device_option
@overwrite_option
def command(run_paths, image, class_names, top, out, alpha, cmap, device, overwrite):
    """Draw class activation maps of RUN's head on IMAGE into a PNG.

    \b
    A ResNet's last convolutional map F (D x h x w) averages to the pooled feature the linear
    head sees, so W_c . F at every position is the exact map of class c (its mean is the
    class's logit). Transformer and ConvNeXt trunks map the head over their patch tokens (or
    normalised positions) instead, which shows where it responds (`docs/api.md`). Maps are
    upsampled to the part of the image the backbone saw, scaled to [0, 1] each, multiplied by
    the class's probability (an unlikely class shows no spot), and overlaid; the colour bar
    reads the scale and each panel's title gives the class and its probability.
    Several --run give one row each: Kim et al.'s comparison figure, e.g.
      featcache cam --run cache/voc/runs/an/ID --run cache/voc/runs/ll-r/ID img.jpg \\
          --class dog --out dog.png
    """
    from matplotlib import colormaps

    from featcache.api.cam import class_activation_maps, draw_maps
    from featcache.api.runs import load_run
    from featcache.errors import OptionError, plural, unknown_name
    from featcache.interrupt import check_stop, on_stop, safe_points
    from featcache.paths import check_out

    check_out(out, "--out", (".png",), "a PNG figure", inputs=[image, *run_paths],
              overwrite=overwrite)
    if cmap not in colormaps:
        raise OptionError(unknown_name("colour map", cmap, sorted(colormaps),
                                       listing="matplotlib's colormaps"))
    runs = [load_run(path) for path in run_paths]
    names = list(class_names)
    rows = []
    with on_stop(f"{out} was not written; run the same command again"), safe_points():
        for run in runs:
            if run.classes != runs[0].classes:
                raise OptionError(f"runs {runs[0].path} and {run.path} predict different "
                                  "classes; compare runs of one dataset")
            check_stop()
            maps = class_activation_maps(run, image, names or None, top, device)
            names = names or [m.name for m in maps.maps]  # the first run's top classes for all
            rows.append(maps)
        check_stop()
    draw_maps(rows, out, title=str(image), alpha=alpha, cmap=cmap, overwrite=overwrite)
    click.echo(f"class activation maps of {', '.join(names)} from {plural(len(rows), 'run')} -> {out}")
