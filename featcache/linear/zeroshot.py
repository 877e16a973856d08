"""CLIP's zero-shot scores as a stage-two baseline row: no training, no grid.

On a features file made with ``featcache features --text``, each image's score for a class is
the cosine between its cached image embedding and the class-prompt embedding (Radford et al.
2021; the baseline label-free SPML papers report). ``train-linear --loss all`` (or ``--loss
zero-shot``) writes it as a run, ``runs/zero-shot/<run-id>/results.json``, shaped like a
loss's so the losses table, ``featcache table`` and reports show it beside the losses: val and
test mAP by the protocol's metric, and (with full labels) the training images' mAP. Whether a
call scores it (:func:`split_zero_shot`, :func:`zero_shot_wanted`) is decided with the plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from featcache.data.featurefile import FeatureFile, read_text_embeddings
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError, OptionError, plural
from featcache.fileio import write_json_atomic, write_text_atomic
from featcache.linear.data import SPLITS, split_rows
from featcache.linear.lossrun import LossRun
from featcache.metrics import average_precision
from featcache.protocol.coverage import ClassCoverage, coverage, evaluation_notes
from featcache.protocol.feature_source import FeatureFiles
from featcache.protocol.loss_choice import requested_losses
from featcache.protocol.records import document_header, machine_record
from featcache.protocol.runs import RESULTS, fingerprint, open_finished_or_new
from featcache.protocol.uncertainty import keep_test_scores
from featcache.runtime import Ranks, describe_device, on_main

ZERO_SHOT = "zero-shot"
REFERENCE = ("Radford et al., ICML 2021 (CLIP): zero-shot scores, the cosine between the image "
             "embedding and each class-prompt embedding; no training")
READ_ROWS = 65536  # features read per block (the scores are all that is kept)


@dataclass(frozen=True)
class _ZeroShot:
    """What :func:`~featcache.protocol.records.document_header` reads of a loss."""

    name: str = ZERO_SHOT
    reference: str = REFERENCE


def zero_shot_scores(images: Tensor, texts: Tensor) -> Tensor:
    """(n, L) cosines between image embeddings (n, E) and class-prompt embeddings (L, E)."""
    images = torch.nn.functional.normalize(images.float(), dim=-1)
    texts = torch.nn.functional.normalize(texts.float(), dim=-1)
    return images @ texts.T


def class_prompt_embeddings(features: FeatureFile, labels: LabelSet, dataset: str) -> Tensor:
    """The features file's class-prompt embeddings, in the labels file's class order; refused,
    naming the command that adds them, when the file has none."""
    text = read_text_embeddings(features.path)
    if text is None:
        raise InputError(f"{features.path} has no class-prompt text embeddings, so no zero-shot "
                         f"scores; add them with `featcache features --dataset {dataset} "
                         f"--backbone {features.backbone} --text` (the image features are kept)")
    if list(text.classes) != list(labels.classes):
        raise InputError(f"{features.path}: its class-prompt embeddings are of classes "
                         f"{text.classes[:3]}... not the labels file's {list(labels.classes)[:3]}"
                         f"...; add them again with `featcache features --dataset {dataset} "
                         f"--backbone {features.backbone} --text --overwrite`")
    if text.embeddings.shape[1] != features.dim:
        raise InputError(f"{features.path}: {text.embeddings.shape[1]}-d class-prompt embeddings "
                         f"for {features.dim}-d image features (not the same embedding space)")
    return torch.from_numpy(text.embeddings)


def split_scores(features: FeatureFile, texts: Tensor, official: str) -> np.ndarray:
    """Zero-shot scores of every row of an official split, read block by block."""
    blocks = []
    for start in range(0, features.rows(official), READ_ROWS):
        block = features.read(official, start, start + READ_ROWS)
        features.check_finite(official, block, start)
        blocks.append(zero_shot_scores(torch.from_numpy(np.asarray(block, np.float32)), texts))
    return torch.cat(blocks).numpy()


def _map(ap: Tensor) -> float:
    return float(ap.mean()) * 100.0


@dataclass
class ZeroShotResult:
    """Per split: mAP against full labels (None without them) and against observed positives;
    the test split's per-class AP and the evaluation splits' coverage."""

    maps: dict[str, float | None]
    test_ap: Tensor
    coverage: dict[str, ClassCoverage]
    notes: list[str]
    seconds: float
    #: the test split's scores (N, L), labels and rows (kept in test-scores.h5)
    test: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def evaluate_zero_shot(labels: LabelSet, features: FeatureFile, texts: Tensor,
                       val_variant: str) -> ZeroShotResult:
    """Zero-shot mAP of every split by the protocol's metric (AP 0 for a class without
    positives); the test split is scored against its full labels (observed when it has none)."""
    began = time.perf_counter()
    parts, notes = split_rows(labels, features)
    scores = {official: split_scores(features, texts, official) for official in ("train", "test")}
    maps: dict[str, float | None] = {}
    covered = {}
    test_ap = torch.zeros(len(labels.classes))
    test = None
    for name in SPLITS:
        part = parts[name]
        found = torch.from_numpy(scores[part.official][part.rows])
        observed, clean = part.label_tensors("cpu")
        positives = (observed == 1).float()
        maps[f"{name}_map_observed"] = _map(average_precision(found, positives))
        maps[f"{name}_map"] = None if clean is None else _map(average_precision(found, clean))
        if name == "test":
            targets = clean if clean is not None else positives
            test_ap = average_precision(found, targets)
            maps["test_map"] = _map(test_ap)
            test = (found.numpy(), targets.numpy(), part.rows)
        if name != "train":
            uses_clean = clean is not None and (name == "test" or val_variant == "clean")
            covered[name] = coverage("validation" if name == "val" else "test", labels.classes,
                                     clean if uses_clean else positives)
    return ZeroShotResult(maps, test_ap, covered, notes, time.perf_counter() - began, test)


def zero_shot_settings(labels: LabelSet, features: FeatureFile, val_variant: str) -> dict:
    """What makes two zero-shot runs the same (its fingerprint)."""
    return {"stage": "linear", "dataset": labels.dataset, "labels_sha256": labels.sha256,
            "features_sha256": features.sha256, "loss": ZERO_SHOT, "val_variant": val_variant}


def zero_shot_document(labels: LabelSet, features: FeatureFile, result: ZeroShotResult,
                       val_variant: str, device: str) -> dict:
    """The run's results.json: a loss run's keys, with no grid and nothing selected but the
    cosine scores (``lr``, ``batch_size`` and ``epoch`` are null)."""
    maps = result.maps
    val_key = "val_map" if val_variant == "clean" else "val_map_observed"
    per_class = {c: float(a) * 100 for c, a in zip(labels.classes, result.test_ap.tolist(),
                                                    strict=True)}
    val_cover, test_cover = result.coverage["val"], result.coverage["test"]
    chosen: dict[str, object] = {"seed": 0, "lr": None, "batch_size": None, "params": {}, "val_map": maps["val_map"],
              "val_map_observed": maps["val_map_observed"], "test_map": maps["test_map"],
              "train_map": maps["train_map"]}
    settings = zero_shot_settings(labels, features, val_variant)
    notes = result.notes + evaluation_notes(val_cover, test_cover, maps[val_key],
                                            maps["test_map"])
    return {
        **document_header("linear", _ZeroShot(), labels),
        "features": {"path": str(features.path), "sha256": features.sha256,
                     "backbone": features.backbone, "dim": features.dim,
                     "weights": features.attrs.get("weights"),
                     "weights_sha256": features.attrs.get("weights_sha256"),
                     "text": features.attrs.get("text")},
        "head": {"kind": ZERO_SHOT, "scores": "cosine(image embedding, class-prompt embedding)"},
        "sizes": {"train": int(len(labels.train_index)), "val": int(len(labels.val_index)),
                  "test": len(labels.test), "classes": labels.num_classes},
        "pseudo_labels": None,
        "protocol": {"training": "none", "val_variant": val_variant, "epochs": 0,
                     "early_stop": "none", "eval_every_example": True},
        "grid": {"lr": [], "batch_size": [], "params": {}, "params_source": {}, "seeds": [0]},
        "selection": {**chosen, "epoch": None, "test_ap_per_class": per_class,
                      "val_map_classes_with_positives": val_cover.map_over_present(maps[val_key]),
                      "test_map_classes_with_positives": test_cover.map_over_present(
                          maps["test_map"])},
        "summary": {"seeds": 1, **{f"{key}_{stat}": (maps[key] if stat == "mean"
                                                      else None if maps[key] is None else 0.0)
                                   for key in ("val_map", "val_map_observed", "test_map",
                                               "train_map") for stat in ("mean", "std")}},
        "evaluation": {"validation": val_cover.to_json(), "test": test_cover.to_json()},
        "published": {"linear": None, "recovery": None},
        "seeds": [{"seed": 0, "selected": {**chosen, "best_epoch": None, "stopped_at": None,
                                           "epochs": None, "test_ap_per_class": per_class},
                   "configs": []}],
        "notes": notes,
        "timings": {"seconds": result.seconds, "configuration_epochs": 0,
                    "configuration_epochs_per_second": 0.0},
        "machine": machine_record(device),
        "settings": settings,
        "fingerprint": fingerprint(settings),
    }


def summary_markdown(document: dict) -> str:
    """The run's summary.md."""
    selection, sizes = document["selection"], document["sizes"]
    lines = [f"# {document['dataset']} / zero-shot: {document['features']['backbone']} "
             "class-prompt scores", "",
             f"- {REFERENCE}",
             f"- train / val / test: {sizes['train']} / {sizes['val']} / "
             f"{plural(sizes['test'], 'image')}, {plural(sizes['classes'], 'class', 'classes')}"]
    for key, what in (("val_map", "val mAP"), ("val_map_observed", "val mAP (observed positives)"),
                      ("test_map", "test mAP"), ("train_map", "training-set mAP (full labels)")):
        if selection.get(key) is not None:
            lines.append(f"- {what}: {selection[key]:.2f}")
    lines += [f"- note: {note}" for note in document["notes"]]
    return "\n".join(lines) + "\n"


