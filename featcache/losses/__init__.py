"""Every single-positive multi-label loss, in one registry.

Importing this package discovers every loss: each module of the package is imported and its
classes register themselves (``@register_loss``), so a new loss is one module here (and its
tests). Use :func:`create_loss` to build one. Modules: ``cole`` (Cole et al. 2021),
``entropy`` (Zhou et al. 2022: EM, EM-APL, EntMin), ``large_loss`` (Kim et al. 2022: LL-R/Ct/Cp
and their absolute variants), ``opml`` (Li et al.: OPML, OPML-SP; ZLPR), ``baselines`` (focal,
ASL, DW, L1R, L2R), ``gr`` (Chen et al. 2024: the GR loss, with its K/V terms and schedule as
reusable functions), ``hill`` (Zhang et al.: Hill, SPLC), ``vlpl`` (Xing et al. 2024:
vision-language pseudo-labels), ``gpr`` (Tran et al. 2025: AEVLP's GPR loss, on GR's terms),
``cardinality_max``, ``cardinality_dist``, ``cardinality_exact`` (Gharib et al. 2025: the label
cardinality's maximum, distribution and exact count), ``boostlu`` (Kim et al. 2023: AN / LL-R /
LL-Ct / LL-Cp on BoostLU's head), ``ignore`` (Song et al. 2024: IGNORE's false-negative
rejection by a masked second pass). ``featcache losses`` lists them in each module's
``CATALOG_ORDER``; ``docs/losses.md`` writes out every formula.
"""

from featcache.heads import HeadKind  # noqa: F401
from featcache.losses.base import MaskedPassLoss, SPMLLoss  # noqa: F401
from featcache.losses.needs import (  # noqa: F401
    FULL_LABELS,
    OBSERVED_NEGATIVES,
    SPATIAL_FEATURES,
    DataFacts,
    Need,
    TrainingData,
    pseudo_labels,
)
from featcache.losses.params import Param, ResolvedParams  # noqa: F401
from featcache.losses.registry import (  # noqa: F401
    create_loss,
    discover_losses,
    loss_class,
    loss_names,
    register_loss,
)
from featcache.losses.targets import Targets  # noqa: F401
from featcache.losses.terms import LOG_EPSILON, neglog  # noqa: F401

discover_losses()
