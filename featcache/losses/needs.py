"""What a loss asks of its training data: the data's :class:`DataFacts`, each :class:`Need` with
the words that say why given data falls short, and the needs the losses declare."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

from featcache.data.featurefile import vision_language_files


@dataclass(frozen=True)
class DataFacts:
    """What a loss may ask of its training data (built by each stage from its labels file)."""

    dataset: str
    num_classes: int
    source: str = "the labels file"  # named in messages: the labels file's path
    has_clean_train: bool = True
    has_observed_negatives: bool = False
    mean_positives: float | None = None  # k: mean positives per official training image
    #: ((positives per image, images), ...) of the official training set's clean labels (empty
    #: without them): what ``--param k=estimate:M`` draws from
    positives_histogram: tuple[tuple[int, int], ...] = ()
    pseudo_labels: tuple[str, ...] = ()  # names of the pseudo-label sets made for these labels
    pseudo_choice: str | None = None  # the set the user chose (--pseudo-labels), if any
    #: whether the training features are spatial maps (stage two: a spatial features file,
    #: ``featcache features --spatial``; stage three: the trunk's feature map, always)
    spatial_features: bool = False
    backbone: str | None = None  # the features' backbone, named in messages
    #: the set was imported from precomputed features (``featcache prepare features``) or
    #: generated: it has no images, so nothing can make feature maps or pseudo-labels for it
    imported: bool = False
    #: the command that made the pooled features, with its options (``--spatial`` is added to
    #: it in the spatial need's advice); empty when unknown
    features_command: str = ""
    #: the dataset's folder (its features files are looked in when advice needs them)
    folder: str | None = None


#: why a need that images would meet cannot be met on a set imported from features (or
#: generated, as the benchmarks' sets are)
NOT_FOR_IMPORTED = ("is not available for a set imported from features (it has features but "
                    "no images)")


class TrainingData(Protocol):
    """What a stage's data offers a :class:`Need` (stage two's and stage three's data do)."""

    @property
    def facts(self) -> DataFacts: ...

    def with_observed_negatives(self, num_neg: int) -> Self: ...

    def with_pseudo_labels(self, name: str) -> Self: ...


D = TypeVar("D", bound=TrainingData)


class Adapt(Protocol):
    """Completes data that can be completed: the same kind of data, with what a need adds."""

    def __call__(self, data: D, /) -> D: ...


@dataclass(frozen=True)
class Need:
    """Something a loss requires of the training data.

    ``unmet(facts)`` says why data falls short (None when it does not); ``adapt(data)``
    completes data that can be completed (observed negatives drawn from full labels).
    """

    key: str
    description: str
    unmet: Callable[[DataFacts], str | None]
    adapt: Adapt | None = None


def _needs_full_labels(facts: DataFacts) -> str | None:
    if facts.has_clean_train:
        return None
    return (f"trains on full labels, but {facts.source} holds single positives only "
            "(no clean training labels)")


def _needs_negatives(facts: DataFacts) -> str | None:
    if facts.has_observed_negatives or facts.has_clean_train:
        return None
    return "needs observed negatives; prepare the labels with --num-neg 1"


def _draw_negatives(data: D) -> D:
    return data if data.facts.has_observed_negatives else data.with_observed_negatives(num_neg=1)


def pseudo_labels(rule: str) -> Need:
    """Pseudo-labels from ``featcache pseudo-label`` (the set named ``rule`` unless the user
    chose another with ``--pseudo-labels``), attached to the training rows as ``Targets.pseudo``."""

    def unmet(facts: DataFacts) -> str | None:
        name = facts.pseudo_choice or rule
        if name in facts.pseudo_labels:
            return None
        if facts.imported:
            return (f"{NOT_FOR_IMPORTED} (pseudo-labels {name!r} come from a vision-language "
                    "backbone run on the images, and it has none)")
        have = f" (made so far: {', '.join(facts.pseudo_labels)})" if facts.pseudo_labels else ""
        return f"needs pseudo-labels {name!r}{have}; {making_pseudo_labels(facts, rule, name)}"

    def adapt(data: D) -> D:
        return data.with_pseudo_labels(data.facts.pseudo_choice or rule)

    return Need("pseudo_labels", f"pseudo-labels (`featcache pseudo-label --rule {rule}`)",
                unmet, adapt)


#: the vision-language features each rule's paper uses (docs/pseudo-labels.md): backbone, the
#: options of ``featcache features`` and the features file's tag they give
RULE_FEATURES = {
    "vlpl": ("clip-vit-l14-336", "--preprocess protocol --image-size 336 --text",
             "clip-vit-l14-336-protocol"),
    "aevlp": ("clip-vit-b16", "--preprocess protocol --text --crops 4x4", "clip-vit-b16-protocol"),
}


def making_pseudo_labels(facts: DataFacts, rule: str, name: str) -> str:
    """The commands that make pseudo-labels ``name`` by ``rule``: ``featcache pseudo-label`` on
    a features file of the dataset that has class-prompt embeddings (and tiles, for aevlp), or
    first the ``featcache features`` command of the rule's paper, which needs its weights."""
    named = f" --name {name}" if name != rule else ""
    found = vision_language_files(facts.folder) if facts.folder else {}
    usable = [tag for tag, tiles in found.items() if tiles or rule != "aevlp"]
    if usable:
        which = f" --backbone {usable[0]}" if len(found) > 1 else ""
        return (f"make them with `featcache pseudo-label --dataset {facts.dataset} --rule {rule}"
                f"{which}{named}`")
    backbone, options, tag = RULE_FEATURES.get(rule, ("clip-vit-l14-336", "--text", "clip-vit-l14-336"))
    return (f"make them from a vision-language features file: `featcache features --dataset "
            f"{facts.dataset} --backbone {backbone} {options}` (its CLIP weights come from the "
            "Hugging Face hub: the first run needs the network, unless they are in the hub cache), "
            f"then `featcache pseudo-label --dataset {facts.dataset} --rule {rule} --backbone "
            f"{tag}{named}` (docs/pseudo-labels.md)")


def _needs_spatial(facts: DataFacts) -> str | None:
    if facts.spatial_features:
        return None
    if facts.imported:
        return (f"{NOT_FOR_IMPORTED} (a head on feature maps (BoostLU, IGNORE) trains on the "
                "backbone's feature maps of the images, and it has none)")
    backbone = f" --backbone {facts.backbone}" if facts.backbone else ""
    make = facts.features_command or f"featcache features --dataset {facts.dataset}{backbone}"
    return ("trains on spatial feature maps, but there is no spatial features "
            f"file for {facts.dataset}: run `{make} --spatial` first")


#: full (clean) training labels: the oracles bce, bce-ls and iun
FULL_LABELS = Need("full_labels", "full train labels", _needs_full_labels)
#: observed negatives (``--num-neg``), drawn with the protocol's sampler when full labels exist
OBSERVED_NEGATIVES = Need("observed_negatives", "observed negatives", _needs_negatives,
                          adapt=_draw_negatives)
#: spatial feature maps (B, h*w, D) instead of pooled features: BoostLU's heads (Kim et al.
#: 2023) boost the class activation map before pooling. Stage two reads them from the spatial
#: features file, stage three from the trunk's ``feature_map``.
SPATIAL_FEATURES = Need("spatial_features",
                        "spatial feature maps (`featcache features --spatial`)", _needs_spatial)
