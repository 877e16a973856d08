"""Small labels + features files for stage-two tests (no images needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featcache.data.featurewrite import write_features
from featcache.data.labelfile import LabelSet, SplitLabels, load_labels, write_labels
from featcache.data.sampling import observe_uniform, split_train_val


def synthetic_dataset(root: Path, name: str = "toy", n_train: int = 120, n_test: int = 60,
                      classes: int = 5, dim: int = 16, seed: int = 0,
                      clean_train: bool = True, absent_in_test: tuple[int, ...] = ()
                      ) -> tuple[Path, Path]:
    """``<root>/<name>/labels.h5`` and ``features-toy.h5`` with learnable features.

    Labels have 1 to 3 positives per row; features are a noisy linear image of the labels.
    Classes in ``absent_in_test`` have no positive in the test split (a row left without any
    positive gets class 0 instead).
    """
    rng = np.random.default_rng(seed)

    def labels(n):
        y = np.zeros((n, classes), dtype=np.uint8)
        for row in y:
            row[rng.choice(classes, size=rng.integers(1, 4), replace=False)] = 1
        return y

    y_train, y_test = labels(n_train), labels(n_test)
    for column in absent_in_test:
        y_test[:, column] = 0
    y_test[y_test.sum(axis=1) == 0, 0] = 1
    basis = rng.standard_normal((classes, dim)).astype(np.float32)

    def features(y):
        return (y @ basis + 0.7 * rng.standard_normal((len(y), dim))).astype(np.float32)

    train_idx, val_idx = split_train_val(n_train)
    observed = observe_uniform(y_train)
    label_set = LabelSet(
        dataset=name, classes=[f"c{i}" for i in range(classes)],
        train=SplitLabels(np.array([f"train/{i:04d}" for i in range(n_train)], dtype=object),
                          observed, y_train if clean_train else None),
        test=SplitLabels(np.array([f"test/{i:04d}" for i in range(n_test)], dtype=object),
                         observe_uniform(y_test), y_test),
        train_index=train_idx, val_index=val_idx,
        provenance={} if clean_train else {"k": float(y_train.sum(1).mean())},
    )
    labels_path = root / name / "labels.h5"
    write_labels(label_set, labels_path, overwrite=True)
    loaded = load_labels(labels_path)
    features_path = root / name / "features-toy.h5"
    write_features(features_path, loaded, {"train": features(y_train), "test": features(y_test)},
                   {"backbone": "toy", "weights": "none"}, overwrite=True)
    return labels_path, features_path


def pseudo_label_sets(labels_path: Path, names=("vlpl", "aevlp"), seed: int = 0) -> None:
    """Pseudo-label files beside a labels file, one per name (no vision-language model needed):
    a seeded mix of 1, 0 and -1, so that every term of the losses that use them is exercised."""
    from featcache.data.pseudofile import pseudo_labels_path, write_pseudo_labels

    labels = load_labels(labels_path)
    rng = np.random.default_rng(seed)
    for name in names:
        matrix = rng.choice([-1, 0, 0, 1], size=(len(labels.train), labels.num_classes))
        write_pseudo_labels(pseudo_labels_path(labels_path, name), labels, matrix.astype(np.int8),
                            {"name": name, "rule": name}, overwrite=True)


def spatial_features_file(labels_path: Path, shape: tuple[int, int, int] = (2, 2, 6),
                          seed: int = 0, backbone: str = "toy", dtype: str = "float16") -> Path:
    """``spatial-<backbone>.h5`` beside ``labels_path``, in the spatial-cache layout (rows of
    (h, w, D) maps in C order; ``layout`` and ``spatial_shape`` attributes), written with
    ``write_features`` directly: each class lights up at one position of its own, so a map
    carries more than its average (what BoostLU's heads look at)."""
    labels = load_labels(labels_path)
    height, width, dim = shape
    positions = height * width
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((labels.num_classes, dim)).astype(np.float32)
    where = rng.integers(0, positions, size=labels.num_classes)

    def maps(clean):
        rows = 0.5 * rng.standard_normal((len(clean), positions, dim)).astype(np.float32)
        for c in range(labels.num_classes):
            rows[clean[:, c] == 1, where[c]] += 2.0 * basis[c]
        return rows.reshape(len(clean), positions * dim)

    path = labels_path.parent / f"spatial-{backbone}.h5"
    write_features(path, labels, {"train": maps(labels.train.clean), "test": maps(labels.test.clean)},
                   {"backbone": backbone, "weights": "none", "layout": "spatial",
                    "spatial_shape": [height, width, dim]}, overwrite=True, dtype=dtype)
    return path


def assert_stacked_adam_matches(heads, adam, references, x, y, steps: int = 20) -> None:
    """Train the stacked ``heads`` with ``adam`` and each reference (layer, torch optimizer)
    pair on the same BCE loss for ``steps`` steps; each head must end equal to its reference."""
    import torch

    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            heads(x), y.expand(len(references), -1, -1), reduction="none").mean(dim=(1, 2)).sum()
        adam.step(torch.autograd.grad(loss, heads.parameters()))
        for layer, optimizer in references:
            optimizer.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(layer(x), y).backward()
            optimizer.step()
    for h, (layer, _) in enumerate(references):
        weight, bias = heads.head(h)
        torch.testing.assert_close(weight, layer.weight.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bias, layer.bias.detach(), rtol=1e-5, atol=1e-6)


def every_kind_of_data(root: Path):
    """Small data every shipped loss can train on: the pooled features with two pseudo-label
    sets beside the labels, and a spatial file of (2, 2, 4) maps; both loaded for stage two."""
    from featcache.linear.data import load_linear_data

    labels, features = synthetic_dataset(root, n_train=80, n_test=32, classes=4, dim=8)
    pseudo_label_sets(labels)
    spatial = spatial_features_file(labels, shape=(2, 2, 4))
    return load_linear_data(labels, features), load_linear_data(labels, spatial)

