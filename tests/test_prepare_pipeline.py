"""The shared stage-zero pipeline: order of operations, seeds, options, and the CLI's help."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from dataset_fixtures import invoke

from featcache.cli import COMMANDS
from featcache.data.formats import SourceDataset, SourceSplit
from featcache.data.prepare import PrepareOptions, prepare_dataset
from featcache.data.sampling import observe_uniform, split_train_val
from featcache.errors import FeatcacheWarning, OptionError


def toy_source(train_rows=12, test_rows=7, seed=0):
    rng = np.random.RandomState(seed)
    train = (rng.rand(train_rows, 5) < 0.4).astype(np.uint8)
    train[train.sum(axis=1) == 0, 0] = 1
    train[3] = 0  # the one row without positives
    test = (rng.rand(test_rows, 5) < 0.4).astype(np.uint8)
    test[test.sum(axis=1) == 0, 2] = 1
    return SourceDataset(
        name="toy", source_format="npz", classes=list("abcde"),
        train=SourceSplit([f"train/{i:06d}" for i in range(train_rows)], train),
        test=SourceSplit([f"test/{i:06d}" for i in range(test_rows)], test),
        image_root=None, source_files=[])


def test_fresh_generator_per_matrix_after_dropping_rows(tmp_path):
    source = toy_source()
    result = prepare_dataset(source, tmp_path / "labels.h5", PrepareOptions(labels_only=True))
    kept = np.delete(np.arange(12), 3)
    assert result.kept["train"].tolist() == kept.tolist()
    labels = result.labels
    assert np.array_equal(labels.train.clean, source.train.clean[kept])
    # each official matrix is observed by its own RandomState(1200), whatever the other holds
    assert np.array_equal(labels.train.observed, observe_uniform(source.train.clean[kept]))
    assert np.array_equal(labels.test.observed, observe_uniform(source.test.clean))
    train, val = split_train_val(11)
    assert np.array_equal(labels.train_index, train) and np.array_equal(labels.val_index, val)
    assert result.provenance["counts"]["split"] == {"train": 9, "val": 2}
    assert len(labels.sha256) == 64


def test_seeds_and_observation_options_are_used_and_recorded(tmp_path):
    options = PrepareOptions(labels_only=True, num_pos=2, num_neg=1, obs_seed=7, split_seed=3)
    result = prepare_dataset(toy_source(), tmp_path / "labels.h5", options)
    clean = toy_source().train.clean[np.delete(np.arange(12), 3)]
    assert np.array_equal(result.labels.train.observed,
                          observe_uniform(clean, num_pos=2, num_neg=1, seed=7))
    assert np.array_equal(result.labels.val_index, split_train_val(11, seed=3)[1])
    prov = result.provenance
    assert (prov["num_pos"], prov["num_neg"], prov["obs_seed"], prov["split_seed"]) == (2, 1, 7, 3)


@pytest.mark.parametrize("options, message", [
    (PrepareOptions(labels_only=True, num_pos=0), "--num-pos 0 would observe no positive"),
    (PrepareOptions(labels_only=True, num_neg=-3), "--num-neg must be -1"),
    (PrepareOptions(), "toy has no image folder; use --labels-only"),
])
def test_option_errors(tmp_path, options, message):
    with pytest.raises(OptionError, match=message):
        prepare_dataset(toy_source(), tmp_path / "labels.h5", options)
    assert not (tmp_path / "labels.h5").exists()


def test_notify_reports_dropped_rows(tmp_path):
    messages = []
    prepare_dataset(toy_source(), tmp_path / "labels.h5", PrepareOptions(labels_only=True),
                    notify=messages.append)
    assert messages == ["train: dropped 1 of 12 images with no positive label (train/000003)"]


@pytest.mark.parametrize("args", [["prepare"], ["prepare", "voc"], ["prepare", "coco"],
                                  ["prepare", "cub"], ["prepare", "nuswide"], ["prepare", "csv"],
                                  ["prepare", "features"], ["prepare", "shapes"], ["info"]])
def test_every_command_has_help(args):
    result = invoke(*args, "--help")
    assert result.exit_code == 0
    assert "Usage: featcache " + " ".join(args) in result.output
    assert COMMANDS[args[0]][1].split(":")[0] in invoke("--help").output


def test_a_class_without_a_training_positive_is_warned_and_recorded(tmp_path):
    source = toy_source()
    train_rows, _ = split_train_val(11)
    kept = np.delete(np.arange(12), 3)
    source.train.clean[:, 4] = 0  # class e: no positive anywhere in the official train split
    source.train.clean[kept[train_rows[0]], 4] = 0
    val_only = kept[np.setdiff1d(np.arange(11), train_rows)][0]
    source.train.clean[kept[train_rows], 3] = 0  # class d: positives in the validation rows only
    source.train.clean[val_only, 3] = 1
    source.train.clean[source.train.clean.sum(axis=1) == 0, 0] = 1
    source.train.clean[3] = 0
    with pytest.warns(FeatcacheWarning) as caught:
        result = prepare_dataset(source, tmp_path / "labels.h5", PrepareOptions(labels_only=True))
    messages = [str(w.message) for w in caught]
    assert any("2 of 5 classes have no positive among the 9 training images (d, e)" in m
               for m in messages), messages
    assert result.provenance["classes_without_train_positive"] == ["d", "e"]


def test_every_class_with_a_training_positive_gives_no_warning(tmp_path):
    source = toy_source(train_rows=40)
    source.train.clean[:] = np.eye(5, dtype=np.uint8)[np.arange(40) % 5]  # one positive per row
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatcacheWarning)
        result = prepare_dataset(source, tmp_path / "labels.h5", PrepareOptions(labels_only=True))
    assert result.provenance["classes_without_train_positive"] == []


def test_a_class_whose_positives_are_never_observed_is_warned(tmp_path):
    source = toy_source(train_rows=40)
    source.train.clean[:] = np.eye(5, dtype=np.uint8)[np.arange(40) % 4]
    source.train.clean[:2] = 1  # e: positive in two rows only, each with four other positives
    with pytest.warns(FeatcacheWarning, match="no observed positive") as caught:
        result = prepare_dataset(source, tmp_path / "labels.h5", PrepareOptions(labels_only=True))
    train = result.labels.train.observed[result.labels.train_index]
    assert (train[:, 4] == 1).sum() == 0 and (train[:, :4] == 1).sum(axis=0).min() > 0
    notes = [str(w.message) for w in caught if "no observed positive" in str(w.message)]
    assert notes == ["1 of 5 classes has positives but no observed positive among the 32 "
                     "training images (e): the single-positive losses never see it as positive"]
