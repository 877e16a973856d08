"""``featcache info PATH``: what a labels file, a features file or a dataset folder holds."""

from __future__ import annotations

import os
from pathlib import Path

import click

from featcache.errors import plural


@click.command("info")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--classes/--no-classes", "show_classes", default=True, show_default=True,
              help="Show the per-class table (312 rows for CUB).")
def command(path: Path, show_classes: bool) -> None:
    """Show what PATH holds, as tables.

    PATH is a dataset name (scene: the folder <cache>/scene), a labels file (labels.h5), a
    features file (features-<backbone>.h5 or the spatial
    spatial-<backbone>.h5), a pseudo-label file (pseudo-labels-<name>.h5) or a dataset folder
    such as cache/voc (its labels file and every features and pseudo-label file in it). For labels:
    split sizes, positives per class and per image, observed labels, k and the provenance
    (source files with sha256, seeds, dropped rows, missing images, featcache version). For
    features: backbone, width (and H x W x D, compression and chunks of spatial files), dtype,
    size on disk, rows and bad rows per split, the weights, and whether
    the labels file beside it is the one the features were built from (and class-prompt or
    tile embeddings when present). For pseudo-labels: the rule, its parameters, the features
    file they came from, counts and precision/recall.
    """
    from featcache.errors import InputError
    from featcache.paths import existing_labels, features_files_in

    if not path.exists() and len(path.parts) == 1:  # a dataset name, as every command takes
        path = existing_labels(str(path)).parent
    if path.is_dir():
        files = [path / "labels.h5"] if (path / "labels.h5").exists() else []
        files += features_files_in(path) + features_files_in(path, spatial=True)
        files += sorted(path.glob("pseudo-labels-*.h5"))
        if not files:
            raise InputError(_not_a_dataset(path))
    elif path.exists():
        files = [path]
    else:
        raise InputError(f"{path} does not exist; pass a labels file, a features file or a "
                         "dataset folder such as cache/voc")
    blocks = []
    for file in files:
        kind = _file_format(file)
        if kind == "featcache-labels":
            blocks.append(describe_labels(file, show_classes))
        elif kind == "featcache-features":
            blocks.append(describe_features(file))
        elif kind == "featcache-pseudo-labels":
            blocks.append(describe_pseudo_labels(file))
        else:
            raise InputError(f"{file} is not a featcache labels or features file (its 'format' "
                             f"attribute is {kind!r})")
    click.echo("\n\n".join(blocks))


def _not_a_dataset(folder: Path) -> str:
    """Why ``folder`` has nothing for info, and what does: a run folder or a folder of runs
    is tabulated, anything else is prepared first."""
    from featcache.protocol.runs import RESULTS

    if (folder / RESULTS).is_file():
        return (f"{folder} is a run folder, not a dataset: read {folder / 'summary.md'}, or "
                f"tabulate it with `featcache table {folder}`")
    if next(folder.rglob(RESULTS), None) is not None:
        return (f"{folder} is a folder of runs, not a dataset: tabulate them with "
                f"`featcache table {folder}`")
    return (f"{folder} holds neither labels.h5 nor features-*.h5; run `featcache prepare` "
            "(and `featcache features`) first")


def _file_format(path: Path) -> str | None:
    import h5py

    from featcache.errors import InputError

    try:
        with h5py.File(path, "r") as h5:
            value = h5.attrs.get("format")
    except OSError as exc:
        raise InputError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}; "
                         "make it again with the command that made it and --overwrite") from None
    return None if value is None else str(value)


def describe_labels(path: Path, show_classes: bool = True) -> str:
    """Markdown tables for one labels file."""
    from featcache.data.labelfile import load_labels
    from featcache.tables import Table

    labels = load_labels(path)
    assert labels.sha256 is not None  # load_labels hashes the file it reads
    prov = labels.provenance
    sizes = Table(["split", "images", "clean labels", "positives/image", "min", "max",
                   "observed +", "observed -"], title="Splits",
                  formats={"positives/image": "{:.3f}"})
    for name, part in (("official train", labels.train), ("  train", labels.split("train")),
                       ("  val", labels.split("val")), ("test", labels.test)):
        positives = (part.clean if part.clean is not None else part.observed == 1).sum(axis=1)
        sizes.add(name, len(part), part.clean is not None, float(positives.mean()),
                  int(positives.min()), int(positives.max()), int((part.observed == 1).sum()),
                  int((part.observed == -1).sum()))
    blocks = [f"# {path}", "",
              f"labels of {labels.dataset!r}: {plural(labels.num_classes, 'class', 'classes')}, "
              f"k = {'unknown' if labels.k is None else f'{labels.k:.3f}'}, "
              f"{_size(path)}, sha256 {labels.sha256[:12]}", "", sizes.markdown()]
    if show_classes:
        per_class = Table(["#", "class", "train positives", "test positives"],
                          title="Classes (clean positives; observed where no clean labels)")
        counts = {name: (part.clean if part.clean is not None else part.observed == 1).sum(axis=0)
                  for name, part in (("train", labels.train), ("test", labels.test))}
        for index, name in enumerate(labels.classes):
            per_class.add(index, name, int(counts["train"][index]), int(counts["test"][index]))
        blocks += ["", per_class.markdown()]
    blocks += ["", _provenance_table(labels, prov).markdown()]
    sources = prov.get("sources") or []
    if sources:
        folder = os.path.commonpath([os.path.dirname(entry["file"]) for entry in sources])
        files = Table(["source file", "sha256", "bytes"], title=f"Source files (in {folder})")
        for entry in sources:
            files.add(os.path.relpath(entry["file"], folder), str(entry["sha256"])[:12],
                      entry["bytes"])
        blocks += ["", files.markdown()]
    return "\n".join(blocks)


