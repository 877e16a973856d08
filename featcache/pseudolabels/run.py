"""``featcache pseudo-label``: a rule applied to a features file's cached similarities.

Reads the official training rows' image embeddings (and, for ``aevlp``, their tile
embeddings) and the class-prompt embeddings of one features file, computes the cosines in
blocks of rows, applies the rule (:mod:`featcache.pseudolabels.rules`) and writes
``pseudo-labels-<name>.h5`` beside the labels file, atomically. Rows whose image was
unreadable (flagged bad) get no pseudo-label. When the labels file has clean training labels,
the precision and recall of the pseudo-labels on the unobserved entries are computed and
recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch

from featcache.data.featurefile import read_feature_attrs, read_text_embeddings, read_train_rows
from featcache.data.labelfile import LabelSet, load_labels
from featcache.data.pseudofile import check_name, pseudo_labels_path, write_pseudo_labels
from featcache.errors import InputError, OptionError, plural
from featcache.fileio import sha256_file
from featcache.paths import (
    dataset_dir,
    existing_labels,
    feature_file_tag,
    features_files_in,
    features_path,
)
from featcache.pseudolabels import rules

BLOCK_ROWS = 4096


@dataclass
class PseudoLabelOptions:
    """What ``featcache pseudo-label`` was asked (``params``: rule parameters the user set)."""

    dataset: str
    rule: str = "vlpl"
    backbone: str | None = None  # the features file's tag; default: the only one with text
    params: dict = field(default_factory=dict)
    name: str | None = None  # default: the rule's name
    overwrite: bool = False
    cache: str | None = None


@dataclass
class PseudoLabelResult:
    path: Path
    rule: str
    params: dict
    stats: dict

    def summary(self) -> str:
        """Lines for the end of a run."""
        s = self.stats
        lines = [f"{self.rule} pseudo-labels -> {self.path}",
                 f"  {s['positives']} pseudo-positives on unobserved entries "
                 f"({s['positives_per_image']:.2f} per image), {s['negatives']} pseudo-negatives, "
                 f"{plural(s['images'], 'image')}, {plural(s['bad_rows'], 'unreadable row')} without pseudo-labels"]
        if "positive_precision" in s:
            lines.append(
                f"  against the clean labels (unobserved entries): positive precision "
                f"{_pct(s['positive_precision'])}, recall {_pct(s['positive_recall'])}; "
                f"negative precision {_pct(s.get('negative_precision'))}")
        else:
            lines.append("  (no clean training labels: precision and recall unknown)")
        return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_pseudo_labels(options: PseudoLabelOptions,
                      say: Callable[[str], None] = _stderr) -> PseudoLabelResult:
    """Make (or refuse to overwrite) one pseudo-label file; see the module docstring."""
    if options.rule not in rules.RULES:
        raise OptionError(f"--rule {options.rule!r}: choose one of {', '.join(rules.RULES)}")
    labels_file = existing_labels(options.dataset, options.cache)
    labels = load_labels(labels_file)
    params = resolve_rule_params(options.rule, labels.dataset, options.params)
    name = check_name(options.name or options.rule)
    target = pseudo_labels_path(labels_file, name)
    if target.exists() and not options.overwrite:
        raise InputError(f"{target} exists; pass --overwrite to replace it, or --name to keep both")
    source = choose_features(options, labels)
    attrs = read_feature_attrs(source)
    text = read_text_embeddings(source)
    if text is None:
        raise InputError(f"{source} has no class-prompt text embeddings; add them with `featcache "
                         f"features --dataset {options.dataset} --backbone {attrs.get('backbone')} "
                         "--text` (the image features are kept)")
    if text.embeddings.shape[0] != labels.num_classes:
        raise InputError(f"{source}: {text.embeddings.shape[0]} class embeddings for "
                         f"{plural(labels.num_classes, 'class', 'classes')}")
    if options.rule == "aevlp" and not attrs.get("crops_grid"):
        grid = rules.AEVLP_GRID.get(labels.dataset, 4)
        raise InputError(f"the aevlp rule needs tile embeddings; {source} has none: run `featcache "
                         f"features --dataset {options.dataset} --backbone {attrs.get('backbone')} "
                         f"--text --crops {grid}x{grid} --overwrite`")
    say(f"{options.rule}: similarities of {plural(len(labels.train), 'training image')} to "
        f"{plural(labels.num_classes, 'class', 'classes')} from {source.name}")
    matrix, bad = compute(source, options.rule, params, text.embeddings, labels)
    stats = pseudo_stats(matrix, labels, bad)
    write_pseudo_labels(target, labels, matrix, {
        "name": name, "rule": options.rule, "params": params,
        "features_path": str(source), "features_sha256": sha256_file(source),
        "backbone": attrs.get("backbone"), "backbone_tag": attrs.get("backbone_tag"),
        "text": attrs.get("text"), "crops_grid": attrs.get("crops_grid", 0), "stats": stats,
    }, overwrite=options.overwrite)
    return PseudoLabelResult(target, options.rule, params, stats)


def resolve_rule_params(rule: str, dataset: str, given: dict) -> dict:
    """The rule's parameters: given, else the dataset's (the reference configs'), else generic."""
    params = rules.rule_defaults(rule, dataset)
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise OptionError(f"--{unknown[0].replace('_', '-')} does not apply to the {rule} rule; it "
                          f"takes {', '.join('--' + k.replace('_', '-') for k in params)}")
    params.update(given)
    if "top_k" in params:
        params["top_k"] = int(params["top_k"])
    try:
        rules.check_params(rule, params)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    return params


def choose_features(options: PseudoLabelOptions, labels: LabelSet) -> Path:
    """``--backbone TAG``'s features file, else the only one of the dataset with text embeddings."""
    root = dataset_dir(options.dataset, options.cache)
    if options.backbone is not None:
        path = features_path(options.dataset, options.backbone, options.cache)
        if not path.is_file():
            raise InputError(f"no features file {path}; "
                             f"{_making_features(options.dataset, options.backbone, options.rule)}")
        candidates = [path]
    else:
        candidates = []
        for path in features_files_in(root):
            with h5py.File(path, "r") as h5:
                if "text/embeddings" in h5:
                    candidates.append(path)
        if not candidates:
            raise InputError(f"no features file in {root} has class-prompt text embeddings; run "
                             f"`featcache features --dataset {options.dataset} --backbone "
                             "clip-vit-l14-336 --text` (add --crops 4x4 for the aevlp rule)")
        if len(candidates) > 1:
            names = ", ".join(feature_file_tag(p) for p in candidates)
            raise OptionError(f"several features files of {options.dataset} have text embeddings "
                              f"({names}); choose one with --backbone")
    attrs = read_feature_attrs(candidates[0])
    if attrs.get("labels_sha256") != labels.sha256:
        raise InputError(f"{candidates[0]} was built from another labels file than {labels.path}; "
                         "extract its features again")
    return candidates[0]


def _making_features(dataset: str, tag: str, rule: str) -> str:
    """How to make the features file of ``tag`` with class-prompt embeddings (and tiles for
    the aevlp rule): its command when the tag is a registered backbone (``-protocol``: with
    --preprocess protocol)."""
    from featcache.protocol.catalog import catalog

    backbone = tag.removesuffix("-protocol")
    crops = " --crops 4x4" if rule == "aevlp" else ""
    if backbone not in {info.name for info in catalog().backbone_list()}:
        return (f"make it with `featcache features --dataset {dataset} --backbone BACKBONE --text"
                f"{crops}` (the backbone and options that give that name) first")
    preprocess = " --preprocess protocol" if tag.endswith("-protocol") else ""
    return (f"make it first with `featcache features --dataset {dataset} --backbone {backbone}"
            f"{preprocess} --text{crops}`")


def compute(source: Path, rule: str, params: dict, text: np.ndarray,
            labels: LabelSet) -> tuple[np.ndarray, np.ndarray]:
    """The pseudo-label matrix (N, L) int8 of the official training rows, and their bad flags."""
    count = len(labels.train)
    with h5py.File(source, "r") as h5:
        bad = h5["train/bad"][()].astype(bool)
    texts = torch.from_numpy(text)
    observed = torch.from_numpy(np.asarray(labels.train.observed, dtype=np.float32))
    out = np.zeros((count, labels.num_classes), dtype=np.int8)
    for start in range(0, count, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, count)
        images = torch.from_numpy(read_train_rows(source, "features", start, stop))
        sims = rules.cosine(images, texts)
        if rule == "vlpl":
            block = rules.vlpl_rule(sims, **params)
        else:
            tiles = rules.cosine(torch.from_numpy(read_train_rows(source, "crops", start, stop)), texts)
            block = rules.aevlp_rule(sims, tiles, observed[start:stop], **params)
        out[start:stop] = block.numpy()
    out[bad] = 0
    return out, bad


def pseudo_stats(matrix: np.ndarray, labels: LabelSet, bad: np.ndarray) -> dict:
    """Counts, and precision/recall on the unobserved entries when clean labels exist."""
    unobserved = np.asarray(labels.train.observed) == 0
    positive, negative = (matrix == 1) & unobserved, (matrix == -1) & unobserved
    images = int((~bad).sum())
    stats: dict[str, int | float | None] = {
        "images": len(matrix), "bad_rows": int(bad.sum()), "positives": int(positive.sum()),
        "negatives": int(negative.sum()),
        "positives_per_image": float(positive.sum() / max(images, 1))}
    clean = labels.train.clean
    if clean is not None:
        clean = np.asarray(clean).astype(bool)
        hidden = clean & unobserved & ~bad[:, None]
        stats["positive_precision"] = (float((clean & positive).sum() / positive.sum())
                                       if positive.sum() else None)
        stats["positive_recall"] = (float((clean & positive).sum() / hidden.sum())
                                    if hidden.sum() else None)
        stats["negative_precision"] = (float((~clean & negative).sum() / negative.sum())
                                       if negative.sum() else None)
    return stats
