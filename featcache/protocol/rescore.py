"""Test scores of a stage-two run made before runs kept them (``test-scores.h5``).

Its ``best.pt`` holds the selected head of its best seed: scored on the features file's test
rows (the labels file's test split, unreadable images dropped, as training read them) with the
kernel stage two's evaluation runs (``sigmoid(X @ W + b)`` in float32, one head's batched
matmul; L2-normalised rows for a ``--search probe`` head), these are the scores its recorded
test AP came from. The other seeds' heads were not kept, so a run of several seeds gives its
best seed's scores only (said in the notes). BoostLU heads and heads on spatial maps are not
scored again (their spatial file is large): such a run says to train it again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featcache.data.featurefile import FeatureFile, open_features
from featcache.data.labelfile import LabelSet, load_labels
from featcache.errors import FeatcacheError, plural
from featcache.protocol.test_scores import NoScores, NoScoresFile, TestScores, read_stored_scores

#: recorded and recomputed per-class test AP (points) agree within this
AGREEMENT = 1e-6


def rescore_linear_run(run_dir: Path, document: dict) -> TestScores:
    """The best seed's test scores of an older stage-two run, from ``best.pt`` and the
    features file; :class:`NoScores` saying why when that cannot be done."""
    import torch  # here: reading stored scores (every run made since) needs no torch

    from featcache.protocol.handoff import load_head

    retrain = (f"train it again to get them (`featcache train-linear --dataset "
               f"{document.get('dataset')} --loss {document.get('loss')} --run-id "
               f"{run_dir.name} --overwrite`, with its other options)")
    kind = (document.get("head") or {}).get("kind", "linear")
    if kind != "linear":
        raise NoScores(f"{run_dir} keeps no test scores and its {kind} head is not scored "
                       f"again here; {retrain}")
    try:
        head = load_head(run_dir)
        inputs = _test_split(_input_path(run_dir, document, "labels"),
                             _input_path(run_dir, document, "features"))
    except FeatcacheError as exc:
        raise NoScores(f"{run_dir} keeps no test scores, and they cannot be computed again: "
                       f"{exc}") from exc
    labels, features, rows, rows_x = inputs
    for what, given in (("labels", labels), ("features", features)):
        if given.sha256 != (document.get(what) or {}).get("sha256"):
            raise NoScores(f"{given.path} is not the {what} file {run_dir} was trained on (its "
                           f"sha256 differs); {retrain}")
    weight, bias = head["weight"].float(), head["bias"].float()
    if features.spatial_shape is not None or features.dim != weight.shape[1]:
        raise NoScores(f"{run_dir}'s head does not score {features.path}'s pooled rows; {retrain}")
    x = torch.as_tensor(rows_x, dtype=torch.float32)
    if head.get("features_transform"):  # a --search probe head scores unit rows
        x = torch.nn.functional.normalize(x, dim=1)
    with torch.no_grad():
        scores = torch.sigmoid(torch.matmul(x, weight.t().contiguous()[None]) + bias.view(1, 1, -1))
    clean = labels.test.clean
    targets = (clean[rows] if clean is not None else labels.test.observed[rows] == 1)
    found = TestScores([int(head.get("seed", document["selection"].get("seed", 0)))],
                       scores.numpy().astype(np.float32, copy=False),
                       np.asarray(targets, dtype=np.uint8), rows.astype(np.int64),
                       list(labels.classes), labels.sha256,
                       source="computed again from best.pt and the features file")
    found.notes += _notes(run_dir, document, found)
    return found


def _test_split(labels_path: Path, features_path: Path
                ) -> tuple[LabelSet, FeatureFile, np.ndarray, np.ndarray]:
    """The labels, the features file, its readable test rows and their features; the last
    two files read are kept (a table or report scores many runs of one features file)."""
    key = tuple((str(p.resolve()), p.stat().st_mtime_ns) if p.is_file() else (str(p), 0)
                for p in (labels_path, features_path))
    if key not in _READ:
        labels = load_labels(labels_path, image_names=False)
        with open_features(features_path, labels) as features:
            rows = np.flatnonzero(~features.bad["test"])
            _READ[key] = (labels, features, rows,
                          np.ascontiguousarray(features.read("test")[rows]))
        while len(_READ) > 2:
            _READ.pop(next(iter(_READ)))
    return _READ[key]


#: the test splits read last (:func:`_test_split`)
_READ: dict[tuple, tuple[LabelSet, FeatureFile, np.ndarray, np.ndarray]] = {}


def _input_path(run_dir: Path, document: dict, key: str) -> Path:
    """The recorded labels or features file, or the file of that name in the run's dataset
    folder (a cache moved since the run)."""
    recorded = Path(str((document.get(key) or {}).get("path", "")))
    if recorded.is_file():
        return recorded
    here = run_dir.resolve().parents[2] / recorded.name  # <dataset>/runs/<loss>/<run-id>
    return here if recorded.name and here.is_file() else recorded


def _notes(run_dir: Path, document: dict, found: TestScores) -> list[str]:
    notes = []
    seeds = len(document.get("seeds") or [None])
    if seeds > 1:
        notes.append(f"{run_dir}: only seed {found.seeds[0]}'s test scores (the run predates "
                     f"{'test-scores.h5'} and best.pt keeps the best of its "
                     f"{plural(seeds, 'seed')}): its interval covers that seed's test images")
    recorded = (document.get("selection") or {}).get("test_ap_per_class") or {}
    if recorded:
        import torch

        from featcache.metrics import average_precision

        ap = average_precision(torch.from_numpy(found.scores[0]),
                               torch.from_numpy(found.targets)).numpy() * 100
        ours = np.array([recorded.get(name, np.nan) for name in found.classes])
        if not np.allclose(ap, ours, rtol=0, atol=AGREEMENT, equal_nan=False):
            notes.append(f"{run_dir}: the test scores computed again give mAP {ap.mean():.4f}, "
                         f"the run recorded {ours.mean():.4f} (another machine's arithmetic)")
    return notes


def read_test_scores(run_dir: Path, document: dict) -> TestScores:
    """The run's test scores: its ``test-scores.h5``, else (a stage-two run made before the
    file existed) its best seed's scores computed again from ``best.pt`` and the features file;
    :class:`NoScores` saying why when neither can be had."""
    try:
        return read_stored_scores(run_dir, document)
    except NoScoresFile:
        if document.get("stage", "linear") != "linear":
            raise
    return rescore_linear_run(Path(run_dir), document)
