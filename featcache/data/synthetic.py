"""A labels file for a folder of generated images: what stage-one tests and benchmarks run on.

Not a dataset (``featcache prepare shapes`` is the embedded one): the labels are random, drawn
only so that the file is valid (every row has a positive; the protocol's observation and
train/val split are applied as in ``featcache prepare``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from featcache.data.labelfile import LabelSet, SplitLabels, write_labels
from featcache.data.sampling import observe_uniform, split_train_val


def write_image_labels(path: str | os.PathLike, train_images: list[str], test_images: list[str],
                       image_root: str, dataset: str = "toy", num_classes: int = 3,
                       seed: int = 0, overwrite: bool = False) -> Path:
    """Write a labels file listing ``train_images`` and ``test_images`` (relative to
    ``image_root``) with random labels; returns its path."""
    rng = np.random.RandomState(seed)
    total = len(train_images) + len(test_images)
    clean = rng.randint(0, 2, size=(total, num_classes)).astype(np.uint8)
    clean[np.arange(total), rng.randint(0, num_classes, total)] = 1
    n_train = len(train_images)
    train_index, val_index = split_train_val(n_train)
    labels = LabelSet(
        dataset=dataset, classes=[f"class{c}" for c in range(num_classes)],
        train=SplitLabels(np.array(train_images, dtype=object), observe_uniform(clean[:n_train]),
                          clean[:n_train]),
        test=SplitLabels(np.array(test_images, dtype=object), observe_uniform(clean[n_train:]),
                         clean[n_train:]),
        train_index=train_index, val_index=val_index, image_root=str(image_root),
        provenance={"source_format": "generated images (featcache.data.synthetic)"},
    )
    return write_labels(labels, path, overwrite=overwrite)