def _provenance_table(labels, prov: dict):
    from featcache.tables import Table

    table = Table(["provenance", "value"], title="Provenance")
    table.add("source format", prov.get("source_format"))
    table.add("image root", labels.image_root or "-")
    table.add("images checked", bool(prov.get("images_checked", False)))
    observation = prov.get("observation")
    variant = (prov.get("source_details") or {}).get("variant")
    if observation == "given":
        table.add("observed labels (train)", f"given: L48's {variant} variant (real positives "
                  "and negatives)" if variant else "given single positives")
    elif prov.get("observer"):
        table.add("observed labels", f"{observation}-biased (Arroyo et al. 2023): one positive "
                  f"per image, seed {prov.get('obs_seed')} (random.Random per matrix)")
    elif observation is not None:
        table.add("observed labels", f"{observation}: {prov.get('num_pos')} positive, "
                  f"{prov.get('num_neg')} negative per image, seed {prov.get('obs_seed')} "
                  "(fresh RandomState per matrix)")
    if prov.get("observation_test") == "given":
        table.add("observed labels (test)", "given single positives")
    if prov.get("val_split"):
        table.add("train/val split", f"{prov['val_split']} "
                  f"({(prov.get('source_details') or {}).get('validation', '')})")
    else:
        table.add("train/val split", f"{prov.get('val_fraction')} of the official train set "
                  f"to validation, seed {prov.get('split_seed')}")
    merged = prov.get("merged_split")
    if merged:
        table.add("merged split", f"{merged['train_size']} train / {merged['test_size']} test "
                  f"drawn from {plural(merged['rows'], 'merged image')}, seed {merged['seed']}")
    counts = prov.get("counts", {})
    for split in ("train", "test"):
        dropped = prov.get("dropped_no_positive", {}).get(split, [])
        missing = prov.get("missing_images", {}).get(split, [])
        listed = counts.get(split, {}).get("listed")
        table.add(f"{split}: listed in the source", listed)
        table.add(f"{split}: dropped, no positive", _count_and_first(dropped))
        table.add(f"{split}: dropped, image missing", _count_and_first(missing))
    for key, value in (prov.get("source_details") or {}).items():
        table.add(f"source: {key}", value if not isinstance(value, dict) else
                  ", ".join(f"{k}: {v}" for k, v in value.items()))
    table.add("featcache version", prov.get("featcache_version"))
    table.add("created", prov.get("created"))
    if prov.get("command"):
        table.add("command", prov["command"])
        for key, value in (prov.get("options") or {}).items():
            table.add(f"  {key}", value)
    return table


def _count_and_first(names: list) -> str:
    from featcache.data.formats import first_few

    return f"{len(names)}: {first_few(names)}" if names else "0"


