"""One registry of losses: ``create_loss(name, ...)`` builds any of them (cf. timm's ``create_model``).

Losses are discovered, not listed: :func:`discover_losses` imports every module of this package,
and each loss class registers itself with ``@register_loss``. A module places its losses in
``featcache losses`` and ``--loss all`` with a module-level ``CATALOG_ORDER`` (smaller first;
a module without one comes after those that have one, by module name); within a module, losses
keep the order of their classes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from featcache.discovery import import_modules_of
from featcache.errors import OptionError, unknown_name
from featcache.losses.base import MaskedPassLoss, SPMLLoss
from featcache.losses.needs import SPATIAL_FEATURES, DataFacts
from featcache.losses.params import ParamValue

_REGISTRY: dict[str, type[SPMLLoss]] = {}
#: where a module without ``CATALOG_ORDER`` stands
UNORDERED = 1_000_000


def register_loss(cls: type[SPMLLoss]) -> type[SPMLLoss]:
    """Class decorator: make ``cls`` available under ``cls.name``, after checking that its
    declarations agree with one another."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"loss name {cls.name!r} is registered twice")
    referred = {key for values in cls.dataset_defaults.values() for key in values}
    if (referred | set(cls.learned_state.values())) - set(cls.params):
        raise ValueError(f"{cls.__name__} refers to undeclared parameters")
    if cls.head.spatial != (SPATIAL_FEATURES in cls.needs):
        raise ValueError(f"{cls.__name__}: a loss whose head reads spatial maps declares the "
                         "spatial-features need, and only such a loss does")
    if issubclass(cls, MaskedPassLoss) and not cls.head.spatial:
        raise ValueError(f"{cls.__name__}: a masked-pass loss needs a head with class "
                         "activation maps")
    missing = [key for key in cls.head.implementation.loss_params if key not in cls.params]
    if missing:
        raise ValueError(f"{cls.__name__}: its {cls.head} head reads the parameters {missing}")
    _REGISTRY[cls.name] = cls
    return cls


def discover_losses(package: str = "featcache.losses") -> None:
    """Import every module of ``package`` (each registers the losses it defines)."""
    import_modules_of(package)


def _listing_key(item: tuple[int, type[SPMLLoss]]) -> tuple[int, str, int]:
    index, cls = item
    module = sys.modules.get(cls.__module__)
    return (int(getattr(module, "CATALOG_ORDER", UNORDERED)), cls.__module__, index)


def loss_names() -> list[str]:
    """Every registered loss name, in catalog order (``featcache losses``, ``--loss all``)."""
    ordered = sorted(enumerate(_REGISTRY.values()), key=_listing_key)
    return [cls.name for _, cls in ordered]


def loss_class(name: str) -> type[SPMLLoss]:
    """The class registered as ``name``; the error names the closest valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError(unknown_name("loss", name, loss_names(), plural="losses",
                                       listing="`featcache losses` describes each")) from None


def create_loss(name: str, num_classes: int, num_heads: int = 1,
                params: Mapping[str, ParamValue] | None = None,
                dataset: str | None = None, facts: DataFacts | None = None) -> SPMLLoss:
    """Build the loss ``name`` for ``num_classes`` classes and ``num_heads`` stacked heads.

    ``params`` may leave out anything with a default; ``facts`` supplies what the data decides
    (``k``); ``dataset`` selects the reference code's per-dataset defaults.
    """
    return loss_class(name)(num_classes, num_heads=num_heads, params=params, dataset=dataset,
                            facts=facts)
