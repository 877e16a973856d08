"""Stage one with --spatial: feature maps cached for BoostLU (CPU, random ResNet-50, 64-96 px)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers_images import make_dataset

from featcache import fileio
from featcache.backbones.registry import create_backbone
from featcache.cli import cli
from featcache.data.featurefile import load_features, open_features
from featcache.data.featurewrite import write_features
from featcache.data.labelfile import load_labels
from featcache.errors import DiskFullError, FeatcacheError, InputError, OptionError
from featcache.features import spatial as spatial_module
from featcache.features.extract import ExtractOptions, extract_features
from featcache.features.shards import parts_dir

pytestmark = pytest.mark.usefixtures("reuse_model")


def options(tmp_path, **overrides) -> ExtractOptions:
    base = dict(weights="random", image_size=64, batch_size=4, chunk_rows=8, workers=0,
                device="cpu", cache=str(tmp_path / "cache"), spatial=True)
    base.update(overrides)
    return ExtractOptions(**base)


def arrays(path) -> dict:
    with h5py.File(path, "r") as h5:
        return {f"{s}/{k}": h5[f"{s}/{k}"][()] for s in ("train", "test") for k in ("features", "bad")}


def test_spatial_file_layout_gap_and_pooled_file_of_the_same_pass(tmp_path):
    make_dataset(tmp_path, num_train=10, num_test=5)
    result = extract_features("toy", options(tmp_path))
    final = tmp_path / "cache" / "toy" / "spatial-resnet50-random.h5"
    assert result.path == final and result.status == "written"
    assert not parts_dir(final).exists()
    with open_features(final, load_labels(tmp_path / "cache" / "toy" / "labels.h5")) as file:
        assert file.spatial_shape == (2, 2, 2048)  # 64 px / 32
        assert file.shapes == {"train": (10, 8192), "test": (5, 8192)}
        assert file.dtype == np.float16
        assert file.attrs["layout"] == "spatial" and file.attrs["compression"] == "lzf"
        assert file.attrs["feature_dim"] == 8192
    with h5py.File(final, "r") as h5:
        data = h5["train/features"]
        assert data.compression == "lzf" and data.shuffle
        assert data.chunks == (10, 8192)  # whole rows, 4 MB at most: 256 rows of 16 kB, capped by N
    # the map, laid out (H, W, D): the same forward pass by hand
    spatial = load_features(final)
    pooled = load_features(tmp_path / "cache" / "toy" / "features-resnet50-random.h5")
    assert pooled.attrs["dtype"] == "float32" and "layout" not in pooled.attrs
    gap = spatial.train.astype(np.float32).reshape(10, 4, 2048).mean(axis=1)
    np.testing.assert_allclose(gap, pooled.train, rtol=2e-3, atol=1e-3)  # float16 rounding
    # the pooled file equals a plain (pooled-only) run's, bit for bit
    other = tmp_path / "plain"
    (other / "cache" / "toy").mkdir(parents=True)
    (other / "cache" / "toy" / "labels.h5").write_bytes(
        (tmp_path / "cache" / "toy" / "labels.h5").read_bytes())
    # (other chunks on purpose: batches start at multiples of the batch size either way)
    extract_features("toy", options(tmp_path, spatial=False, chunk_rows=12, cache=str(other / "cache")))
    plain = arrays(other / "cache" / "toy" / "features-resnet50-random.h5")
    joint = arrays(tmp_path / "cache" / "toy" / "features-resnet50-random.h5")
    for key in plain:
        assert np.array_equal(plain[key], joint[key]), key
    # a second run is up to date; a plain run accepts the pooled file of the joint pass
    assert extract_features("toy", options(tmp_path)).status == "up-to-date"
    assert extract_features("toy", options(tmp_path, spatial=False)).status == "up-to-date"


def test_rows_are_the_trunk_feature_map_in_hwd_order(tmp_path):
    make_dataset(tmp_path, num_train=4, num_test=2)
    extract_features("toy", options(tmp_path, image_size=96, dtype="float32", compression="none"))
    final = tmp_path / "cache" / "toy" / "spatial-resnet50-random.h5"
    rows = load_features(final)
    assert rows.attrs["spatial_shape"] == [3, 3, 2048]
    from featcache.backbones import Uint8Normalize
    from featcache.backbones.inputs import ImageRows
    from featcache.data.images import image_root

    labels = load_labels(tmp_path / "cache" / "toy" / "labels.h5")
    dataset = ImageRows(image_root(labels, None), labels.train.images, 96, [0, 1, 2, 3])
    images = torch.stack([dataset[i][0] for i in range(4)])
    model = create_backbone("resnet50", "random")
    with torch.inference_mode():
        fmap = model.feature_map(Uint8Normalize("resnet50")(images))  # (B, D, H, W)
    for u in range(3):
        for v in range(3):
            position = rows.train.reshape(4, 9, 2048)[:, u * 3 + v]
            np.testing.assert_allclose(position, fmap[:, :, u, v].numpy(), rtol=1e-3, atol=1e-3)  # channels_last


def test_size_estimate_within_ten_percent_of_the_file(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=24, num_test=8)
    said = []
    extract_features("toy", options(tmp_path, image_size=96), say=said.append)
    final = tmp_path / "cache" / "toy" / "spatial-resnet50-random.h5"
    size = final.stat().st_size
    with h5py.File(final, "r") as h5:
        upper = int(h5.attrs["size_upper_bound_bytes"])
        estimate = int(h5.attrs["size_estimate_bytes"])
        raw = sum(h5[f"{s}/features"].id.get_storage_size() for s in ("train", "test"))
    # the maps dominate the file, so the claim is tested where it matters
    assert raw > 0.8 * size
    assert upper >= size  # the check of free space uses the uncompressed size: never too low
    assert abs(estimate - size) <= 0.10 * size, (estimate, size)
    assert any("at most" in line and "uncompressed" in line for line in said)
    assert any("will be about" in line for line in said)


def test_refuses_before_work_when_the_disk_cannot_hold_it(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=6, num_test=2)
    monkeypatch.setattr(spatial_module, "free_bytes", lambda _: 300_000)
    monkeypatch.setattr(fileio, "free_bytes", lambda _: 300_000)
    with pytest.raises(DiskFullError, match="not enough free space .* to extract the spatial "
                                            "features of 8 images .* needed, 300.0 kB free"):
        extract_features("toy", options(tmp_path))
    assert not list(parts_dir(tmp_path / "cache" / "toy" / "spatial-resnet50-random.h5")
                    .glob("chunk-*"))


@pytest.mark.slow  # kills an extraction, then resumes it
def test_sigkill_mid_run_then_rerun_gives_the_same_file(tmp_path):
    make_dataset(tmp_path, num_train=20, num_test=8)
    final = tmp_path / "cache" / "toy" / "spatial-resnet50-random.h5"
    args = ["features", "--dataset", "toy", "--weights", "random", "--image-size", "64",
            "--batch-size", "2", "--chunk-rows", "4", "--workers", "0", "--device", "cpu",
            "--cache", str(tmp_path / "cache"), "--spatial"]
    # a run slowed down after each saved chunk, killed with SIGKILL once two chunks exist
    code = textwrap.dedent(f"""
        import time, sys
        from featcache.features import extraction
        real = extraction.write_shard
        def slow(*a, **k):
            real(*a, **k)
            time.sleep(0.4)
        extraction.write_shard = slow
        from featcache.cli import cli
        cli.main({args!r}, standalone_mode=True)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    parts = parts_dir(final)
    deadline = time.monotonic() + 120
    while len(list(parts.glob("chunk-*.npz"))) < 2 and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    done = len(list(parts.glob("chunk-*.npz")))
    assert 2 <= done < 7 and not final.exists()  # killed mid-run: 7 chunks in all
    said = []
    result = extract_features("toy", options(tmp_path, batch_size=2, chunk_rows=4),
                              say=said.append)
    assert result.resumed_chunks == done
    assert any("resuming" in line for line in said)
    # an uninterrupted run elsewhere, same labels file
    other = tmp_path / "other"
    (other / "toy").mkdir(parents=True)
    (other / "toy" / "labels.h5").write_bytes((tmp_path / "cache" / "toy" / "labels.h5").read_bytes())
    extract_features("toy", options(tmp_path, batch_size=2, chunk_rows=4, cache=str(other)))
    for name in ("spatial-resnet50-random.h5", "features-resnet50-random.h5"):
        resumed, clean = arrays(tmp_path / "cache" / "toy" / name), arrays(other / "toy" / name)
        for key in clean:
            assert resumed[key].tobytes() == clean[key].tobytes(), (name, key)


