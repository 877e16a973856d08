"""Honest metrics: which classes an evaluation split can score, said out loud.

The protocol's mAP averages AP over **every** class, and a class with no positive in the
evaluated split gets AP 0 (the reference code's ``metrics.compute_avg_precision``; featcache
keeps that, so numbers stay comparable). Such a class drags the mean down for a reason that
has nothing to do with the model, so wherever it happens featcache names the classes and
gives, beside the protocol's mAP, the mAP over the classes that do have positives. Because
absent classes contribute exactly 0 to the sum, that mean is ``mAP x L / L_present``.

A validation split with fewer than :data:`MIN_VAL_POSITIVES` positives for many classes (at
least :data:`SMALL_VAL_SHARE` of them) selects epochs and configurations on noise; runs warn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from featcache.errors import name_list, plural

#: fewer validation positives than this for a class makes its AP a noisy selection signal
MIN_VAL_POSITIVES = 5
#: warn when at least this share of the classes has fewer than MIN_VAL_POSITIVES positives
SMALL_VAL_SHARE = 0.25


@dataclass(frozen=True)
class ClassCoverage:
    """Positives per class in one evaluation split (validation or test)."""

    split: str
    classes: tuple[str, ...]
    positives: tuple[int, ...]

    @property
    def missing(self) -> list[str]:
        """Classes with no positive: AP 0 in the protocol's mAP."""
        return [c for c, n in zip(self.classes, self.positives, strict=True) if n == 0]

    @property
    def few(self) -> list[str]:
        """Classes with fewer than :data:`MIN_VAL_POSITIVES` positives (none included)."""
        return [c for c, n in zip(self.classes, self.positives, strict=True)
                if n < MIN_VAL_POSITIVES]

    @property
    def too_small_to_select(self) -> bool:
        """Whether many classes have too few positives to select on (validation splits)."""
        return len(self.few) >= max(1, SMALL_VAL_SHARE * len(self.classes))

    def map_over_present(self, protocol_map: float | None) -> float | None:
        """The mAP over the classes that have positives, from the protocol's mAP (percent)."""
        present = len(self.classes) - len(self.missing)
        if protocol_map is None or present == 0:
            return None
        return protocol_map * len(self.classes) / present

    def to_json(self) -> dict:
        return {"positives_per_class": dict(zip(self.classes, self.positives, strict=True)),
                "classes_without_positives": self.missing,
                "classes_with_few_positives": self.few,
                "min_positives": MIN_VAL_POSITIVES}

    def missing_note(self, protocol_map: float | None = None) -> str | None:
        """A loud sentence when classes have no positive (None when every class has one)."""
        missing = self.missing
        if not missing:
            return None
        text = (f"{len(missing)} of {plural(len(self.classes), 'class', 'classes')} have no positive in the "
                f"{self.split} split ({name_list(missing)}): they count as AP 0 in the "
                "protocol's mAP, as in the reference code")
        present = self.map_over_present(protocol_map)
        if present is not None:
            text += (f"; {self.split} mAP {protocol_map:.2f} over all classes, "
                     f"{present:.2f} over the {len(self.classes) - len(missing)} with positives")
        return text

    def small_note(self) -> str | None:
        """A warning when the split is too small to select on (validation splits)."""
        if not self.too_small_to_select:
            return None
        return (f"the {self.split} split has fewer than {plural(MIN_VAL_POSITIVES, 'positive')} for "
                f"{len(self.few)} of {plural(len(self.classes), 'class', 'classes')} ({name_list(self.few)}): "
                "selecting epochs and configurations on it is noisy")


def coverage(split: str, classes: Sequence[str], targets) -> ClassCoverage:
    """Positives per class of ``targets`` (n, L): 1 marks a positive (-1 and 0 do not)."""
    array = np.asarray(targets.cpu() if hasattr(targets, "cpu") else targets)
    counts = (array == 1).sum(axis=0) if array.size else np.zeros(len(classes), dtype=int)
    return ClassCoverage(split, tuple(str(c) for c in classes), tuple(int(n) for n in counts))


def evaluation_coverage(data, val_variant: str) -> tuple[ClassCoverage, ClassCoverage]:
    """Positives per class of the labels that select (validation: clean, or observed with
    ``--val observed``) and score (test: clean when known) in either stage's data (anything
    with ``classes`` and ``val`` / ``test`` splits holding ``clean`` and ``observed``)."""
    val = data.val.clean if val_variant == "clean" else data.val.observed
    test = data.test.clean if data.test.clean is not None else data.test.observed
    return coverage("validation", data.classes, val), coverage("test", data.classes, test)


def evaluation_notes(val: ClassCoverage | None, test: ClassCoverage | None,
                     val_map: float | None = None, test_map: float | None = None) -> list[str]:
    """Every sentence a run should say about its evaluation splits (for warnings and notes)."""
    notes = []
    if val is not None:
        notes += [n for n in (val.missing_note(val_map), val.small_note()) if n]
    if test is not None:
        notes += [n for n in (test.missing_note(test_map),) if n]
    return notes
