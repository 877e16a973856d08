"""``featcache prepare``: stage zero, from a dataset's own layout to ``<cache>/<name>/labels.h5``."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import click

from featcache.commands.common import NUMPY_SEED, FiniteFloat, cache_option, overwrite_option
from featcache.errors import plural

#: dataset names the built-in formats write; users' own data takes other names
BUILT_IN_NAMES = ("voc", "coco", "nuswide", "cub", "shapes", "l48")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PROTOCOL_SEED = 1200

dir_path = click.Path(exists=False, file_okay=False, path_type=Path)
file_path = click.Path(exists=False, dir_okay=False, path_type=Path)


OBSERVERS = ("uniform", "size", "location", "semantic")


def observation_options(func):
    """--num-pos/--num-neg/--observe/--class-weights/--obs-seed/--split-seed."""
    options = [
        click.option("--num-pos", type=click.IntRange(min=-1), default=1, show_default=True,
                     help="Observed positives per image (-1: all). The protocol observes 1."),
        click.option("--num-neg", type=click.IntRange(min=-1), default=0, show_default=True,
                     help="Observed negatives per image (-1: all); the 'iu' loss needs 1."),
        click.option("--observe", type=click.Choice(OBSERVERS), default="uniform",
                     show_default=True,
                     help="Which positive is observed: uniform (the protocol), or biased as in "
                          "Arroyo et al. 2023: size (large objects), location (objects near the "
                          "centre; both need boxes: voc, coco, shapes), semantic (per-class "
                          "weights, --class-weights)."),
        click.option("--class-weights", type=file_path, default=None,
                     help="--observe semantic: JSON object {\"class\": weight, ...} naming every "
                          "class."),
        click.option("--obs-seed", type=NUMPY_SEED, default=PROTOCOL_SEED, show_default=True,
                     help="Seed of the observation sampler: a fresh RandomState(seed) for the "
                          "official train and test matrices each (the reference's --seed; the "
                          "biased samplers use random.Random(seed), as Arroyo et al.)."),
        click.option("--split-seed", type=NUMPY_SEED, default=PROTOCOL_SEED, show_default=True,
                     help="Seed of the 80/20 train/validation split of the official train set."),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def image_options(func=None, *, drop_missing: bool = True, images_help: str | None = None):
    """--images/--labels-only (and --drop-missing unless the format always drops).

    With ``images_help``, --images is required (users' own data has no official place).
    """
    if func is None:
        return functools.partial(image_options, drop_missing=drop_missing, images_help=images_help)
    options = [
        click.option("--images", type=dir_path, required=images_help is not None, default=None,
                     help=images_help or "Image folder, when not in the official place under "
                                         "--root."),
        click.option("--labels-only", is_flag=True,
                     help="Write the labels without looking for the images (recorded in the "
                          "file, so that later stages know the images were never checked)."),
    ]
    options.append(click.option(
        "--verify-images/--no-verify-images", "verify_images", default=None,
        help="Decode every image now, with a summary of their modes and sizes, naming those "
             "that cannot be read  [default: on for at most 50,000 images]. 16-bit images are "
             "scaled to 8 bits (docs/prepare.md)."))
    if drop_missing:
        options.append(click.option(
            "--drop-missing", is_flag=True,
            help="Drop listed images that are missing (recorded in the file) instead of "
                 "stopping with an error."))
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def output_options(func):
    return cache_option(overwrite_option(func))


def official_layout_command(name: str, root_help: str, options=(), drop_missing: bool = True):
    """A ``prepare <name>`` subcommand reading an official layout under --root.

    Its options, in --help order: --root, the format's own ``options``, the image options,
    the observation options, --cache and --overwrite.
    """
    def decorate(func):
        stack = [click.option("--root", type=dir_path, required=True, help=root_help),
                 *options, image_options(drop_missing=drop_missing), observation_options,
                 output_options, click.pass_context]
        for option in reversed(stack):
            func = option(func)
        return command.command(name)(func)
    return decorate


@click.group("prepare", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Stage zero: turn a dataset into <cache>/<dataset>/labels.h5.

    The labels file holds the class names, the image paths, the clean label matrices of the
    official train and test sets, the observed single-positive labels (one positive per
    image, drawn with a fresh RandomState(1200) per matrix, bit for bit as the reference
    generator; --observe size|location|semantic draws it with a label-bias sampler instead)
    and the seeded 80/20 train/validation split, plus provenance: source files
    with sha256, seeds, counts, dropped rows and the featcache version. Images with no
    positive label are dropped and counted. See docs/prepare.md.

    \b
    Examples:
      featcache prepare shapes                      # the embedded demo dataset
      featcache prepare voc --root data/pascal      # VOC2012 train / val
      featcache prepare voc --root data/voc07 --year 2007 --train-split trainval --test-split test
      featcache prepare features --npz scene.npz --name scene
      featcache prepare coco --root data/coco --observe size   # label bias (Arroyo et al.)
      featcache prepare l48 --root data/ml48s --variant checklist --name l48-checklist
    """


@official_layout_command("voc", "The VOC<year> folder (holding ImageSets/Main), VOCdevkit, or the folder holding VOCdevkit.", [
    click.option("--year", default="2012", show_default=True, help="VOC edition."),
    click.option("--train-split", default="train", show_default=True,
                 help="ImageSet used as the official training set (VOC2007: trainval)."),
    click.option("--test-split", default="val", show_default=True,
                 help="ImageSet used as the test set (VOC2007: test)."),
])
def voc(ctx, root, year, train_split, test_split, images, **common):
    """PASCAL VOC from its devkit lists (20 classes, positive only where a list says 1).

    Images are looked for in VOCdevkit/VOC<year>/JPEGImages, paths '<id>.jpg'.
    """
    from featcache.data.formats.voc import read_voc

    _prepare(ctx, "voc", lambda: read_voc(root, year, train_split, test_split, images,
                                          objects=_needs_boxes(common)), **common)


@official_layout_command("coco", "Folder holding annotations/instances_{train,val}2014.json "
                                 "(and the images).")
def coco(ctx, root, images, **common):
    """MS-COCO 2014: train2014 for training, val2014 as the test set (80 classes).

    Rows are image ids sorted as strings, as the reference formatter; paths are
    'train2014/COCO_train2014_<id:012>.jpg' under --root (or --images).
    """
    from featcache.data.formats.coco import read_coco

    _prepare(ctx, "coco", lambda: read_coco(root, images, objects=_needs_boxes(common)), **common)


@official_layout_command("cub", "Top folder of the official archive: attributes.txt and "
                                "CUB_200_2011/.")
def cub(ctx, root, images, **common):
    """CUB-200-2011 with its 312 binary attributes as classes (official train/test split).

    Images are looked for in <root>/CUB_200_2011/images, paths as in images.txt.
    """
    from featcache.data.formats.cub import read_cub

    _prepare(ctx, "cub", lambda: read_cub(root, images), **common)


@official_layout_command("nuswide", "Folder holding ImageList/, Groundtruth/TrainTestLabels/ "
                                    "and Concepts81.txt.", drop_missing=False, options=[
    click.option("--split", "split_mode", type=click.Choice(["official", "merged"]),
                 default="official", show_default=True,
                 help="official: the 161,789 / 107,859 lists (as Kim et al., Zhou et al.); "
                      "merged: merge both, then draw a seeded random split like Cole et al."),
    click.option("--merged-train-size", type=click.IntRange(min=1), default=150_000,
                 show_default=True, help="Training images drawn by --split merged."),
    click.option("--merge-seed", type=NUMPY_SEED, default=PROTOCOL_SEED, show_default=True,
                 help="Seed of the --split merged draw (Cole et al.'s own seed and re-crawl are "
                      "not public: their exact split cannot be reproduced)."),
])
def nuswide(ctx, root, split_mode, merged_train_size, merge_seed, images, **common):
    """NUS-WIDE with its 81 concepts; images in <root>/Flickr (or --images).

    Every copy of NUS-WIDE lacks images that left Flickr: missing images are always dropped
    and counted (as the protocol says), never an error; the labels file lists them.
    """
    from featcache.data.formats.nuswide import read_nuswide
    from featcache.data.prepare import MergedSplit

    merge = MergedSplit(merged_train_size, merge_seed) if split_mode == "merged" else None
    _prepare(ctx, "nuswide", lambda: read_nuswide(root, images), drop_missing=True,
             merge=merge, **common)


@official_layout_command("l48", "The L48 folder as the benchmark's datasets/format_ML48S.py "
                                "writes it: formatted_metadata.json, {train,val,test}_images.npy, "
                                "_labels.npy and <variant>_<split>_mask.npy.", options=[
    click.option("--variant", type=click.Choice(["target", "checklist", "geo", "full"]),
                 default="target", show_default=True,
                 help="Which observed labels train: target (real single positives), checklist "
                      "or geo (plus real negatives from the checklist or the range prior), full "
                      "(every known label)."),
    click.option("--name", default="l48", show_default=True,
                 help="Dataset name: the output is <cache>/<name>/ (one per variant, e.g. "
                      "l48-checklist)."),
])
def l48(ctx, root, variant, name, images, **common):
    """The Merlin L48 benchmark (NeurIPS 2025 D&B): real single positives and real negatives.

    Reads the layout of cvl-umass/l48-benchmarking (images at <root>/images/<asset>/<clip>.jpg,
    or --images). Its train and val clips form the official train set with L48's own
    validation split; the observed labels are the variant's known entries (1 present, -1
    absent), kept as given; test (and validation) clips are kept when fully annotated, as
    the benchmark scores them. See docs/prepare.md.
    """
    from featcache.data.formats.l48 import read_l48

    if name != "l48":
        _check_name(name)
    _prepare(ctx, name, lambda: read_l48(root, variant, images, name), **common)


@command.command("csv")
@click.option("--train", "train_file", type=file_path, required=True,
              help="Training labels: 'image,<class 1>,...' with 0/1, or 'image,label'.")
@click.option("--test", "test_file", type=file_path, required=True,
              help="Test labels, in either style.")
@click.option("--name", required=True, help="Dataset name: the output is <cache>/<name>/.")
@click.option("--classes", "classes_file", type=file_path, default=None,
              help="Class list, one name per line, fixing the class order (default: the full-"
                   "label header, else the sorted single-positive labels of --train).")
@click.option("--k", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Mean positives per training image, for losses that need it (epr, role), "
                   "when the training labels are single positives (otherwise computed).")
@image_options(images_help="Folder the image paths of both files are relative to.")
@observation_options
@output_options
@click.pass_context
def csv_labels(ctx, train_file, test_file, name, classes_file, k, images, **common):
    """Your own data: one CSV file per split, full labels or real single positives.

    \b
    Full labels:        image,cat,dog,car       Single positives:   image,label
                        a.jpg,1,0,1                                  a.jpg,cat

    With single-positive training labels there are no clean training labels: the observed
    labels are taken as given, and whatever needs clean training labels (the 'iun' loss,
    label-recovery mAP) says so. Image paths are relative to --images.
    """
    from featcache.data.formats.csvfile import read_csv_dataset
    from featcache.errors import OptionError

    _check_name(name)

    def read():
        source = read_csv_dataset(train_file, test_file, images, name, classes_file)
        if k is not None and source.train.clean is not None:
            raise OptionError("--k is only for single-positive training labels; with full "
                              "labels k is computed from them")
        return source

    _prepare(ctx, name, read, extra={"k": k} if k is not None else None, **common)


@command.command("features")
@click.option("--npz", "npz_file", type=file_path, required=True,
              help="Feature set with X_train, X_test, Y_train, Y_test, label_names.")
@click.option("--name", required=True, help="Dataset name: the output is <cache>/<name>/.")
@click.option("--backbone", default="imported", show_default=True,
              help="Name of the features file: <cache>/<name>/features-<backbone>.h5.")
@observation_options
@output_options
@click.pass_context
def features(ctx, npz_file, name, backbone, cache, overwrite, **observation):
    """Import a precomputed feature set (.npz) as labels plus stage-one features.

    Writes <cache>/<name>/labels.h5 (synthetic image ids like 'train/000017'; no images) and
    <cache>/<name>/features-<backbone>.h5, so stage two can run on it directly. Rows without
    a positive label are dropped from both.
    """
    from featcache.data.prepare import PrepareOptions, import_feature_set
    from featcache.paths import check_name, features_path, labels_path

    _check_name(name)
    check_name(backbone, "--backbone")
    options = PrepareOptions(overwrite=overwrite, labels_only=True, **observation)
    result, written = import_feature_set(
        npz_file, name, labels_path(name, cache), features_path(name, backbone, cache),
        backbone, options, _command_record(ctx), _notify)
    _summarize(result)
    click.echo(f"wrote {written} ({len(result.labels.train.images)} + "
               f"{plural(len(result.labels.test.images), 'row')})")
    click.echo(f"next: featcache train-linear --dataset {name}", err=True)


@command.command("shapes")
@click.option("--num-train", type=int, default=300, show_default=True,
              help="Images in the official training set.")
@click.option("--num-test", type=int, default=150, show_default=True,
              help="Images in the test set.")
@click.option("--seed", type=NUMPY_SEED, default=0, show_default=True,
              help="Generator seed: the same seed gives the same image bytes.")
@observation_options
@output_options
@click.pass_context
def shapes(ctx, num_train, num_test, seed, cache, overwrite, **observation):
    """Generate the embedded demo dataset 'shapes' (no download) and its labels.

    Ten classes of drawn objects (circle, square, triangle, star, cross, ring, hexagon,
    diamond, crescent, arrow) on varied backgrounds, 1 to 4 per image, as JPEGs in
    <cache>/shapes/images/{train,test}/, then labels.h5 through the same pipeline as the
    real datasets. Deterministic for a given seed.
    """
    from featcache.data.prepare import PrepareOptions
    from featcache.data.shapes import prepare_shapes
    from featcache.paths import dataset_dir

    options = PrepareOptions(overwrite=overwrite, **observation)
    result = prepare_shapes(dataset_dir("shapes", cache), num_train, num_test, seed, options,
                            _command_record(ctx), _notify)
    _summarize(result)
    click.echo("next: featcache features --dataset shapes", err=True)


def _prepare(ctx: click.Context, name: str, read, cache=None, overwrite=False, labels_only=False,
             drop_missing=False, merge=None, extra: dict | None = None, verify_images=None,
             **observation) -> None:
    """Read a dataset (after refusing an existing output) and run the shared pipeline."""
    from featcache.data.prepare import (
        PrepareOptions,
        check_observe_options,
        prepare_dataset,
    )
    from featcache.fileio import refuse_existing
    from featcache.paths import labels_path

    path = labels_path(name, cache)
    refuse_existing(path, overwrite)
    options = PrepareOptions(overwrite=overwrite, labels_only=labels_only,
                             drop_missing=drop_missing, merge=merge, verify_images=verify_images,
                             **observation)
    check_observe_options(options)
    source = read()
    result = prepare_dataset(source, path, options, {**_command_record(ctx), **(extra or {})},
                             _notify)
    _summarize(result)
    click.echo(f"next: featcache features --dataset {name}" if not labels_only else
               "note: images were not checked (--labels-only)", err=True)


def _needs_boxes(common: dict) -> bool:
    """Whether the reader must read object boxes: the size and location samplers draw on them."""
    return common.get("observe") in ("size", "location")


def _check_name(name: str) -> None:
    from featcache.paths import check_name

    check_name(name, "--name")
    if name in BUILT_IN_NAMES:
        raise click.BadParameter(f"{name!r} is the name `featcache prepare {name}` writes; "
                                 "choose another name for your own data", param_hint="--name")


def _command_record(ctx: click.Context) -> dict:
    """The command and the options it ran with (keyed by their flags), for the provenance,
    and the command line that makes the file again (what a damaged file's error prints)."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    options = {flags.get(key, key): (str(value) if isinstance(value, Path) else value)
               for key, value in ctx.params.items() if value is not None}
    return {"command": ctx.command_path, "options": options, "command_line": _command_line(ctx)}


def _command_line(ctx: click.Context) -> str:
    """``featcache prepare ... --overwrite``: this command with every value it ran with."""
    import shlex

    words = ["featcache", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name == "overwrite" or value is None or value == ():
            continue
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if isinstance(param, click.Argument):
            words += [str(v) for v in values]
        elif isinstance(param, click.Option) and param.is_flag:
            if value is True or (value is not False and value == param.flag_value):
                words.append(param.opts[0])
            elif value is False and param.secondary_opts:
                words.append(param.secondary_opts[0])
        else:
            for item in values:
                words += [param.opts[0], str(item)]
    return shlex.join([*words, "--overwrite"])


def _notify(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def _summarize(result) -> None:
    labels = result.labels
    counts = result.provenance["counts"]
    k = labels.k
    observed = result.provenance["observation"]
    click.echo(f"wrote {result.path}")
    click.echo(f"  {labels.dataset}: {plural(labels.num_classes, 'class', 'classes')}; official train "
               f"{plural(len(labels.train), 'image')} (train {counts['split']['train']} / val "
               f"{counts['split']['val']}), test {len(labels.test)}"
               + (f"; k = {k:.2f}" if k is not None else "; k unknown (pass --k)"))
    if observed == "given" and labels.train.clean is not None:
        matrix = labels.train.observed
        click.echo(f"  observed labels: given ({labels.provenance['source_details'].get('variant')}"
                   f" variant): {int((matrix == 1).sum())} positives and "
                   f"{int((matrix == -1).sum())} negatives observed; clean labels kept")
    elif observed == "given":
        click.echo("  observed labels: given single positives (no clean training labels)")
    elif observed != "uniform":
        click.echo(f"  observed labels: one positive per image drawn with the {observed}-biased "
                   f"sampler (Arroyo et al.), seed {labels.provenance['obs_seed']}")
    else:
        click.echo(f"  observed labels: {plural(labels.provenance['num_pos'], 'positive')}, "
                   f"{plural(labels.provenance['num_neg'], 'negative')} per image, seed "
                   f"{labels.provenance['obs_seed']}")
