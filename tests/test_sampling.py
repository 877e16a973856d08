"""The protocol's single-positive sampler and train/val split, on hand-worked cases and real VOC."""

from __future__ import annotations

import numpy as np
import pytest

from featcache.data.sampling import observe_uniform, rows_without_positive, split_train_val
from featcache.errors import InputError

# Three rows, four classes. With a fresh RandomState(1200), the reference walks the rows in
# order, shuffling first the positives, then the negatives of each row. The shuffled orders
# are: row 0 positives [0, 3, 1], negatives [2]; row 1 positives [1], negatives [2, 3, 0];
# row 2 positives [0, 3, 2], negatives [1].
SMALL = np.array([[1, 1, 0, 1],
                  [0, 1, 0, 0],
                  [1, 0, 1, 1]], dtype=np.uint8)


def test_one_positive_per_row_matches_the_reference_draws():
    assert observe_uniform(SMALL).tolist() == [[1, 0, 0, 0],
                                               [0, 1, 0, 0],
                                               [1, 0, 0, 0]]


def test_negatives_are_shuffled_even_when_none_are_observed():
    # Skipping the shuffle of row 1's negatives ([0, 2, 3] has three entries, so it draws)
    # would change row 2's draw to class 2: the reference consumes those draws.
    assert observe_uniform(SMALL, num_pos=1, num_neg=0)[2].tolist() == [1, 0, 0, 0]


def test_one_observed_negative_per_row():
    assert observe_uniform(SMALL, num_pos=1, num_neg=1).tolist() == [[1, 0, -1, 0],
                                                                     [0, 1, -1, 0],
                                                                     [1, -1, 0, 0]]


def test_two_positives_per_row_keep_the_first_two_shuffled():
    assert observe_uniform(SMALL, num_pos=2).tolist() == [[1, 0, 0, 1],
                                                          [0, 1, 0, 0],
                                                          [1, 0, 0, 1]]


def test_all_positives_and_all_negatives():
    assert observe_uniform(SMALL, num_pos=-1, num_neg=0).tolist() == SMALL.tolist()
    full = observe_uniform(SMALL, num_pos=-1, num_neg=-1)
    assert full.tolist() == [[1, 1, -1, 1], [-1, 1, -1, -1], [1, -1, 1, 1]]


def test_more_negatives_than_a_row_has_keeps_them_all():
    observed = observe_uniform(SMALL, num_pos=1, num_neg=3)
    assert (observed == -1).sum(axis=1).tolist() == [1, 3, 1]


def test_a_row_with_a_single_positive_always_observes_it():
    labels = np.eye(5, dtype=np.uint8)
    for seed in (0, 1, 1200):
        assert observe_uniform(labels, seed=seed).tolist() == labels.tolist()


def test_another_matrix_literal_draws():
    labels = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=np.uint8)
    assert observe_uniform(labels).tolist() == [[0, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]]
    assert observe_uniform(labels, num_neg=2).tolist() == [[0, 0, 0, 0, 1, -1],
                                                           [1, 0, 0, 0, -1, -1]]


def test_fresh_generator_per_call_and_seed_matters():
    labels = (np.random.RandomState(5).rand(200, 12) < 0.4).astype(np.uint8)
    labels[labels.sum(axis=1) == 0, 0] = 1
    first = observe_uniform(labels)
    assert np.array_equal(first, observe_uniform(labels))
    assert not np.array_equal(first, observe_uniform(labels, seed=1201))
    assert first.dtype == np.int8


def test_bad_matrices_are_refused_with_the_row():
    with pytest.raises(InputError, match="row 1, class 2 holds 2"):
        observe_uniform(np.array([[1, 0, 0], [0, 1, 2]]))
    with pytest.raises(InputError, match="1 row has no positive label .*row 1"):
        observe_uniform(np.array([[1, 0], [0, 0]]))
    with pytest.raises(InputError, match="2-D"):
        observe_uniform(np.array([1, 0]))
    with pytest.raises(InputError, match="num_pos and num_neg"):
        observe_uniform(SMALL, num_pos=-2)


def test_rows_without_positive():
    assert rows_without_positive(np.array([[0, 0], [1, 0], [0, 0]])).tolist() == [0, 2]


def test_split_hand_worked():
    # RandomState(1200).permutation(10) is [9, 4, 6, 1, 8, 5, 2, 0, 7, 3]; round(0.2 * 10) = 2
    # rows go to validation: the last two of the permutation, sorted.
    train, val = split_train_val(10)
    assert train.tolist() == [0, 1, 2, 4, 5, 6, 8, 9]
    assert val.tolist() == [3, 7]


def test_split_sizes_and_disjointness():
    train, val = split_train_val(5717)
    assert (train.size, val.size) == (4574, 1143)
    assert np.intersect1d(train, val).size == 0
    assert np.array_equal(np.union1d(train, val), np.arange(5717))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)
    again_train, again_val = split_train_val(5717)
    assert np.array_equal(train, again_train) and np.array_equal(val, again_val)


def test_split_refuses_impossible_sizes():
    with pytest.raises(InputError, match="cannot split 1"):
        split_train_val(1)
    with pytest.raises(InputError, match="empty split"):
        split_train_val(2, val_fraction=0.1)


@pytest.mark.shared_data
def test_real_voc2012_train_matrix(shared_data):
    labels = np.load(shared_data / "voc2012_labels" / "voc2012_train_labels.npy")
    assert labels.shape == (5717, 20)
    observed = observe_uniform(labels)
    assert ((observed == 1).sum(axis=1) == 1).all()
    assert (labels[observed == 1] == 1).all()
    assert not (observed == -1).any()
    assert np.array_equal(observed, observe_uniform(labels))
    train, val = split_train_val(len(labels))
    assert (train.size, val.size) == (4574, 1143)