def describe_features(path: Path) -> str:
    """Markdown tables for one features file (without loading the features themselves)."""
    import h5py

    from featcache.data.featurefile import OFFICIAL_SPLITS, read_feature_attrs, spatial_shape
    from featcache.fileio import human_bytes
    from featcache.tables import Table

    attrs = read_feature_attrs(path)
    rows = Table(["split", "rows", "width", "bad rows"], title="Rows")
    with h5py.File(path, "r") as h5:
        for split in OFFICIAL_SPLITS:
            shape = h5[split]["features"].shape
            rows.add(split, shape[0], shape[1], int(h5[split]["bad"][()].sum()))
        extras = {key: h5[key].shape for key in ("text/embeddings", "train/crops") if key in h5}
        data = h5["train/features"]
        storage = (data.compression, data.shuffle, data.chunks, data.dtype)
    spatial = spatial_shape(path, attrs, shape[1])
    expected = str(attrs.get("labels_sha256", ""))
    table = Table(["features", "value"], title="Features")
    table.add("backbone", attrs.get("backbone"))
    table.add("feature dim", attrs.get("feature_dim"))
    if spatial is not None:
        table.add("spatial map", f"{spatial[0]} x {spatial[1]} x {spatial[2]} (H x W x D per row, "
                                 "C order: reshape(N, H*W, D))")
    table.add("dtype", attrs.get("dtype"))
    compression, shuffle, chunks, dtype = storage
    if compression or spatial is not None:
        chunk = human_bytes(chunks[0] * chunks[1] * dtype.itemsize if chunks else 0)
        table.add("storage", f"{compression or 'uncompressed'}{' + shuffle' if shuffle else ''}, "
                             f"chunks of {chunks[0] if chunks else '-'} rows ({chunk})")
    table.add("weights", attrs.get("weights"))
    if attrs.get("library"):
        table.add("library", f"{attrs['library']} {attrs.get('library_model', '')} "
                             f"{attrs.get('library_version', '')}".strip())
    if attrs.get("pooling"):
        table.add("pooling", attrs["pooling"])
    if "text/embeddings" in extras:
        text = attrs.get("text") or {}
        how = ", ".join(f"{k}={v}" for k, v in text.items())
        table.add("text embeddings", f"{plural(extras['text/embeddings'][0], 'class', 'classes')} x "
                                     f"{extras['text/embeddings'][1]} ({how})")
    if "train/crops" in extras:
        grid = attrs.get("crops_grid")
        table.add("crop embeddings", f"{grid}x{grid} tiles of each training image, "
                                     f"{extras['train/crops']}")
    if attrs.get("weights_sha256"):
        table.add("weights sha256", str(attrs["weights_sha256"])[:12])
    table.add("labels sha256", expected[:12])
    table.add("matches labels.h5 beside it", _labels_match(path, expected))
    table.add("size on disk", _size(path))
    _add_provenance(table, attrs)
    return "\n".join([f"# {path}", "", table.markdown(), "", rows.markdown()])


def _labels_match(path: Path, expected: str) -> str:
    """Whether the labels file beside a features file is the one it was extracted from."""
    from featcache.fileio import sha256_file

    beside = path.parent / "labels.h5"
    if beside.exists():
        match = "yes" if sha256_file(beside) == expected else \
            f"NO: {beside} changed since; re-extract the features"
    else:
        match = f"no labels file at {beside}"
    return match


#: ``featcache info``'s words for each decoder a transform records
DECODER_WORDS = {
    "pil": "PIL (the protocol's decoder)",
    "pil-draft": "PIL with JPEG draft scaling (--jpeg-draft)",
    "device": "JPEGs on the GPU (nvJPEG; --gpu-decode or the default on CUDA), other files with PIL",
}


def _add_provenance(table, attrs: dict) -> None:
    """The features file's provenance attributes, one row each (sha256s shortened), after the
    decoder its transform records."""
    from featcache.backbones.decoders import recorded_decoder

    if isinstance(attrs.get("transform"), dict):
        decoder = recorded_decoder(attrs["transform"])
        table.add("decoder", DECODER_WORDS.get(decoder or "", "unknown (see transform)"))
    for key in ("transform", "source_npz", "source_npz_sha256", "torch_version",
                "torchvision_version", "featcache_version", "created"):
        if key in attrs:
            value = attrs[key]
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
            table.add(key.replace("_", " "), str(value)[:12] if key.endswith("sha256") else value)


def describe_pseudo_labels(path: Path) -> str:
    """Markdown table for one pseudo-label file."""
    import h5py

    from featcache.data.pseudofile import read_pseudo_attrs
    from featcache.tables import Table

    attrs = read_pseudo_attrs(path)
    with h5py.File(path, "r") as h5:
        shape = h5["train/pseudo"].shape
    table = Table(["pseudo-labels", "value"], title="Pseudo-labels")
    table.add("rule", attrs.get("rule"))
    table.add("parameters", ", ".join(f"{k}={v}" for k, v in (attrs.get("params") or {}).items()))
    table.add("rows x classes", f"{shape[0]} x {shape[1]} (official training rows)")
    table.add("from", f"{attrs.get('features_path')} (sha256 {str(attrs.get('features_sha256'))[:12]})")
    table.add("labels sha256", str(attrs.get("labels_sha256", ""))[:12])
    for key, value in (attrs.get("stats") or {}).items():
        table.add(key.replace("_", " "), "-" if value is None else value)
    table.add("created", attrs.get("created"))
    return "\n".join([f"# {path}", "", table.markdown()])


def _size(path: Path) -> str:
    from featcache.fileio import human_bytes

    return human_bytes(path.stat().st_size)
