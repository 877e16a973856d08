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
- prediction files, class activation maps and paper tables behind ``featcache predict``,
  ``featcache cam`` and ``featcache table`` (``predict``, ``cam``; the tables are
  :mod:`featcache.protocol.results_table`).

``import featcache`` exports ``SPMLClassifier``, ``BackboneFeatures`` and ``load_run`` lazily (the command line
never pays for importing torch and scikit-learn before it needs them).
"""

from featcache.api.backbone_features import BackboneFeatures  # noqa: F401
from featcache.api.estimator import SPMLClassifier  # noqa: F401
from featcache.api.runs import FinetuneRun, LinearRun, load_run  # noqa: F401
from featcache.api.scoring import map_scorer, mean_average_precision_score  # noqa: F401
from featcache.api.zeroshot import ZeroShotClassifier  # noqa: F401
