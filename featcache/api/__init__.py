"""The Python API: use what featcache trained.

- :class:`SPMLClassifier`: a scikit-learn estimator that trains one SPML linear head with
  stage two's own trainer and losses (``featcache.api.estimator``), on class labels or a
  label matrix (``featcache.api.targets``);
- :class:`BackboneFeatures`: a scikit-learn transformer from images to stage one's pooled
  features, so that ``make_pipeline(BackboneFeatures(...), SPMLClassifier(...))`` fits on
  image paths (``featcache.api.backbone_features``);
- :class:`ZeroShotClassifier`: CLIP's zero-shot scores from class-prompt embeddings, the
  baseline every SPML loss must beat (``featcache.api.zeroshot``);
- :func:`load_run`: a finished stage-two or stage-three run folder as an object that predicts
  from features or images (``featcache.api.runs``);
- :func:`map_interval` and :func:`compare`: a run's test mAP with its bootstrap interval,
  and two runs compared on the same resampled test images (``featcache.api.uncertainty``;
  ``LinearRun.map_interval()`` too);
- prediction files, class activation maps and paper tables behind ``featcache predict``,
  ``featcache cam`` and ``featcache table`` (``predict``, ``cam``; the tables are
  :mod:`featcache.protocol.results_table`).

``import featcache`` exports ``SPMLClassifier``, ``BackboneFeatures`` and ``load_run`` lazily (the command line
never pays for importing torch and scikit-learn before it needs them).
"""

import importlib

#: each exported name and the module that defines it, imported on first access (PEP 562): the
#: commands that use one module (``predict``, ``cam``) never import scikit-learn for the
#: estimators (about 2 CPU-seconds per command)
_EXPORTS = {
    "BackboneFeatures": "featcache.api.backbone_features",
    "Comparison": "featcache.api.uncertainty",
    "compare": "featcache.api.uncertainty",
    "map_interval": "featcache.api.uncertainty",
    "SPMLClassifier": "featcache.api.estimator",
    "FinetuneRun": "featcache.api.runs",
    "LinearRun": "featcache.api.runs",
    "load_run": "featcache.api.runs",
    "map_scorer": "featcache.api.scoring",
    "mean_average_precision_score": "featcache.api.scoring",
    "ZeroShotClassifier": "featcache.api.zeroshot",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'featcache.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
