"""Biased single-positive observation: which positive an annotator would name first.

Arroyo, Perona and Cole (ICLR 2023 Tiny Papers, "Understanding label bias in single positive
multi-label learning") replace the uniform draw by one whose weights favour large objects, objects
near the image centre, or classes people name readily. Their code
(``Julio-Arroyo/single-positive-multi-label`` @ 17e2524, ``preproc/biased_labels.py``) is followed
call for call:

- a fresh ``random.Random(seed)`` (Python's Mersenne Twister, not NumPy's) per official split;
  rows in order; each row draws its one observed positive with ``rng.choices(classes, weights)``
  (one ``random()`` per row), or with ``rng.choice(positives)`` when every weight is 0 (semantic);
- **size**: w_c = sum over the image's objects of class c of area / (sum of all its objects'
  areas), accumulated object by object in source order;
- **location**: w_c = sum over the objects of class c of nu / d, d the distance in pixels from
  the box centre to the image centre (0.0005 when 0); nu = 1 / sum_objects 1/d' with d' measured
  to the point (width, height) (1 when 0): the reference's per-image "normalising constant",
  whose centre is wrong but which scales all of an image's weights alike, so it changes the
  draw only through float rounding; it is kept so that the sums match the reference's bits;
- **semantic**: w_c = s_c for the image's positive classes, 0 elsewhere, with one fixed weight
  s_c per class given by the user (:func:`read_class_weights`): the reference computes s_c
  from COCO crowdsourcing click files that its repository does not contain.

Only objects of the image's positive classes count (VOC lists objects of classes that are only
"difficult", which the protocol labels negative). No negatives are observed.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featcache.data.objects import ImageObjects
from featcache.errors import InputError, OptionError, plural
from featcache.fileio import sha256_file

OBSERVERS = ("uniform", "size", "location", "semantic")
BIASED = OBSERVERS[1:]
ARROYO = "Arroyo, Perona, Cole, ICLR 2023 Tiny Papers"
#: the reference's distance for a box centred exactly on the image centre
ZERO_DISTANCE = 0.0005


@dataclass
class Observer:
    """How the observed positive is chosen: the rule and, for ``semantic``, its class weights."""

    rule: str = "uniform"
    #: semantic: one weight per class, in protocol order
    class_weights: list[float] | None = None
    #: where the class weights came from (file, sha256), for the provenance
    weights_source: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rule not in OBSERVERS:
            raise OptionError(f"--observe {self.rule!r}: choose one of {', '.join(OBSERVERS)}")
        if (self.rule == "semantic") != (self.class_weights is not None):
            raise OptionError("--observe semantic needs --class-weights FILE (one weight per "
                              "class), and --class-weights is only for --observe semantic")

    @property
    def biased(self) -> bool:
        return self.rule != "uniform"

    def record(self) -> dict:
        """What the provenance keeps of the sampler."""
        if not self.biased:
            return {"rule": "uniform"}
        record: dict[str, object] = {
            "rule": self.rule, "reference": ARROYO,
            "rng": "random.Random(obs_seed) per official split; one rng.choices draw per row "
                   "(rng.choice among the positives when every weight is 0)"}
        if self.class_weights is not None:  # the semantic rule's
            record["class_weights"] = list(self.class_weights)
            record["class_weights_source"] = dict(self.weights_source)
        return record


def read_class_weights(path: str | os.PathLike, classes: Sequence[str]) -> Observer:
    """The semantic sampler with the per-class weights of ``path``: a JSON object
    ``{"class name": weight, ...}`` naming every class once, weights finite and >= 0."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"class-weights file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not valid JSON ({exc}); expected an object "
                         '{"class name": weight, ...}') from None
    if not isinstance(data, dict):
        raise InputError(f'{path}: expected a JSON object {{"class name": weight, ...}}, found a '
                         f"{type(data).__name__}")
    missing = [c for c in classes if c not in data]
    unknown = [c for c in data if c not in set(classes)]
    if missing or unknown:
        parts = ([f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")]
                 if missing else []) + ([f"unknown {', '.join(unknown[:5])}"] if unknown else [])
        raise InputError(f"{path}: the class weights must name every class of the dataset once "
                         f"({'; '.join(parts)})")
    weights = []
    for name in classes:
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            raise InputError(f"{path}: the weight of {name!r} is {value!r}; weights are finite "
                             "numbers >= 0")
        weights.append(float(value))
    return Observer("semantic", weights, {"file": str(path.resolve()), "sha256": sha256_file(path)})


def size_weights(objects: ImageObjects, num_classes: int) -> list[float]:
    """Each class's share of the image's total object area (the reference's ``size`` rule)."""
    total = 0.0
    for area in objects.areas:
        total += area
    weights = [0.0] * num_classes
    if not total > 0:
        return weights
    for column, area in zip(objects.classes, objects.areas, strict=True):
        weights[column] += area / total
    return weights


def location_weights(objects: ImageObjects, num_classes: int) -> list[float]:
    """Each class's sum of nu / (distance of its boxes' centres to the image centre)."""
    inverse = 0.0
    for x, y, w, h in objects.boxes:  # the reference's constant, measured to (width, height)
        d = math.sqrt((x + w / 2 - objects.width) ** 2 + (y + h / 2 - objects.height) ** 2)
        inverse += 1 / (d if d != 0 else 1)
    nu = 1 / inverse
    centre_x, centre_y = 0.5 * objects.width, 0.5 * objects.height
    weights = [0.0] * num_classes
    for column, (x, y, w, h) in zip(objects.classes, objects.boxes, strict=True):
        d = math.sqrt((x + w / 2 - centre_x) ** 2 + (y + h / 2 - centre_y) ** 2)
        weights[column] += nu / (d if d != 0 else ZERO_DISTANCE)
    return weights


def observe_biased(clean: np.ndarray, observer: Observer, seed: int,
                   objects: Sequence[ImageObjects | None] | None = None,
                   images: Sequence[str] | None = None, split: str = "train") -> np.ndarray:
    """One observed positive per row of the clean 0/1 matrix, drawn with ``observer``'s rule.

    ``objects`` (one per row) are needed by ``size`` and ``location``; ``images`` name rows in
    errors. Returns an int8 matrix with exactly one 1 per row.
    """
    if not observer.biased:
        raise ValueError("observe_biased draws with a biased rule; use observe_uniform")
    clean = np.asarray(clean)
    rows, num_classes = clean.shape
    if observer.rule != "semantic" and (objects is None or len(objects) != rows):
        raise InputError(f"--observe {observer.rule} needs the object boxes of every {split} "
                         "image; this dataset has none (voc, coco and shapes have them)")
    if observer.class_weights is not None and len(observer.class_weights) != num_classes:
        raise InputError(f"{plural(len(observer.class_weights), 'class weight')} for {plural(num_classes, 'class', 'classes')}")
    rng = random.Random(seed)
    columns = range(num_classes)
    observed = np.zeros(clean.shape, dtype=np.int8)
    for row in range(rows):
        positives = [int(c) for c in np.flatnonzero(clean[row] == 1)]
        if not positives:
            raise InputError(f"{split} row {row} has no positive label to observe")
        weights = _row_weights(observer, positives, None if objects is None else objects[row],
                               num_classes, f"{split} image {_name(images, row)}")
        if any(weights):
            choice = rng.choices(columns, weights=weights)[0]
        else:  # semantic, every positive class weighted 0: uniform among the positives
            choice = rng.choice(positives)
        observed[row, choice] = 1
    return observed


def _row_weights(observer: Observer, positives: list[int], objects: ImageObjects | None,
                 num_classes: int, where: str) -> list[float]:
    if observer.class_weights is not None:  # semantic
        weights = [0.0] * num_classes
        for column in positives:
            weights[column] = observer.class_weights[column]
        return weights
    kept = objects.only(set(positives)) if objects is not None else None
    if not kept:
        raise InputError(f"{where} has no object box of its positive classes; --observe "
                         f"{observer.rule} draws among the boxes")
    weights = (size_weights if observer.rule == "size" else location_weights)(kept, num_classes)
    if not any(weights):
        raise InputError(f"{where}: its boxes have a total area of 0, so --observe size has "
                         "nothing to weigh")
    return weights


def _name(images: Sequence[str] | None, row: int) -> str:
    return f"{images[row]} (row {row})" if images is not None else f"row {row}"
