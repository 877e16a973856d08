"""``featcache predict``: a trained run's probabilities for a features file or for images."""

from __future__ import annotations

import click

from featcache.commands.common import FiniteFloat, device_option, overwrite_option
from featcache.errors import plural

#: the file endings each --format may be written to
PREDICT_SUFFIXES = {"csv": (".csv", ".txt"), "jsonl": (".jsonl", ".json", ".ndjson")}


def refuse_filters_with_sets(sets_level, top_k, threshold) -> None:
    if sets_level is not None and (top_k is not None or threshold is not None):
        raise click.UsageError("--sets chooses each row's labels itself: give it without "
                               "--top-k and --threshold")


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
@click.option("--sets", "sets_level", type=FiniteFloat(0, 1, min_open=True, max_open=True),
              default=None,
              help="Conformal label sets at this level (e.g. 0.9): each row's labels, chosen so "
                   "that a set holds a random true positive of an image like the run's "
                   "validation rows with at least this probability (a labels column in CSV, a "
                   "labels list in JSON lines); calibrated on the observed positives of the "
                   "run's validation rows (docs/label-sets.md).")
@click.option("--sets-method", type=click.Choice(["rank", "threshold", "class"]), default="rank",
              show_default=True,
              help="How --sets calibrates: rank (each row's top classes, the last by its "
                   "probability), threshold (one probability cut for every class) or class "
                   "(one cut per class).")
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
def command(run_path, features_path, images, out, fmt, top_k, threshold, sets_level,
            sets_method, split, other_classes, batch_size, workers, precision, skip_bad, quiet,
            device, overwrite):
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
      featcache predict --run RUN photos/ --sets 0.9 --format jsonl
    """
    from featcache.api.label_sets import rule_note
    from featcache.api.predict import (
        check_input,
        guess_format,
        prediction_text,
        read_features_input,
        write_text,
    )
    from featcache.api.runs import load_run
    from featcache.interrupt import on_stop
    from featcache.runtime import default_workers, pick_device

    if (features_path is None) == (not images):
        raise click.UsageError("give either --features FILE or IMAGES (files or folders)")
    refuse_filters_with_sets(sets_level, top_k, threshold)
    _check_out(out, fmt, [p for p in (features_path, run_path, *images) if p], overwrite)
    run = load_run(run_path)
    rule = None if sets_level is None else run.label_set_rule(sets_level, sets_method)
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
    sets = None if rule is None else rule.sets(probs)
    write_text(prediction_text(ids, probs, run.classes, fmt, top_k, threshold, sets), out,
               overwrite)
    if rule is not None:
        click.echo(rule_note(rule, run.classes, run.path), err=True)
    if out != "-":
        click.echo(f"{plural(len(ids), 'row')} x {plural(len(run.classes), 'class', 'classes')} -> {out}")
    if threshold is not None:
        _say_unlabelled(probs, threshold)


def _check_out(out: str, fmt: str | None, inputs: list, overwrite: bool) -> None:
    """Refuse an --out that is not a predictions file name, or one that exists or is an input."""
    from featcache.paths import check_out

    if out != "-":
        suffixes = (PREDICT_SUFFIXES[fmt] if fmt else PREDICT_SUFFIXES["csv"] + PREDICT_SUFFIXES["jsonl"])
        check_out(out, "--out", suffixes, f"predictions ({fmt or 'csv or jsonl, from the ending'})",
                  inputs=inputs, overwrite=overwrite)


def _say_unlabelled(probs, threshold: float) -> None:
    """One note when --threshold leaves rows without any class (an empty labels cell)."""
    empty = int((~(probs >= threshold).any(axis=1)).sum())
    if empty:
        top = float(probs.max(axis=1).min())
        click.echo(f"note: {plural(empty, 'row has', 'rows have')} (of {len(probs)}) no "
                   f"class with probability at least {threshold:g}: their labels are empty (the least "
                   f"confident row's most probable class has {top:.3g}; a lower --threshold "
                   "labels more rows)", err=True)
