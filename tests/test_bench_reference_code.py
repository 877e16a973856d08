"""``benchmarks.reference_code``: the authors' loop runs from a clone, on our data in their layout.

A stand-in clone (a ``train.py`` with the two functions the benchmark calls) checks what the
real one would read: the files, their shapes and values, relative to the working directory.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from linear_fixtures import synthetic_dataset

from benchmarks.reference_code import authors_config_epochs, write_reference_layout
from featcache.linear.data import load_linear_data

STAND_IN = '''
import json, os, numpy as np

class Model:
    def to(self, device):
        return self

def initialize_training_run(P, feature_extractor, linear_classifier, estimated_labels):
    assert np.Inf == np.inf  # the alias the real code spells
    base = "data/pascal"  # relative, as the real loader reads it
    shapes = {name: list(np.load(os.path.join(base, name)).shape) for name in sorted(os.listdir(base))}
    obs = np.load(os.path.join(base, "formatted_train_labels_obs.npy"))
    feats = np.load(P["train_feats_file"])
    with open("seen.json", "w") as f:
        json.dump({"shapes": shapes, "obs_values": sorted(np.unique(obs).tolist()),
                   "feats_dtype": str(feats.dtype), "P": {k: P[k] for k in ("bsize", "num_epochs", "loss", "use_feats")}}, f)
    return P, {"device": "cpu", "datasets": {"train": range(4), "val": range(1), "test": range(2)}}, Model()

def train(model, P, Z):
    return P, model, None, None, None
'''


def test_the_authors_loop_runs_from_a_clone_on_our_data_in_their_layout(tmp_path):
    labels, features = synthetic_dataset(tmp_path)
    data = load_linear_data(labels, features)
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "train.py").write_text(STAND_IN)
    root = write_reference_layout(data, tmp_path / "layout")

    seconds = authors_config_epochs(clone, root, bsize=8, epochs=2, loss="an-ls")

    assert seconds >= 0.0
    seen = json.loads((root / "seen.json").read_text())
    official_train, test = len(data.train) + len(data.val), len(data.test)
    classes, dim = data.num_classes, data.feature_dim
    assert seen["shapes"] == {
        "formatted_train_images.npy": [official_train],
        "formatted_train_labels.npy": [official_train, classes],
        "formatted_train_labels_obs.npy": [official_train, classes],
        "formatted_val_images.npy": [test],
        "formatted_val_labels.npy": [test, classes],
        "formatted_val_labels_obs.npy": [test, classes],
        "train_features_imagenet_resnet50.npy": [official_train, dim],
        "val_features_imagenet_resnet50.npy": [test, dim]}
    assert seen["obs_values"] == [0.0, 1.0]
    assert seen["feats_dtype"] == "float32"
    assert seen["P"] == {"bsize": 8, "num_epochs": 2, "loss": "an_ls", "use_feats": True}
    saved = np.load(root / "data" / "pascal" / "val_features_imagenet_resnet50.npy")
    np.testing.assert_array_equal(saved, data.test.features.numpy())


def test_a_failing_reference_run_says_what_failed(tmp_path):
    labels, features = synthetic_dataset(tmp_path)
    root = write_reference_layout(load_linear_data(labels, features), tmp_path / "layout")
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "train.py").write_text("raise ImportError('not the authors code')\n")
    with pytest.raises(RuntimeError, match="(?s)the reference code failed.*not the authors code"):
        authors_config_epochs(clone, root, bsize=8, epochs=1)
