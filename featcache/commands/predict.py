"""``featcache predict``: a trained run's probabilities for a features file or for images."""

from __future__ import annotations

import click

from featcache.commands.common import FiniteFloat, device_option, overwrite_option
from featcache.errors import plural

#: the file endings each --format may be written to
PREDICT_SUFFIXES = {"csv": (".csv", ".txt"), "jsonl": (".jsonl", ".json", ".ndjson")}


@click.command("predict")
@click.option("--run", "run_path", required=True, type=click.Path(),
              help="A finished run folder: cache/<dataset>/runs/<loss>/<id> (stage two) or "
                   "cache/<dataset>/finetune/<loss>/<id> (stage three).")
@click.option("--features", "features_path", type=click.Path(dir_okay=False), default=None,
              help="Score a features file instead of images: a featcache features-<tag>.h5 of "
                   "the run's backbone and weights, or a .npy / .npz array (X) of its width.")
@click.argument("images", nargs=-1, type=click.Path())
@click.option("--out", default="-", show_default=True,
              help="Output file, or - for stdout.")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default=None,
              help="csv: image, then a probability column per class; jsonl: one JSON object per "
                   "row  [default: from --out's ending, else csv].")
@click.option("--top-k", type=click.IntRange(min=1), default=None,
              help="Keep each row's K most probable classes (a labels column in CSV).")
@click.option("--threshold", type=FiniteFloat(0, 1), default=None,
              help="Keep the classes with probability at least T (with --top-k: both).")
@click.option("--split", type=click.Choice(["all", "train", "test"]), default="all",
              show_default=True, help="With a features file: which official split's rows.")
@click.option("--other-classes", is_flag=True, default=False,
              help="Score an input labelled with other classes than the run's anyway.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Images per forward pass  [default: 256 on a GPU, 32 on the CPU].")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="DataLoader processes decoding images  [default: 1 on the CPU, more on a GPU].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto",
              show_default=True, help="Backbone precision for images (auto: bf16 on GPUs).")
@click.option("--skip-bad", is_flag=True, default=False,
              help="Leave out images that cannot be read (each is named) instead of stopping.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@device_option
@overwrite_option
def command(run_path, features_path, images, out, fmt, top_k, threshold, split, other_classes,
            batch_size, workers, precision, skip_bad, quiet, device, overwrite):
    """Probabilities of a trained run for new data: one row per image (or features row).

    \b
    IMAGES are image files or folders (searched for images, recursively); they go through
    the run's own backbone and preprocessing: for a stage-two run the backbone and weights
    its features came from, for a fine-tuned run its fine-tuned network; decoded with PIL and
    resized to the run's image size, as stage one does. A file that cannot be read is named.
    Examples:
      featcache predict --run cache/voc/runs/role/best photos/ --out predictions.csv
      featcache predict --run RUN --features cache/voc/features-resnet50.h5 --split test
      featcache predict --run RUN photo.jpg --top-k 3 --format jsonl
    """
    from featcache.api.predict import (
        check_input,
        guess_format,
        prediction_text,
        read_features_input,
        write_text,
    )
    from featcache.api.runs import load_run
    from featcache.interrupt import on_stop
    from featcache.paths import check_out
    from featcache.runtime import default_workers, pick_device

    if (features_path is None) == (not images):
        raise click.UsageError("give either --features FILE or IMAGES (files or folders)")
    if out != "-":
        suffixes = (PREDICT_SUFFIXES[fmt] if fmt else PREDICT_SUFFIXES["csv"] + PREDICT_SUFFIXES["jsonl"])
        check_out(out, "--out", suffixes, f"predictions ({fmt or 'csv or jsonl, from the ending'})",
                  inputs=[p for p in (features_path, run_path, *images) if p], overwrite=overwrite)
    run = load_run(run_path)
    if features_path is not None:
        given = read_features_input(features_path, split)
        check_input(run, given, other_classes=other_classes)
        ids, probs = given.ids, run.predict_proba(given.features)
    else:
        where = pick_device(device)
        with on_stop("no predictions were written; run the same command again"):
            kept, features = run.run_images(
                images, batch_size=batch_size, device=str(where),
                workers=default_workers(where) if workers is None else workers,
                precision=precision, skip_bad=skip_bad, progress=not quiet)
        ids = [str(path) for path in kept]
        probs = run.predict_proba(features)
    fmt = guess_format(out, fmt)
    write_text(prediction_text(ids, probs, run.classes, fmt, top_k, threshold), out, overwrite)
    if out != "-":
        click.echo(f"{plural(len(ids), 'row')} x {plural(len(run.classes), 'class', 'classes')} -> {out}")
    if threshold is not None:
        _say_unlabelled(probs, threshold)


def _say_unlabelled(probs, threshold: float) -> None:
    """One note when --threshold leaves rows without any class (an empty labels cell)."""
    empty = int((~(probs >= threshold).any(axis=1)).sum())
    if empty:
        top = float(probs.max(axis=1).min())
        click.echo(f"note: {plural(empty, 'row has', 'rows have')} (of {len(probs)}) no "
                   f"class with probability at least {threshold:g}: their labels are empty (the least "
                   f"confident row's most probable class has {top:.3g}; a lower --threshold "
                   "labels more rows)", err=True)