def test_pooled_files_keep_their_chunks_and_bytes(tmp_path):
    labels_file = make_dataset(tmp_path, num_train=6, num_test=3)
    labels = load_labels(labels_file)
    rng = np.random.default_rng(0)
    data = {"train": rng.normal(size=(6, 5)).astype(np.float32),
            "test": rng.normal(size=(3, 5)).astype(np.float32)}
    path = write_features(tmp_path / "f.h5", labels, data, {"backbone": "x"})
    with h5py.File(path, "r") as h5:
        assert h5["train/features"].chunks == (6, 5) and h5["train/features"].compression is None
        assert not h5["train/features"].shuffle
        assert h5["train/features"][()].tobytes() == data["train"].tobytes()
    assert open_features(path).spatial_shape is None


def test_spatial_shape_that_does_not_fit_the_rows_is_refused(tmp_path):
    labels = load_labels(make_dataset(tmp_path, num_train=4, num_test=2))
    data = {"train": np.zeros((4, 12), np.float16), "test": np.zeros((2, 12), np.float16)}
    attrs = {"backbone": "x", "layout": "spatial", "spatial_shape": [2, 2, 3]}
    with pytest.raises(InputError, match=r"spatial_shape \[2, 2, 3\] holds 12"):
        write_features(tmp_path / "bad.h5", labels, {k: np.zeros((len(v), 10), np.float16)
                                                     for k, v in data.items()}, attrs)
    assert not (tmp_path / "bad.h5").exists()
    path = write_features(tmp_path / "s.h5", labels, data, attrs, compression="gzip",
                          chunk_bytes=48, dtype="float16")
    with h5py.File(path, "r") as h5:
        assert h5["train/features"].chunks == (2, 12) and h5["train/features"].compression == "gzip"
    assert open_features(path).spatial_shape == (2, 2, 3)
    with h5py.File(path, "r+") as h5:
        h5.attrs["spatial_shape"] = "[2, 3, 3]"
    with pytest.raises(InputError, match=r"s.h5: spatial_shape \[2, 3, 3\] holds 18 values per "
                                         r"image but its rows are 12 wide"):
        open_features(path)
    with h5py.File(path, "r+") as h5:
        h5.attrs["layout"] = "tiles"
    with pytest.raises(InputError, match="layout is 'tiles'"):
        open_features(path)


