"""``benchmarks.linear_kernels``: every kernel row is timed, and the bit comparison is real.

Speed is never asserted here; the rows' shapes are, and that an alternative said to give the
trainer's bits does (recomputed), while one with other bits is reported as such.
"""

from __future__ import annotations

import torch
from linear_fixtures import synthetic_dataset

from benchmarks.linear_kernels import (
    HEADS,
    group_training,
    same_bits,
    scoring_kernels,
    step_kernels,
)
from featcache.linear.data import load_linear_data


def test_every_step_kernel_and_variant_gets_a_time_and_a_bit_verdict():
    features = torch.rand(64, 32, generator=torch.Generator().manual_seed(0))
    rows = step_kernels(features, classes=5, batch=8, steps=3, repeats=1)
    assert [(r["kernel"], r["variant"].split(",")[0]) for r in rows] == [
        ("forward", "bmm"), ("forward", "mm"), ("weight gradient", "bmm"),
        ("weight gradient", "mm"), ("weight gradient", "bmm"), ("Adam", "fused")]
    assert all(r["rows"] == 8 and r["microseconds"] > 0 for r in rows)
    # the trainer's own kernels carry no verdict; every alternative carries one
    assert [r["same_bits_as_trainer"] is None for r in rows] == [True, False, True, False, False, True]
    assert all(isinstance(r["same_bits_as_trainer"], bool) for r in rows if "(H, L, D)" in r["variant"])


def test_the_scoring_rows_compare_four_epochs_at_once_with_one():
    features = torch.rand(40, 16, generator=torch.Generator().manual_seed(1))
    one, four = scoring_kernels(features, classes=3, repeats=1)
    assert (one["rows"], four["rows"]) == (40, 40)
    assert one["same_bits_as_trainer"] is None and isinstance(four["same_bits_as_trainer"], bool)


def test_same_bits_is_bit_for_bit():
    a = torch.ones(HEADS, 2)
    assert same_bits([(a, a.clone())])
    assert not same_bits([(a, a + 1e-7)]), "a last-bit difference is a difference"


def test_a_whole_group_of_the_default_search_is_timed_per_step(tmp_path):
    data = load_linear_data(*synthetic_dataset(tmp_path))
    (row,) = group_training(data, batch=8)
    assert row["kernel"] == "group training, 4 heads x 25 epochs"
    steps = 25 * (len(data.train) // 8)
    assert row["variant"].startswith(f"{steps} steps: ") and row["microseconds"] > 0
