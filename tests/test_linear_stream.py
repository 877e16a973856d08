"""Out-of-core stage two: the memory budget, the placement plan, streamed epochs and runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.data.featurefile import load_features, open_features
from featcache.data.featurewrite import write_features
from featcache.data.labelfile import load_labels
from featcache.errors import InputError, OptionError
from featcache.heads import LinearHeads
from featcache.linear.data import load_linear_data, split_rows
from featcache.linear.engine.search import SearchSpec, run_search
from featcache.linear.memory import (
    MIN_BLOCK_ROWS,
    PROCESS_BYTES,
    GroupShape,
    SplitSizes,
    format_size,
    parse_size,
    plan_placement,
)
from featcache.linear.stream import StreamedRows, load_streamed_data
from featcache.protocol.runs import load_results

FAST = ("--epochs", "2", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots")
GB = 1 << 30


@pytest.mark.parametrize(("text", "size"), [("4GB", 4 * GB), ("4g", 4 * GB), ("1.5GiB", 3 * GB // 2),
                                            ("512MB", 512 << 20), ("2048", 2048), ("64 kb", 64 << 10)])
def test_memory_sizes_are_parsed_in_powers_of_1024(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "4XB", "-1G", "0"])
def test_a_bad_memory_size_names_the_option(text):
    with pytest.raises(OptionError, match="--max-memory"):
        parse_size(text)


def test_the_plan_keeps_what_fits_and_streams_train_then_val_then_test():
    sizes = SplitSizes(train=800_000, val=200_000, test=100_000, classes=20, dim=2048)
    group = GroupShape(heads=4)
    roomy = plan_placement(sizes, 2, 1024, group, 2, 64 * GB, 400 << 20)
    assert roomy.in_memory and roomy.estimate < 64 * GB * 0.9
    tight = plan_placement(sizes, 2, 1024, group, 2, 5 * GB, 400 << 20)
    assert tight.streamed == ("train", "val") and tight.window_blocks >= 1
    assert tight.estimate <= 5 * GB * 0.9 and tight.block_rows % 1024 == 0
    tighter = plan_placement(sizes, 2, 1024, group, 2, int(3.7 * GB), 400 << 20)  # window >= 8 first
    assert tighter.streamed == ("train", "val", "test")
    assert "streaming" in tighter.describe() and format_size(int(3.7 * GB)) in tighter.describe()
    fewer = plan_placement(sizes, 2, 1024, group, 2, 2 * GB, 400 << 20)  # not with 2 workers
    assert fewer.jobs == 1 and fewer.estimate <= 2 * GB * 0.9 and "1 process" in fewer.describe()
    with pytest.raises(OptionError, match="too small.*--max-memory"):
        plan_placement(sizes, 2, 1024, group, 2, 600 << 20, 400 << 20)
    forced = plan_placement(sizes, 2, 1024, group, 2, 64 * GB, 400 << 20, force_stream=True)
    assert forced.streamed == ("train",) and forced.forced and "as asked" in forced.describe()


def test_one_configuration_of_a_2_gb_file_plans_under_256_mb():
    # 250,000 x 2,048 float32 (2 GB; 80 % train of which 20 % val): one head, one group;
    # nothing held yet beyond the interpreter. (The labels and
    # predictions grow with the rows: 1M rows need about 330 MB even so.)
    for rows in (250_000,):
        train = int(rows * 0.8)
        sizes = SplitSizes(train=train * 4 // 5, val=train // 5, test=rows - train, classes=20,
                           dim=2048)
        plan = plan_placement(sizes, 4, 1024, GroupShape(heads=1), 1, 256 << 20, 0)
        assert plan.jobs == 0  # as asked: one process, no worker
        assert plan.streamed and plan.estimate <= 256 * (1 << 20) * 0.9
        assert plan.block_rows * plan.window_blocks >= 1024  # a window of several blocks remains


def test_the_default_grid_plans_under_1_gb_on_a_million_rows():
    sizes = SplitSizes(train=640_000, val=160_000, test=200_000, classes=20, dim=2048)
    plan = plan_placement(sizes, 2, 512, GroupShape(heads=4), 2, 1 * GB, 0)
    assert plan.streamed and plan.estimate <= 1 * GB * 0.9
    assert plan.record()["window_rows"] == min(plan.block_rows * plan.window_blocks, 640_000)


def test_blocks_shrink_with_the_budget_down_to_the_floor_of_state_plus_one_block():
    sizes = SplitSizes(train=100_000, val=25_000, test=30_000, classes=20, dim=2048)
    group = GroupShape(heads=1)
    roomy = plan_placement(sizes, 4, 1024, group, 1, 64 * GB, 0, force_stream=True)
    assert roomy.block_rows == 4096  # 32 MB blocks of 1,024-row chunks
    assert roomy.window_rows == 100_000 and "full shuffle" in roomy.shuffle_note()
    small = plan_placement(sizes, 4, 1024, group, 1, 180 << 20, 0)
    assert small.block_rows < 4096 and small.estimate <= (180 << 20) * 0.9
    with pytest.raises(OptionError, match="too small") as refused:
        plan_placement(sizes, 4, 1024, group, 1, 64 << 20, 0)
    needed = float(str(refused.value).split("needs about ")[1].split(" MB")[0])
    # the floor: labels, one group's state, and blocks of MIN_BLOCK_ROWS rows (the one being
    # read and its float32 copy, a window of one read and joined with the rows carried over,
    # the main process's read) with their scores, and what the process holds besides
    floor = (PROCESS_BYTES + 2 * 155_000 * 20 + group.bytes(sizes) + MIN_BLOCK_ROWS * 2048 * 4 * 5
             + 2 * MIN_BLOCK_ROWS * 20 * 4)
    assert needed == pytest.approx(floor / 0.9 / (1 << 20), abs=0.1)
    just = plan_placement(sizes, 4, 1024, group, 1, int(floor / 0.9) + (1 << 20), 0)
    assert just.window_blocks >= 1 and just.jobs == 0


@pytest.fixture
def files(tmp_path):
    return synthetic_dataset(tmp_path, n_train=300, n_test=90, dim=12)


def streamed_train(files, block_rows=16, window=3):
    labels = load_labels(files[0])
    features = open_features(files[1], labels)
    parts, _ = split_rows(labels, features)
    return StreamedRows(features, parts["train"], block_rows, window), parts["train"], features


def test_a_streamed_epoch_sees_every_row_once_in_windows_of_blocks(files):
    rows, part, features = streamed_train(files)
    all_features = torch.from_numpy(features.read("train"))[torch.from_numpy(part.rows)]
    batch_size = 7
    seen, windows_per_batch = [], []
    block_of = torch.from_numpy(part.rows // 16)
    for index, x in rows.epoch(torch.Generator().manual_seed(0), batch_size):
        assert x.dtype == torch.float32 and torch.equal(x, all_features[index])
        seen.append(index)
        windows_per_batch.append(len(set(block_of[index].tolist())))
    seen = torch.cat(seen)
    assert len(seen) == len(part.rows) // batch_size * batch_size  # the protocol's step count
    assert len(set(seen.tolist())) == len(seen)  # no row twice
    # a batch mixes rows of one window of 3 blocks (plus leftovers carried from the last one)
    assert max(windows_per_batch) <= 6


def test_streamed_epochs_are_seeded_and_differ_between_epochs(files):
    rows, _, _ = streamed_train(files)

    def order(generator):
        return torch.cat([index for index, _ in rows.epoch(generator, 8)])

    first = torch.Generator().manual_seed(3)
    again = torch.Generator().manual_seed(3)
    epoch_one = order(first)
    assert torch.equal(epoch_one, order(again))
    assert not torch.equal(epoch_one, order(first))  # the next epoch draws anew


def test_streamed_scores_equal_in_memory_scores(files):
    rows, part, features = streamed_train(files)
    head = LinearHeads.create(12, 5, [torch.Generator().manual_seed(s) for s in (1, 2)])
    in_memory = torch.from_numpy(features.read("train")[part.rows]).float()
    torch.testing.assert_close(rows.scores(head), head.scores(in_memory), rtol=1e-5, atol=1e-6)


def test_a_streamed_search_trains_close_to_the_in_memory_one(files):
    labels = load_labels(files[0])
    memory = load_linear_data(*files)
    features = open_features(files[1], labels)
    placement = plan_placement(SplitSizes(len(memory.train), len(memory.val), len(memory.test),
                                          5, 12), 4, 16, GroupShape(2), 1, 64 * GB, 0,
                               force_stream=True)
    streamed = load_streamed_data(labels, features, placement)
    assert streamed.feature_dim == 12 and len(streamed.train) == len(memory.train)
    assert torch.equal(streamed.val.features, memory.val.features)  # val and test stay in memory
    spec = SearchSpec(loss="an", learning_rates=(1e-2, 1e-3), batch_sizes=(8,), epochs=3)
    a = run_search(memory, spec, progress=False).selected.best
    b = run_search(streamed, spec, progress=False).selected.best
    assert abs(a.test_map - b.test_map) < 5.0  # one block: a full shuffle by other draws


def test_train_linear_stream_records_how_it_read_the_features(cache_dir):
    synthetic_dataset(cache_dir)
    plain = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "m", *FAST)
    assert plain.exit_code == 0, plain.output
    streamed = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "s",
                      "--stream", "--max-memory", "8GB", *FAST)
    assert streamed.exit_code == 0, streamed.output
    assert "streaming the train features" in streamed.output
    memory_doc = load_results(cache_dir / "toy" / "runs" / "an" / "m")
    stream_doc = load_results(cache_dir / "toy" / "runs" / "an" / "s")
    assert "streaming" not in memory_doc["settings"]
    assert stream_doc["settings"]["streaming"]["streamed"] == ["train"]
    assert memory_doc["fingerprint"] != stream_doc["fingerprint"]
    assert stream_doc["protocol"]["features"].startswith("streaming")
    memory = stream_doc["protocol"]["memory"]  # the plan, and what it means for the shuffle
    assert memory["block_rows"] * memory["window_blocks"] >= memory["window_rows"] > 0
    assert memory["train_rows"] == stream_doc["sizes"]["train"] and memory["budget_bytes"] == 8 * GB
    assert 0 < memory["window_share"] <= 1 and "every row is" in memory["shuffle"] or \
        "full shuffle" in memory["shuffle"]
    assert memory_doc["protocol"]["memory"]["streamed"] == []
    # the same run id with in-memory settings is another run: refused, naming the difference
    clash = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "s", *FAST)
    assert clash.exit_code != 0 and "streaming" in clash.output


def test_a_budget_too_small_for_any_plan_is_one_clear_error(cache_dir):
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--max-memory", "1KB",
                    *FAST)
    assert result.exit_code != 0
    assert "--max-memory 1.0 KB is too small" in result.output
    bad = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--max-memory", "lots", *FAST)
    assert bad.exit_code != 0 and "--max-memory 'lots'" in bad.output


def test_in_memory_data_keeps_the_files_identity_not_a_second_copy(files):
    data = load_linear_data(*files)
    assert data.features.sha256 and data.features.path == files[1]
    assert not hasattr(data.features, "train")  # the arrays are read once, into the splits
    assert np.array_equal(data.train.rows, load_labels(files[0]).train_index)


def test_features_are_written_block_by_block_and_read_back_in_blocks(tmp_path):
    labels_path, features_path = synthetic_dataset(tmp_path, n_train=50, n_test=20, dim=6)
    labels = load_labels(labels_path)
    whole = load_features(features_path, labels)
    out = tmp_path / "blocks.h5"
    write_features(out, labels, {"train": (whole.train[i:i + 16] for i in range(0, 50, 16)),
                                 "test": iter([whole.test])}, {"backbone": "toy"},
                   dtype="float16")
    with open_features(out, labels) as file:
        assert file.dtype == np.float16 and file.dim == 6 and file.rows("train") == 50
        assert np.array_equal(file.read("train", 10, 20), whole.train[10:20].astype(np.float16))
    short = {"train": (whole.train[i:i + 16] for i in range(0, 48, 16)), "test": whole.test}
    with pytest.raises(InputError, match="the blocks hold 48 rows"):
        write_features(out, labels, short, {"backbone": "toy"}, overwrite=True)
    assert open_features(out, labels).rows("train") == 50  # the failed write left the file as it was