def test_truncated_spatial_file_is_one_clear_error(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2)
    extract_features("toy", options(tmp_path))
    final = tmp_path / "cache" / "toy" / "spatial-resnet50-random.h5"
    data = final.read_bytes()
    final.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or corrupt"):
        load_features(final)
    with pytest.raises(FeatcacheError, match="truncated or corrupt.*pass --overwrite"):
        extract_features("toy", options(tmp_path))
    result = CliRunner().invoke(cli, ["info", str(final)])
    assert result.exit_code != 0 and "truncated or corrupt" in result.output


def test_options_that_do_not_go_with_spatial(tmp_path):
    make_dataset(tmp_path, num_train=4, num_test=2)
    with pytest.raises(OptionError, match="--spatial stores feature maps only"):
        extract_features("toy", options(tmp_path, crops=2))


def test_cli_and_info_show_a_spatial_file(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2)
    run = CliRunner().invoke(cli, [
        "features", "--dataset", "toy", "--weights", "random", "--image-size", "64",
        "--batch-size", "2", "--chunk-rows", "4", "--workers", "0", "--device", "cpu",
        "--cache", str(tmp_path / "cache"), "--spatial", "--compression", "gzip"])
    assert run.exit_code == 0, run.output
    assert "2 x 2 x 2048 float16 per image" in run.output
    info = CliRunner().invoke(cli, ["info", str(tmp_path / "cache" / "toy")])
    assert info.exit_code == 0, info.output
    assert "spatial-resnet50-random.h5" in info.output
    assert "2 x 2 x 2048 (H x W x D" in info.output
    assert "gzip" in info.output and "float16" in info.output


def test_skip_bad_flags_the_row_in_both_files(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2, kinds={2: "truncated"})
    result = extract_features("toy", options(tmp_path, skip_bad=True))
    assert [entry["row"] for entry in result.bad] == [2]
    for name in ("spatial-resnet50-random.h5", "features-resnet50-random.h5"):
        features = load_features(tmp_path / "cache" / "toy" / name)
        assert features.train_bad.tolist() == [False, False, True, False, False, False], name
        assert np.isnan(features.train[2]).all() and np.isfinite(features.train[[0, 1, 3]]).all()
        assert features.attrs["num_bad_images"] == 1


def test_a_transformer_map_is_its_patch_tokens_and_no_pooled_file(tmp_path):
    pytest.importorskip("timm")
    make_dataset(tmp_path, num_train=4, num_test=2)
    said = []
    extract_features("toy", options(tmp_path, backbone="test-vit", image_size=64),
                     say=said.append)
    folder = tmp_path / "cache" / "toy"
    spatial = open_features(folder / "spatial-test-vit-random.h5")
    assert spatial.spatial_shape == (4, 4, 64)  # 64 px / 16 px patches, 64-d tokens
    # its pooled feature is the class token, not the map's average: no pooled file from this pass
    assert not (folder / "features-test-vit-random.h5").exists()
    assert not any("pooled features written" in line for line in said)


def test_boostlu_trains_on_the_extracted_file(tmp_path):
    """The contract end to end: what `features --spatial` writes is what BoostLU heads read."""
    make_dataset(tmp_path, num_train=20, num_test=6, num_classes=3)
    extract_features("toy", options(tmp_path))
    run = CliRunner().invoke(cli, [
        "train-linear", "--dataset", "toy", "--cache", str(tmp_path / "cache"),
        "--backbone", "resnet50-random", "--loss", "an+boostlu,an", "--lr", "1e-3",
        "--batch-size", "8", "--epochs", "2", "--seeds", "0", "--quiet", "--device", "cpu"])
    assert run.exit_code == 0, run.output
    runs = tmp_path / "cache" / "toy" / "runs"
    boostlu = json.loads(next((runs / "an+boostlu").glob("*/results.json")).read_text())
    assert boostlu["features"]["path"].endswith("spatial-resnet50-random.h5")
    assert boostlu["features"]["spatial_shape"] == [2, 2, 2048]
    pooled = json.loads(next((runs / "an").glob("*/results.json")).read_text())
    assert pooled["features"]["path"].endswith("features-resnet50-random.h5")  # the same pass's
