"""The tensors stage two trains on: features and labels of the train, val and test splits.

Everything lives on the training device as whole tensors; a batch is an index slice, so no
per-example DataLoader is involved. Features too large for the memory budget stay in the file
instead (:class:`featcache.linear.stream.StreamedLinearData`, the same interface).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from featcache.data.featurefile import FeatureFile, FeatureSet, open_features, spatial_shape
from featcache.data.labelfile import LabelSet, SplitLabels, load_labels
from featcache.data.negatives import observed_with_negatives
from featcache.data.pseudofile import PseudoLabels, load_pseudo_labels, pseudo_labels_path
from featcache.errors import InputError
from featcache.linear.memory import Placement
from featcache.losses import DataFacts
from featcache.protocol.loss_choice import training_facts

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
#: one split as arrays: features (n, D), observed labels (n, L), full labels (n, L) or None
ArraySplit = tuple[np.ndarray, np.ndarray, np.ndarray | None]


class SplitData(Protocol):
    """One split as the trainer reads it: its labels and rows (features: in memory,
    :class:`SplitTensors`, or streamed from the file)."""

    @property
    def observed(self) -> Tensor: ...  # int8 from a labels file, float32 from arrays

    @property
    def clean(self) -> Tensor | None: ...

    @property
    def rows(self) -> np.ndarray: ...  # rows of the labels file's official split

    @property
    def pseudo(self) -> Tensor | None: ...  # (n, L) pseudo-labels 1 / 0 / -1, when attached

    def __len__(self) -> int: ...


@dataclass
class SplitTensors:
    """Features and labels of one split, on the device."""

    features: Tensor
    observed: Tensor  # int8 from a labels file, float32 from arrays: the trainer takes either
    clean: Tensor | None
    rows: np.ndarray  # rows of the labels file's official split, for provenance
    pseudo: Tensor | None = None  # (n, L) pseudo-labels 1 / 0 / -1 (losses that need them)

    def __len__(self) -> int:
        return self.features.shape[0]


class FeaturesIdentity(Protocol):
    """What a run records of the features it trained on (a features file, or arrays)."""

    @property
    def path(self) -> Path | None: ...

    @property
    def sha256(self) -> str | None: ...

    @property
    def attrs(self) -> dict: ...

    @property
    def dim(self) -> int: ...

    @property
    def backbone(self) -> str: ...


class TrainingSplits(Protocol):
    """What every form of stage-two data offers: the splits, classes, the labels file and the
    features' identity, the facts a loss asks about, observed negatives and pseudo-labels
    attached on demand (:class:`LinearData` in memory, ``StreamedLinearData`` from the file;
    both share :class:`SplitsMixin`'s methods)."""

    @property
    def dataset(self) -> str: ...

    @property
    def classes(self) -> list[str]: ...

    @property
    def train(self) -> SplitData: ...

    @property
    def val(self) -> SplitData: ...

    @property
    def test(self) -> SplitData: ...

    @property
    def k(self) -> float | None: ...

    @property
    def labels(self) -> LabelSet: ...

    @property
    def features(self) -> FeaturesIdentity: ...

    @property
    def notes(self) -> list[str]: ...

    @property
    def pseudo_choice(self) -> str | None: ...  # --pseudo-labels NAME

    @property
    def pseudo_labels(self) -> PseudoLabels | None: ...  # the set attached to train.pseudo

    @property
    def num_classes(self) -> int: ...

    @property
    def feature_dim(self) -> int: ...

    @property
    def spatial_shape(self) -> tuple[int, int, int] | None: ...

    @property
    def facts(self) -> DataFacts: ...

    def evolve(self, **changes: Any) -> Self:
        """A copy with ``changes`` (dataclass fields)."""
        ...

    def with_observed_negatives(self, num_neg: int) -> Self: ...

    def with_pseudo_labels(self, name: str) -> Self: ...


S = TypeVar("S", bound=TrainingSplits)


class SplitsMixin:
    """The methods every form of stage-two data shares, written once over the fields of
    :class:`TrainingSplits`."""

    @property
    def num_classes(self: TrainingSplits) -> int:
        return len(self.classes)

    @property
    def facts(self: TrainingSplits) -> DataFacts:
        """What a loss may ask of the training split (full labels, negatives, k)."""
        facts = training_facts(self.labels, self.train.observed.cpu().numpy(),
                               self.train.clean is not None, self.pseudo_choice,
                               spatial=self.spatial_shape is not None,
                               backbone=self.features.attrs.get("backbone"))
        if self.pseudo_labels is not None and self.pseudo_labels.name not in facts.pseudo_labels:
            facts = replace(facts, pseudo_labels=(*facts.pseudo_labels, self.pseudo_labels.name))
        return facts

    @property
    def spatial_shape(self: TrainingSplits) -> tuple[int, int, int] | None:
        """(h, w, D) when the features are spatial maps (heads on maps), None when pooled."""
        return spatial_shape(self.features.path, self.features.attrs, self.features.dim)

    def evolve(self, **changes: Any) -> Self:
        """A copy with ``changes`` (the subclasses are dataclasses)."""
        return replace(cast(Any, self), **changes)

    def with_observed_negatives(self: S, num_neg: int) -> S:
        """A copy whose training observations also hold ``num_neg`` negatives per row
        (:func:`featcache.data.negatives.observed_with_negatives`)."""
        drawn, note = observed_with_negatives(self.labels, self.train.rows,
                                              self.train.observed.cpu().numpy(), num_neg)
        derived = torch.as_tensor(drawn, dtype=self.train.observed.dtype,
                                  device=self.train.observed.device)
        return self.evolve(train=replace(cast(Any, self.train), observed=derived),
                           notes=self.notes + [note])

    def with_pseudo_labels(self: S, name: str) -> S:
        """A copy whose training rows carry pseudo-label set ``name`` (``train.pseudo``)."""
        if self.pseudo_labels is not None and self.pseudo_labels.name == name:
            return self
        if self.labels.path is None:
            raise InputError(f"pseudo-labels {name!r} are read from beside a labels file, and "
                             f"{self.labels.provenance.get('source', 'these labels')} have none")
        found = load_pseudo_labels(pseudo_labels_path(self.labels.path, name), self.labels)
        pseudo = torch.as_tensor(found.matrix[self.train.rows], dtype=torch.float32,
                                 device=self.train.observed.device)
        note = f"pseudo-labels {name!r} ({found.attrs.get('rule')} rule) from {found.path}"
        return self.evolve(train=replace(cast(Any, self.train), pseudo=pseudo),
                           pseudo_labels=found, notes=self.notes + [note])


@dataclass
class LinearData(SplitsMixin):
    """Train / val / test tensors for one labels file and one features file."""

    dataset: str
    classes: list[str]
    train: SplitTensors
    val: SplitTensors
    test: SplitTensors
    k: float | None
    labels: LabelSet
    features: FeatureSet | FeatureFile  # the features' identity (path, sha256, attrs)
    notes: list[str] = field(default_factory=list)
    pseudo_choice: str | None = None  # --pseudo-labels NAME
    pseudo_labels: PseudoLabels | None = None  # the set attached to train.pseudo
    placement: Placement | None = None  # the memory plan that kept them in memory, if any

    @property
    def feature_dim(self) -> int:
        return self.train.features.shape[1]

    @classmethod
    def from_arrays(cls, train: ArraySplit, val: ArraySplit, test: ArraySplit | None = None, *,
                    classes: list[str] | None = None, k: float | None = None,
                    dataset: str = "arrays", source: str = "the arrays given",
                    attrs: dict | None = None, device: torch.device | str = "cpu",
                    pseudo: np.ndarray | Tensor | None = None) -> LinearData:
        """Stage-two data from in-memory arrays (the Python API's estimator).

        Each split is ``(features (n, D), observed (n, L), clean (n, L) or None)``: observed
        holds 1 (observed positive), 0 (unobserved), -1 (observed negative), clean 0/1 full
        labels. The train and val rows play the labels file's official train set (so ``k``,
        the mean positives per image, is taken over both when both have clean labels, as
        featcache's labels files do; the ``k`` given is used only when they do not);
        ``test`` defaults to the val split. ``source`` names the labels in messages (what a
        loss lacks). ``pseudo`` (n_train, L: 1, 0, -1) are the training rows' pseudo-labels, the
        set named ``given`` for the losses that need pseudo-labels. Arrays are used as given:
        validate them first.
        """
        parts = {"train": train, "val": val, "test": val if test is None else test}
        tensors: dict[int, Tensor] = {}  # an array given for several splits is copied once

        def tensor(array: np.ndarray) -> Tensor:
            if id(array) not in tensors:
                tensors[id(array)] = torch.as_tensor(np.asarray(array), dtype=torch.float32,
                                                     device=device)
            return tensors[id(array)]

        splits = {}
        for name, (rows, observed, clean) in parts.items():
            splits[name] = SplitTensors(
                features=tensor(rows), observed=tensor(observed),
                clean=None if clean is None else tensor(clean),
                rows=np.arange(len(rows)) + (len(train[0]) if name == "val" else 0))
        num_classes = splits["train"].observed.shape[1]
        classes = list(classes) if classes is not None else [str(c) for c in range(num_classes)]
        labels = _array_labels(parts, splits, dataset, classes, source, k)
        features = FeatureSet(
            train=np.concatenate([np.asarray(train[0]), np.asarray(val[0])]),
            test=np.asarray(parts["test"][0]), train_bad=np.zeros(0, dtype=bool),
            test_bad=np.zeros(0, dtype=bool), attrs=dict(attrs or {"backbone": "arrays"}))
        data = cls(dataset=dataset, classes=classes, train=splits["train"], val=splits["val"],
                   test=splits["test"], k=labels.k, labels=labels, features=features)
        if pseudo is None:
            return data
        pseudo = np.asarray(pseudo, dtype=np.int8)
        matrix = np.concatenate([pseudo, np.zeros((len(val[0]), num_classes), np.int8)])
        given = PseudoLabels(matrix, {"name": "given", "rule": "given"}, sha256=hashlib.sha256(
            matrix.tobytes()).hexdigest())
        return replace(data, train=replace(data.train, pseudo=tensor(pseudo)),
                       pseudo_labels=given, pseudo_choice="given")



def _array_labels(parts: dict, splits: dict, dataset: str, classes: list[str], source: str,
                  k: float | None) -> LabelSet:
    """The labels file that :meth:`LinearData.from_arrays`' arrays stand for: train and val
    rows as its official training set, clean labels only when both splits have them."""
    train, val = parts["train"], parts["val"]
    full = [clean for _, _, clean in (train, val)]

    def ids(name: str) -> np.ndarray:  # row names, as a labels file's image paths
        return np.array([f"{name}/{row:06d}" for row in range(len(parts[name][0]))], dtype=object)

    return LabelSet(
        dataset=dataset, classes=classes,
        train=SplitLabels(
            np.concatenate([ids("train"), ids("val")]),
            np.concatenate([np.asarray(train[1]), np.asarray(val[1])]).astype(np.int8),
            None if any(c is None for c in full)
            else np.concatenate([np.asarray(c) for c in full]).astype(np.uint8)),
        test=SplitLabels(ids("test"), np.asarray(parts["test"][1]).astype(np.int8),
                         None if parts["test"][2] is None
                         else np.asarray(parts["test"][2]).astype(np.uint8)),
        train_index=splits["train"].rows, val_index=splits["val"].rows,
        provenance={"source": source, **({} if k is None else {"k": float(k)})})


@dataclass
class SplitRows:
    """Which rows of the features file one split takes, and its labels (before placing)."""

    name: str
    official: str  # the file's split the rows come from: train or test
    rows: np.ndarray  # sorted rows of the official split, unreadable ones dropped
    source: SplitLabels  # the official split's labels (not copied: ``rows`` of it are ours)

    def observed(self) -> np.ndarray:
        """The observed labels of the rows."""
        return self._rows_of(self.source.observed)

    def _rows_of(self, matrix: np.ndarray) -> np.ndarray:
        """``matrix``'s rows of this split: the matrix itself when the split takes every row
        in order (the test split: no copy), else a copy."""
        if len(self.rows) == len(matrix) and (self.rows == np.arange(len(matrix))).all():
            return matrix
        return matrix[self.rows]

    def label_tensors(self, device: torch.device | str) -> tuple[Tensor, Tensor | None]:
        """Observed (int8: 1, 0, -1) and full (uint8: 0/1) labels of the split's rows, as the
        labels file stores them: a quarter of float32's memory for sets of millions of rows
        (the trainer makes each batch's labels float)."""
        part = self.source
        observed = torch.as_tensor(self.observed(), dtype=torch.int8, device=device)
        clean = (None if part.clean is None
                 else torch.as_tensor(self._rows_of(part.clean), dtype=torch.uint8, device=device))
        return observed, clean


def split_rows(labels: LabelSet, features: FeatureFile) -> tuple[dict[str, SplitRows], list[str]]:
    """The rows of each split, unreadable images dropped (each drop said in a note)."""
    if features.attrs.get("labels_dataset") not in (None, labels.dataset):
        raise InputError(f"{features.path} was built for dataset {features.attrs.get('labels_dataset')!r}, "
                         f"not {labels.dataset!r}")
    splits, notes = {}, []
    for name in SPLITS:
        official = "test" if name == "test" else "train"
        source = labels.test if name == "test" else labels.train
        rows = (np.arange(len(labels.test)) if name == "test"
                else labels.train_index if name == "train" else labels.val_index)
        keep = ~features.bad[official][rows]
        if not keep.all():
            dropped = source.images[rows[~keep]]
            notes.append(f"{name}: {int((~keep).sum())} rows skipped as unreadable images "
                         f"(first: {', '.join(map(str, dropped[:3]))})")
            log.warning(notes[-1])
        if not keep.any():
            raise InputError(f"the {name} split of {labels.path} has no usable rows")
        splits[name] = SplitRows(name, official, rows[keep], source)
    return splits, notes


def load_linear_data(labels_path: str | Path, features_path: str | Path,
                     device: torch.device | str = "cpu",
                     pseudo_choice: str | None = None) -> LinearData:
    """Load and check a labels file and its features file; drop rows flagged bad (and say so).
    ``pseudo_choice`` names the pseudo-label set the losses that need one use (default: each
    loss's own rule's)."""
    labels = load_labels(labels_path, image_names=False)
    return read_linear_data(labels, open_features(features_path, labels), device, pseudo_choice)


def read_linear_data(labels: LabelSet, features: FeatureFile, device: torch.device | str = "cpu",
                     pseudo_choice: str | None = None,
                     known_rows: tuple[dict[str, SplitRows], list[str]] | None = None) -> LinearData:
    """Every split of an opened features file as float32 tensors on ``device`` (``known_rows``:
    :func:`split_rows` of this file when the caller has it already)."""
    splits, notes = known_rows or split_rows(labels, features)
    tensors = {}
    with features:
        for official in ("train", "test"):
            array = features.read(official)
            features.check_finite(official, array)
            for part in (p for p in splits.values() if p.official == official):
                observed, clean = part.label_tensors(device)
                tensors[part.name] = SplitTensors(
                    features=torch.as_tensor(np.ascontiguousarray(array[part.rows]),
                                             dtype=torch.float32, device=device),
                    observed=observed, clean=clean, rows=part.rows)
            del array
    return LinearData(
        dataset=labels.dataset, classes=list(labels.classes), train=tensors["train"],
        val=tensors["val"], test=tensors["test"], k=labels.k, labels=labels, features=features,
        notes=notes, pseudo_choice=pseudo_choice,
    )
