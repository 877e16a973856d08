"""Which losses a run trains and with which parameters: every answer comes from the loss.

The stages describe their training data once, as :class:`~featcache.losses.DataFacts`; the
losses say what they need of it (``--loss all`` trains those the data can serve and names the
others with the reason), which parameters the user's ``--param`` values belong to, and every
parameter's resolved value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np

from featcache.data.kestimate import positive_histogram
from featcache.data.labelfile import LabelSet
from featcache.data.pseudofile import available_pseudo_labels
from featcache.errors import LossNeedError, OptionError, did_you_mean
from featcache.losses import SPATIAL_FEATURES, DataFacts, ResolvedParams, loss_class, loss_names

#: ``source_format`` of the labels files whose sets have features but no images: imported
#: from precomputed features (``featcache prepare features``), or generated (the benchmarks')
WITHOUT_IMAGES = ("npz", "generated")


def training_facts(labels: LabelSet, observed: np.ndarray, has_clean: bool,
                   pseudo_choice: str | None = None, spatial: bool = False,
                   backbone: str | None = None, features_command: str = "") -> DataFacts:
    """What a loss may ask of a training split: its observed labels, whether full labels exist,
    which pseudo-label sets were made for its labels file (``pseudo_choice``: the one the
    user chose), whether spatial feature maps of ``backbone`` are at hand (``spatial``; else
    ``features_command`` plus ``--spatial`` makes them), and whether the set was imported from
    features (no images: no feature maps or pseudo-labels can be made)."""
    return DataFacts(
        dataset=labels.dataset, num_classes=labels.num_classes,
        source=str(labels.path or labels.provenance.get("source", "the labels")),
        has_clean_train=has_clean, has_observed_negatives=bool((np.asarray(observed) == -1).any()),
        mean_positives=labels.k,
        positives_histogram=(positive_histogram(labels.train.clean)
                             if labels.train.clean is not None else ()),
        pseudo_labels=tuple(available_pseudo_labels(labels)), pseudo_choice=pseudo_choice,
        spatial_features=spatial, backbone=backbone,
        imported=labels.provenance.get("source_format") in WITHOUT_IMAGES,
        features_command=features_command,
        folder=None if labels.path is None else str(Path(labels.path).parent),
    )


def requested_losses(spec: str | Sequence[str]) -> list[str]:
    """The names ``--loss`` gives (``["all"]`` for all)."""
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    return [n for n in names if n]


def choose_losses(spec: str | Sequence[str], facts: DataFacts,
                  given: Collection[str] = ()) -> tuple[list[str], list[tuple[str, str]]]:
    """The losses named by ``--loss`` (a name, a comma-separated list or ``all``); ``given``
    names the parameters the user set (``--param k=...`` lets EPR run without the data's k).

    With ``all``: every registered loss the data can serve, and (name, reason) for the others.
    Named losses are returned as given; an unknown name is refused with the closest names, a
    loss the data cannot serve with what the data lacks.
    """
    names = requested_losses(spec)
    if names == ["all"]:
        chosen, skipped = [], []
        for name in loss_names():
            reason = loss_class(name).unmet_need(facts, given)
            if reason is None:
                chosen.append(name)
            else:
                skipped.append((name, reason))
        return chosen, skipped
    if not names:
        raise OptionError("--loss needs a loss name, a comma-separated list or 'all'")
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is not None:
        raise OptionError(f"--loss names {repeated} twice; name each loss once")
    for name in names:
        reason = loss_class(name).unmet_need(facts, given)
        if reason is not None:
            raise LossNeedError(f"loss {name!r} {reason}")
    return names, []


def needs_spatial(loss: str) -> bool:
    """Whether ``loss`` trains on spatial feature maps (it declares the spatial-features need:
    its kind of head reads them, or it masks them as IGNORE does)."""
    return SPATIAL_FEATURES in loss_class(loss).needs


def split_params(given: Mapping[str, Sequence[float]], losses: Sequence[str]) -> dict[str, dict]:
    """``--param`` values sent to each loss that has them; a name no chosen loss has is refused."""
    declared = {name: set(loss_class(name).params) for name in losses}
    known = set().union(*declared.values()) if declared else set()
    unused = sorted(set(given) - known)
    if unused:
        hint = did_you_mean(unused[0], sorted(known))
        raise OptionError(f"--param {', '.join(unused)} belongs to none of the selected losses "
                          f"({', '.join(losses)}){hint}")
    return {name: {k: v for k, v in given.items() if k in declared[name]} for name in losses}


def resolve_params(loss: str, given: Mapping[str, Sequence[float] | float],
                   facts: DataFacts) -> ResolvedParams:
    """Every parameter of ``loss`` on this data: given, dataset default, data, default."""
    return loss_class(loss).resolve(given, facts=facts)