def zero_shot_run(labels: LabelSet, features: FeatureFile, run_dir: Path, val_variant: str,
                  device: str, overwrite: bool = False,
                  say: Callable[[str], None] | None = None) -> tuple[dict, bool]:
    """Score, write ``run_dir`` (summary.md, then results.json last) and return (the document,
    whether a finished run with the same settings was reused instead; ``say`` hears why a
    finished one is not)."""
    texts = class_prompt_embeddings(features, labels, labels.dataset)
    folder, reuse = open_finished_or_new(run_dir, zero_shot_settings(labels, features,
                                                                     val_variant), overwrite, say)
    if reuse:
        return folder.results(), True
    result = evaluate_zero_shot(labels, features, texts, val_variant)
    document = zero_shot_document(labels, features, result, val_variant, device)
    if result.test is not None:
        scores, targets, rows = result.test
        keep_test_scores(run_dir, scores, [0], targets, rows, labels.classes, document,
                         document["selection"]["test_map"])
    write_text_atomic(run_dir / "summary.md", summary_markdown(document))
    write_json_atomic(run_dir / RESULTS, document)
    return document, False


def split_zero_shot(losses: str | Sequence[str]) -> tuple[str | None, str | Sequence[str]]:
    """Whether ``--loss`` (``losses``) asks for the zero-shot row (``"named"``, or ``"all"``
    when the features file may have it), and the losses to train."""
    names = requested_losses(losses)
    if names == ["all"]:
        return "all", losses
    if ZERO_SHOT not in names:
        return None, losses
    return "named", [name for name in names if name != ZERO_SHOT]


