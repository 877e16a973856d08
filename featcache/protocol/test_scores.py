"""The test scores of a run's selected heads: ``test-scores.h5`` beside ``results.json``.

An interval of a run's test mAP, or a comparison of two runs on the same resampled images,
needs each selected head's scores on every test image, which neither ``results.json`` (per-class
AP only) nor ``best.pt`` (the best seed's head alone; for stage three, a network that must be
run over the images again) gives cheaply. So both stages keep them when a run finishes:

- ``/scores`` float32 (S, N, L): the probabilities (zero-shot: cosines) of each seed's selected
  configuration at its selected epoch on the N test rows, exactly the numbers its test AP was
  computed from (stage two scores each seed's selected head again, with the kernel its
  evaluation ran; stage three keeps the best epoch's test probabilities in ``best.pt`` as it
  goes);
- ``/seeds`` (S,), ``/rows`` (N,): the rows of the labels file's test split scored (unreadable
  images dropped), ``/targets`` uint8 (N, L): the labels the AP was computed against;
- attributes: format and version, stage, loss, dataset, classes, the labels file's sha256 and
  the run's settings fingerprint (a file left from another run is not read).

A stage-two run made before this file existed gets its best seed's scores computed again from
``best.pt`` and the features file (:mod:`featcache.protocol.rescore`); what cannot be had says
why (:class:`NoScores`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from featcache.errors import InputError
from featcache.hdf5 import DatasetSpec, check_layout, decode_attrs, encode_attr, write_hdf5_atomic
from featcache.protocol.runs import rerun_advice

SCORES_FILE = "test-scores.h5"
SCORES_FORMAT = "featcache-test-scores"
SCORES_VERSION = 1
#: the datasets of a test-scores file, their kinds and shapes
LAYOUT = {"scores": DatasetSpec("float", ("seeds", "test rows", "classes")),
          "seeds": DatasetSpec("integer", ("seeds",)),
          "rows": DatasetSpec("integer", ("test rows",)),
          "targets": DatasetSpec("number", ("test rows", "classes"))}


class NoScores(Exception):
    """A run whose test scores cannot be had; the message says why and what to do."""


class NoScoresFile(NoScores):
    """A run folder without ``test-scores.h5`` (a run made before featcache kept them)."""


@dataclass
class TestScores:
    """Each seed's test scores of one run, with the rows and labels they were scored on."""

    seeds: list[int]
    scores: np.ndarray  # (S, N, L) float32
    targets: np.ndarray  # (N, L) uint8
    rows: np.ndarray  # (N,) int64: rows of the labels file's test split
    classes: list[str]
    labels_sha256: str | None
    #: "stored" (test-scores.h5), or how they were made again for an older run
    source: str = "stored"
    notes: list[str] = field(default_factory=list)

    def of_seeds(self, seeds: Sequence[int]) -> list[np.ndarray]:
        """The (N, L) scores of each of ``seeds`` that this run holds, in that order."""
        index = {seed: i for i, seed in enumerate(self.seeds)}
        return [self.scores[index[seed]] for seed in seeds if seed in index]

    def same_images(self, other: TestScores) -> bool:
        """Whether ``other`` was scored on the same test rows against the same labels."""
        return (self.labels_sha256 == other.labels_sha256 and self.classes == other.classes
                and np.array_equal(self.rows, other.rows)
                and np.array_equal(self.targets, other.targets))


def write_test_scores(run_dir: Path, scores: np.ndarray, seeds: Sequence[int], targets,
                      rows, classes: Sequence[str], document: dict) -> Path:
    """Write ``test-scores.h5`` into ``run_dir`` atomically (replacing one that is there);
    ``document`` is the run's results document (its identity goes into the attributes)."""
    scores = np.asarray(scores, dtype=np.float32)
    if scores.ndim == 2:
        scores = scores[None]

    def fill(h5: h5py.File) -> None:
        h5.create_dataset("scores", data=scores)
        h5.create_dataset("seeds", data=np.asarray(list(seeds), dtype=np.int64))
        h5.create_dataset("rows", data=np.asarray(rows, dtype=np.int64))
        h5.create_dataset("targets", data=(np.asarray(targets) > 0).astype(np.uint8))
        identity = {"format": SCORES_FORMAT, "format_version": SCORES_VERSION,
                    "stage": document.get("stage"), "loss": document.get("loss"),
                    "dataset": document.get("dataset"),
                    "classes": list(classes),
                    "labels_sha256": (document.get("labels") or {}).get("sha256"),
                    "fingerprint": document.get("fingerprint")}
        for key, value in identity.items():
            if value is not None:
                h5.attrs[key] = encode_attr(value)

    return write_hdf5_atomic(Path(run_dir) / SCORES_FILE, fill, overwrite=True)


@contextmanager
def checked_scores_file(path: Path, run_dir: Path, fmt: str, version: int, layout: dict,
                        error: type[Exception], what: str) -> Iterator[tuple[h5py.File, dict]]:
    """A run's scores file (``test-scores.h5``, ``val-scores.h5``) open for reading, with its
    attributes, once its format, version and layout are checked; ``error`` says what is wrong
    otherwise, or that it could not be read."""
    try:
        with h5py.File(path, "r") as h5:
            attrs = decode_attrs(h5.attrs)
            if attrs.get("format") != fmt:
                raise error(f"{path} is not a featcache {what} file")
            if attrs.get("format_version") != version:
                raise error(f"{path} has format {attrs.get('format_version')}; this featcache "
                            f"reads {version}")
            try:
                check_layout(h5, layout, path, lambda: rerun_advice(Path(run_dir)))
            except InputError as exc:
                raise error(str(exc)) from None
            yield h5, attrs
    except OSError as exc:
        raise error(f"{path} could not be read (damaged?): {exc}") from exc


def read_stored_scores(run_dir: Path, document: dict) -> TestScores:
    """The run's ``test-scores.h5``; :class:`NoScores` when there is none, or one left from
    another run."""
    path = Path(run_dir) / SCORES_FILE
    if not path.is_file():
        raise NoScoresFile(f"{run_dir} has no {SCORES_FILE} (made before featcache kept test "
                           "scores)")
    with checked_scores_file(path, run_dir, SCORES_FORMAT, SCORES_VERSION, LAYOUT, NoScores,
                             "test-scores") as (h5, attrs):
        classes = attrs.get("classes", [])
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise NoScores(f"{path}: its classes attribute is not a list of class names; "
                           f"{rerun_advice(Path(run_dir))}")
        scores = TestScores([int(s) for s in h5["seeds"][()]], h5["scores"][()],
                            h5["targets"][()], h5["rows"][()], list(attrs.get("classes", [])),
                            attrs.get("labels_sha256"))
    if attrs.get("fingerprint") != document.get("fingerprint"):
        raise NoScores(f"{path} belongs to another run (its settings fingerprint differs from "
                       f"{Path(run_dir) / 'results.json'}'s)")
    return scores
