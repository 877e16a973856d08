"""One registry of losses: ``create_loss(name, ...)`` builds any of them (cf. timm's ``create_model``)."""

from __future__ import annotations

from collections.abc import Mapping

from featcache.errors import OptionError, unknown_name
from featcache.losses.base import SPMLLoss
from featcache.losses.needs import DataFacts
from featcache.losses.params import ParamValue

_REGISTRY: dict[str, type[SPMLLoss]] = {}


def register_loss(cls: type[SPMLLoss]) -> type[SPMLLoss]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"loss name {cls.name!r} is registered twice")
    referred = {key for values in cls.dataset_defaults.values() for key in values}
    if (referred | set(cls.learned_state.values())) - set(cls.params):
        raise ValueError(f"{cls.__name__} refers to undeclared parameters")
    _REGISTRY[cls.name] = cls
    return cls


def loss_names() -> list[str]:
    """Every registered loss name, in registration order."""
    return list(_REGISTRY)


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
