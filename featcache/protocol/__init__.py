"""The protocol layer shared by the stages: what makes a stage-two or stage-three run a run of
the papers' protocol, written once.

- ``grid``: the learning-rate x batch-size grid and its defaults, grid points, LinearInit's
  fixed linear-phase hyperparameters;
- ``seeds``: seeds derived from a run seed, and the seeded fresh linear head;
- ``selection``: best epoch and best configuration by validation mAP, early-stopping rules;
- ``loss_choice``: which losses a run trains (``--loss all`` asks each loss what it needs) and
  the facts about the training data that losses read (``k``, full labels, negatives);
- ``feature_source``: which features files a run trains on (``FeatureSource``), for both stages;
- ``search_modes``: stage two's search modes (``--search``) as every part sees them, registered
  one module per mode;
- ``records``: per-epoch records and the common parts of every ``results.json``;
- ``runs``: run folders, their settings fingerprints, finished runs and the best of them;
- ``handoff``: the file stage two hands to stage three (the selected head, ROLE's phi);
- ``plots``: validation/test curves;
- ``test_scores``: each run's test scores (``test-scores.h5``, written by both stages; an older
  stage-two run's computed again by ``rescore``), and ``uncertainty``: bootstrap intervals and
  paired comparisons of a table's cells (shown by ``uncertainty_table``).

``featcache.linear`` and ``featcache.finetune`` both build on this package; neither imports the
other, and nothing here imports a stage.
"""
