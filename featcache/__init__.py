"""featcache: single-positive multi-label learning on cached backbone features.

Stage zero prepares labels (``featcache prepare``), stage one caches ResNet-50 features
(``featcache features``), stage two trains every published SPML loss as fast linear heads
(``featcache train-linear``) and stage three fine-tunes end to end (``featcache finetune``).

The Python API (:mod:`featcache.api`), loaded on first use::

    from featcache import BackboneFeatures, SPMLClassifier, load_run
"""

import importlib

__version__ = "0.1.0"

#: names exported from :mod:`featcache.api`, imported on first access (PEP 562) so that
#: ``import featcache`` and ``featcache --help`` stay fast and never import torch
_API = ("BackboneFeatures", "SPMLClassifier", "ZeroShotClassifier", "load_run", "map_scorer",
        "mean_average_precision_score")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module("featcache.api"), name)
    raise AttributeError(f"module 'featcache' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
