"""The cells of a paper table: one loss on one dataset (:class:`Cell`), each seed's selected
configuration (:class:`SeedChoice`, read from a results document by :func:`seed_choices`), and
the mean and standard deviation over seeds (:func:`estimate`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from featcache.tables import Estimate


@dataclass
class SeedChoice:
    """What one seed of a run selected, and the numbers at its selected epoch."""

    seed: int
    lr: float
    batch_size: int
    epoch: int
    params: dict
    val_map: float | None
    test_map: float
    test_ap_per_class: dict[str, float] | None
    run: str

    def describe(self) -> str:
        """``lr 0.001, batch 8, epoch 12``."""
        if self.lr is None:
            return "no training (zero-shot)"
        return f"lr {self.lr:g}, batch {self.batch_size}, epoch {self.epoch}"

    def to_json(self) -> dict:
        return {"seed": self.seed, "lr": self.lr, "batch_size": self.batch_size,
                "epoch": self.epoch, "params": self.params, "val_map": self.val_map,
                "test_map": self.test_map, "run": self.run}


@dataclass
class Cell:
    """One loss on one dataset: every seed found, and the published number."""

    loss: str
    dataset: str
    seeds: list[SeedChoice]
    published: float | None
    documents: list[dict] = field(default_factory=list)

    @property
    def estimate(self) -> Estimate:
        return estimate([s.test_map for s in self.seeds])

    @property
    def delta(self) -> float | None:
        return None if self.published is None else self.estimate.mean - self.published

    @property
    def classes_without_positives(self) -> list[str]:
        """Test classes without a positive (the same for every run of one labels file)."""
        found: dict[str, None] = {}  # ordered, and a constant-time test (100,000 classes)
        for document in self.documents:
            found.update(dict.fromkeys(document.get("evaluation", {}).get("test", {}).get(
                "classes_without_positives", [])))
        return list(found)

    def per_class(self) -> tuple[dict[str, Estimate], bool]:
        """Per-class test AP over seeds, and whether every seed recorded it (older linear runs
        kept it for the best seed only)."""
        recorded = [s.test_ap_per_class for s in self.seeds if s.test_ap_per_class]
        classes = list(recorded[0]) if recorded else []
        return ({c: estimate([r[c] for r in recorded]) for c in classes},
                len(recorded) == len(self.seeds))

    def to_json(self) -> dict:
        value = self.estimate
        return {"loss": self.loss, "dataset": self.dataset, "mean": value.mean, "sd": value.sd,
                "seeds": value.n, "published": self.published, "delta": self.delta,
                "classes_without_positives": self.classes_without_positives,
                "selected": [s.to_json() for s in self.seeds]}


def estimate(values: Sequence[float]) -> Estimate:
    """Mean and sample standard deviation (0 for one value), as ``featcache`` summaries do."""
    values = list(values)
    return Estimate(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0,
                    len(values))


def seed_choices(document: dict, run: str) -> list[SeedChoice]:
    """Each seed's selected configuration in a results document (either stage)."""
    variant = document.get("protocol", {}).get("val_variant", "clean")
    val_key = "val_map" if variant == "clean" else "val_map_observed"
    if document.get("stage") == "finetune":
        selection = document["selection"]
        return [SeedChoice(int(document["protocol"].get("seed", 0)), selection["lr"],
                           selection["batch_size"], selection["epoch"], selection["params"],
                           selection.get(val_key), selection["test_map"],
                           selection.get("test_ap_per_class"), run)]
    choices = []
    for entry in document["seeds"]:
        chosen = entry["selected"]
        per_class = chosen.get("test_ap_per_class")
        if per_class is None and chosen["seed"] == document["selection"].get("seed"):
            per_class = document["selection"].get("test_ap_per_class")
        choices.append(SeedChoice(chosen["seed"], chosen["lr"], chosen["batch_size"],
                                  chosen["best_epoch"], chosen["params"], chosen.get(val_key),
                                  chosen["test_map"], per_class, run))
    return choices