def zero_shot_wanted(mode: str | None, files: FeatureFiles,
                     skipped: list[tuple[str, str]]) -> bool:
    """Whether this run scores the zero-shot row: named, or ``--loss all`` on a pooled
    features file with class-prompt embeddings (else it is skipped, with the reason)."""
    if mode is None:
        return False
    if mode == "named" and files.pooled is None:
        raise OptionError("--loss zero-shot scores the pooled features file, which the other "
                          "losses named do not read (they train on feature maps): score it in a "
                          "run of its own (--loss zero-shot)")
    # the root attribute `featcache features --text` writes beside the embeddings
    if mode == "named" or (files.pooled is not None and files.pooled.attrs.get("text")):
        return True
    skipped.append((ZERO_SHOT, "needs class-prompt text embeddings in the features file (a "
                    "vision-language backbone's file made with the --text option of featcache "
                    "features)"))
    return False


def score_zero_shot(labels: LabelSet, features: FeatureFile, run_dir: Path, val_variant: str,
                    overwrite: bool, device: torch.device, say: Callable[[str], None],
                    job: Ranks) -> LossRun:
    """The zero-shot row's run (:mod:`featcache.linear.zeroshot`), or the finished one
    (``overwrite``: a finished one with other settings is replaced)."""
    document, reused = on_main(job, lambda: zero_shot_run(
        labels, features, run_dir, val_variant, describe_device(device), overwrite, say))
    if reused:
        say(f"{ZERO_SHOT}: run {run_dir.name} already finished with these settings; reusing it")
    return LossRun(ZERO_SHOT, run_dir, document, reused, document["timings"]["seconds"])
