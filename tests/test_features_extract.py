"""Stage one end to end on generated images (CPU, random ResNet-50 weights, 32-64 px)."""

from __future__ import annotations

import errno
import os
import shutil
import time

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers_images import make_dataset, write_image
from PIL import Image

from featcache.backbones.transforms import image_transform
from featcache.cli import cli
from featcache.data.featurefile import load_features
from featcache.data.labelfile import load_labels
from featcache.errors import (
    DiskFullError,
    FeatcacheError,
    InputError,
    OptionError,
    OutputExistsError,
)
from featcache.features import assembly as assembly_module
from featcache.features import extraction as extraction_module
from featcache.features.extract import ExtractOptions, extract_features
from featcache.features.shards import parts_dir

SIZE = 32  # the smallest input ResNet-50 takes; 64 where pooling must average a real map

pytestmark = pytest.mark.usefixtures("reuse_model")


def options(tmp_path, **overrides) -> ExtractOptions:
    base = dict(weights="random", image_size=SIZE, batch_size=4, chunk_rows=8, workers=0,
                device="cpu", cache=str(tmp_path / "cache"))
    base.update(overrides)
    return ExtractOptions(**base)


def read(path):
    with h5py.File(path, "r") as h5:
        arrays = {f"{s}/{k}": h5[f"{s}/{k}"][()] for s in ("train", "test") for k in ("features", "bad")}
        attrs = {k: v for k, v in h5.attrs.items() if k != "created"}
    return arrays, attrs


def copy_labels(cache, other_cache):
    """The same labels file (same sha256) under a second cache root."""
    target = other_cache / "toy" / "labels.h5"
    target.parent.mkdir(parents=True)
    shutil.copyfile(cache / "toy" / "labels.h5", target)


def assert_same_file(a, b):
    arrays_a, attrs_a = read(a)
    arrays_b, attrs_b = read(b)
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        assert np.array_equal(arrays_a[key], arrays_b[key], equal_nan=True), key
    assert attrs_a.keys() == attrs_b.keys()
    for key in attrs_a:
        assert np.array_equal(attrs_a[key], attrs_b[key]), key


def test_shapes_dtypes_rows_and_provenance(tmp_path):
    labels_file = make_dataset(tmp_path, num_train=10, num_test=5)
    result = extract_features("toy", options(tmp_path))
    assert result.status == "written" and result.images == 15
    assert result.path == tmp_path / "cache" / "toy" / "features-resnet50-random.h5"
    labels = load_labels(labels_file)
    features = load_features(result.path, labels)
    assert features.train.shape == (10, 2048) and features.test.shape == (5, 2048)
    assert features.train.dtype == np.float32
    assert not features.train_bad.any() and not features.test_bad.any()
    attrs = features.attrs
    assert attrs["backbone"] == "resnet50" and attrs["backbone_tag"] == "resnet50-random"
    assert attrs["weights"] == "random" and attrs["weights_seed"] == 0
    assert len(attrs["weights_sha256"]) == 64
    assert attrs["labels_sha256"] == labels.sha256
    assert attrs["image_size"] == SIZE and attrs["transform"]["resize"] == [SIZE, SIZE]
    assert attrs["precision"] == "fp32" and attrs["device"] == "cpu"
    assert attrs["torch_version"] == str(torch.__version__)
    assert attrs["bad_images"] == [] and attrs["num_bad_images"] == 0
    assert not parts_dir(result.path).exists()
    assert "15 images" in result.summary() and "images/s" in result.summary()


def test_features_equal_a_direct_forward_pass(tmp_path, random_resnet50):
    kinds = {1: "png_alpha", 2: "gray", 3: "cmyk", 4: "exif", 5: "palette"}
    make_dataset(tmp_path, num_train=8, num_test=3, kinds=kinds)
    result = extract_features("toy", options(tmp_path, batch_size=3, chunk_rows=6, image_size=64))
    labels = load_labels(result.path.parent / "labels.h5")
    root = tmp_path / "images"
    paths = [root / p for p in [*labels.train.images, *labels.test.images]]
    batch = torch.stack([image_transform(64)(Image.open(p).convert("RGB")) for p in paths])
    with torch.inference_mode():
        expected = random_resnet50(batch).numpy()
    features = load_features(result.path, labels)
    got = np.concatenate([features.train, features.test])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_float16_storage(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2)
    full = extract_features("toy", options(tmp_path))
    half = extract_features("toy", options(tmp_path, dtype="float16", overwrite=True))
    assert half.path == full.path
    arrays, attrs = read(half.path)
    assert arrays["train/features"].dtype == np.float16 and attrs["dtype"] == "float16"


@pytest.mark.slow  # interrupts an extraction, then resumes it
def test_resume_after_an_interruption_gives_an_identical_file(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=14, num_test=6)
    copy_labels(tmp_path / "cache", tmp_path / "b" / "cache")
    reference = extract_features("toy", options(tmp_path))

    real, saved = extraction_module.write_shard, []

    def crash_after_first(store, chunk, *args):
        if saved:
            raise KeyboardInterrupt
        real(store, chunk, *args)
        saved.append(chunk)

    monkeypatch.setattr(extraction_module, "write_shard", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        extract_features("toy", options(tmp_path / "b"))
    final = tmp_path / "b" / "cache" / "toy" / "features-resnet50-random.h5"
    assert not final.exists()
    assert [p.name for p in sorted(parts_dir(final).glob("chunk-*"))] == ["chunk-000000.npz"]

    monkeypatch.setattr(extraction_module, "write_shard", real)
    messages = []
    resumed = extract_features("toy", options(tmp_path / "b"), say=messages.append)
    assert resumed.resumed_chunks == 1 and resumed.images == 12
    assert any("resuming: 1 of 3 chunks" in m for m in messages)
    assert_same_file(reference.path, resumed.path)


def test_device_decode_path_runs_end_to_end_on_the_cpu(tmp_path):
    """--gpu-decode's engine path (decode_jpeg on the run's device; the CLI asks for CUDA).

    On the CPU, libjpeg-turbo and torchvision's uint8 antialiased resize happen to match PIL;
    nvJPEG on a GPU does not, hence the tolerance."""
    make_dataset(tmp_path, num_train=6, num_test=3, kinds={1: "png_alpha", 2: "truncated"})
    result = extract_features("toy", options(tmp_path, gpu_decode=True, skip_bad=True, image_size=64))
    arrays, attrs = read(result.path)
    assert "decode_jpeg" in attrs["transform"]
    assert arrays["train/bad"].tolist() == [0, 0, 1, 0, 0, 0]
    pil = extract_features("toy", options(tmp_path, skip_bad=True, image_size=64, overwrite=True))
    reference, _ = read(pil.path)
    ok = arrays["train/bad"] == 0
    np.testing.assert_allclose(arrays["train/features"][ok], reference["train/features"][ok],
                               rtol=0.1, atol=0.5)
    assert np.array_equal(arrays["train/features"][1], reference["train/features"][1])  # PNG: PIL


def test_up_to_date_file_is_left_alone_and_other_settings_are_refused(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2)
    first = extract_features("toy", options(tmp_path))
    stamp = os.stat(first.path).st_mtime_ns
    time.sleep(0.01)
    messages = []
    again = extract_features("toy", options(tmp_path), say=messages.append)
    assert again.status == "up-to-date" and "is up to date" in again.summary()
    assert "nothing to do" in again.summary() and not messages  # the result says it, once
    assert os.stat(first.path).st_mtime_ns == stamp
    with pytest.raises(OutputExistsError, match="image_size: 32 -> 48.*--overwrite"):
        extract_features("toy", options(tmp_path, image_size=48))
    redone = extract_features("toy", options(tmp_path, image_size=48, overwrite=True))
    assert redone.status == "written" and read(redone.path)[1]["image_size"] == 48


def test_full_disk_keeps_the_previous_file_and_the_chunks(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=6, num_test=2)
    first = extract_features("toy", options(tmp_path))
    before = first.path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(assembly_module, "write_features", disk_full)
    with pytest.raises(DiskFullError, match="could not write .*features-resnet50-random.h5: the "
                       "device holding .* is full.*previous features-resnet50-random.h5 .* is "
                       "untouched and the computed chunks are kept"):
        extract_features("toy", options(tmp_path, image_size=48, overwrite=True))
    assert first.path.read_bytes() == before
    assert list(parts_dir(first.path).glob("chunk-*.npz"))
    monkeypatch.setattr(np, "savez", disk_full)
    with pytest.raises(DiskFullError, match="could not write .*chunk-000000.npz: the device "
                       "holding .* is full.*chunks saved so far are kept"):
        extract_features("toy", options(tmp_path, image_size=40, overwrite=True))
    assert first.path.read_bytes() == before
    assert not list(parts_dir(first.path).glob(".*tmp*"))


def test_corrupt_image_stops_with_an_error_naming_it(tmp_path):
    make_dataset(tmp_path, num_train=10, num_test=2, kinds={9: "truncated"})
    with pytest.raises(InputError) as info:
        extract_features("toy", options(tmp_path))
    message = str(info.value)
    assert "train/img0009.jpg" in message and "train row 9" in message
    assert "--skip-bad" in message
    final = tmp_path / "cache" / "toy" / "features-resnet50-random.h5"
    assert not final.exists()
    assert (parts_dir(final) / "chunk-000000.npz").exists()  # rows 0-7 are kept


def test_skip_bad_flags_records_and_nans_the_rows(tmp_path):
    make_dataset(tmp_path, num_train=10, num_test=3, kinds={2: "garbage", 11: "empty"})
    messages = []
    result = extract_features("toy", options(tmp_path, skip_bad=True), say=messages.append)
    labels = load_labels(result.path.parent / "labels.h5")
    features = load_features(result.path, labels)
    assert np.flatnonzero(features.train_bad).tolist() == [2]
    assert np.flatnonzero(features.test_bad).tolist() == [1]
    assert np.isnan(features.train[2]).all() and np.isfinite(features.train[[0, 1, 3]]).all()
    recorded = features.attrs["bad_images"]
    assert [(b["split"], b["row"], b["image"]) for b in recorded] == [
        ("train", 2, "train/img0002.jpg"), ("test", 1, "test/img0011.jpg")]
    assert "empty" in recorded[1]["reason"]
    assert features.attrs["num_bad_images"] == 2
    assert sum("warning: bad image" in m for m in messages) == 2


def test_missing_images_fail_before_any_work(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2)
    (tmp_path / "images" / "test" / "img0007.jpg").unlink()
    with pytest.raises(InputError, match="1 of 8 images are missing.*test/img0007.jpg.*test row 1"):
        extract_features("toy", options(tmp_path))


def test_features_of_another_labels_file_are_refused_naming_the_cause(tmp_path):
    make_dataset(tmp_path / "a", num_train=6, num_test=2, seed=0)
    result = extract_features("toy", options(tmp_path / "a"))
    # the same images, labelled again (another seed): the labels file was prepared again
    relabelled = load_labels(make_dataset(tmp_path / "b", num_train=6, num_test=2, seed=1))
    with pytest.raises(InputError, match=r"labels.h5 was prepared again after .*features-resnet50"
                                         r"-random.h5 was extracted \(the same images, other labels"):
        load_features(result.path, relabelled)
    # other images of the same dataset
    fewer = load_labels(make_dataset(tmp_path / "c", num_train=5, num_test=2, seed=0))
    with pytest.raises(InputError, match=r"was extracted for other images than those of .*images "
                                         r"added, dropped or reordered since\); run `featcache "
                                         r"features --dataset toy .*--overwrite`"):
        load_features(result.path, fewer)
    # another dataset altogether
    other = load_labels(make_dataset(tmp_path / "d", num_train=6, num_test=2, name="voc"))
    with pytest.raises(InputError, match=r"holds features of dataset 'toy', not of 'voc' .*"
                                         r"`featcache features --dataset voc`\), or pass "
                                         r"--dataset toy"):
        load_features(result.path, other)


def test_unfinished_work_of_other_settings_is_discarded(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=14, num_test=2)
    monkeypatch.setattr(extraction_module, "write_shard", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        extract_features("toy", options(tmp_path, dtype="float16"))
    monkeypatch.undo()
    messages = []
    result = extract_features("toy", options(tmp_path), say=messages.append)
    assert any("starting fresh" in m and "dtype: float16 -> float32" in m for m in messages)
    assert result.resumed_chunks == 0


def test_damaged_chunk_is_recomputed(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=14, num_test=2)
    copy_labels(tmp_path / "cache", tmp_path / "ref")
    reference = extract_features("toy", options(tmp_path, cache=str(tmp_path / "ref")))
    real, calls = extraction_module.write_shard, []

    def save_two_then_stop(store, chunk, *args):
        if len(calls) == 1:
            real(store, chunk, *args)
            raise KeyboardInterrupt
        real(store, chunk, *args)
        calls.append(chunk)

    monkeypatch.setattr(extraction_module, "write_shard", save_two_then_stop)
    with pytest.raises(KeyboardInterrupt):
        extract_features("toy", options(tmp_path))
    monkeypatch.setattr(extraction_module, "write_shard", real)
    parts = parts_dir(tmp_path / "cache" / "toy" / "features-resnet50-random.h5")
    (parts / "chunk-000001.npz").write_bytes(b"damaged")
    result = extract_features("toy", options(tmp_path))
    assert result.resumed_chunks == 1
    assert_same_file(reference.path, result.path)


def test_bad_options_are_option_errors(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2)
    with pytest.raises(OptionError, match="--image-size must be at least 32"):
        extract_features("toy", options(tmp_path, image_size=8))
    with pytest.raises(OptionError, match="multiple of the batch size"):
        extract_features("toy", options(tmp_path, chunk_rows=6))
    with pytest.raises(OptionError, match="--images-root .* is not a directory"):
        extract_features("toy", options(tmp_path, images_root=str(tmp_path / "none")))


def test_image_root_relative_to_the_labels_file(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2, image_root="../../images")
    result = extract_features("toy", options(tmp_path))
    assert result.status == "written"


def test_cli_runs_with_default_workers_and_reports(tmp_path, cache_dir):
    make_dataset(tmp_path, num_train=6, num_test=2)
    runner = CliRunner()
    args = ["features", "--dataset", "toy", "--weights", "random", "--image-size", str(SIZE),
            "--batch-size", "4", "--device", "cpu", "--cache", str(tmp_path / "cache")]
    done = runner.invoke(cli, args)
    assert done.exit_code == 0, done.output
    assert "features: 8 images in" in done.output and "images/s" in done.output
    again = runner.invoke(cli, args)
    assert again.exit_code == 0 and "up to date" in again.output
    bad = runner.invoke(cli, ["v7" if arg == "random" else arg for arg in args])
    assert bad.exit_code != 0 and "Error: unknown --weights 'v7'" in bad.output
    assert "Traceback" not in bad.output


def test_cli_help_lists_every_option():
    text = CliRunner().invoke(cli, ["features", "--help"]).output
    for option in ("--dataset", "--backbone", "--weights", "--image-size", "--batch-size",
                   "--workers", "--precision", "--dtype", "--device", "--gpu-decode",
                   "--skip-bad", "--overwrite", "--images-root", "--cache"):
        assert option in text, option


def _interrupt(*_args):
    raise KeyboardInterrupt


def test_write_image_helper_makes_distinct_images(tmp_path):
    a = np.asarray(Image.open(write_image(tmp_path / "a.jpg", seed=1)))
    b = np.asarray(Image.open(write_image(tmp_path / "b.jpg", seed=2)))
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_device_choices_and_gpu_settings_without_a_gpu(monkeypatch):
    from featcache.features.options import default_chunk_rows
    from featcache.runtime import backend_flags, pick_device, resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    assert default_chunk_rows(256) == 1024 and default_chunk_rows(48) == 1008
    assert default_chunk_rows(4096) == 4096
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match="CUDA is not available"):
            pick_device("cuda")
    with pytest.raises(OptionError, match="--device 'tpu'"):
        pick_device("tpu")
    # --precision fp32 on a GPU turns TF32 off for the run and restores it afterwards
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = (conv.fp32_precision, matmul.fp32_precision)
    with backend_flags(torch.device("cuda"), "fp32"):
        assert (conv.fp32_precision, matmul.fp32_precision) == ("ieee", "ieee")
    assert (conv.fp32_precision, matmul.fp32_precision) == before
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with backend_flags(cpu, "fp32"):
        assert torch.get_num_threads() == 1


def test_jpeg_draft_is_recorded_and_refused_with_gpu_decode(tmp_path):
    make_dataset(tmp_path, num_train=4, num_test=4)
    result = extract_features("toy", options(tmp_path, jpeg_draft=True))
    _, attrs = read(result.path)
    assert "draft(None, (32, 32))" in attrs["transform"]
    with pytest.raises(OutputExistsError, match="transform"):  # not the reference's full decode
        extract_features("toy", options(tmp_path))
    with pytest.raises(OptionError, match="--jpeg-draft.*--gpu-decode"):
        extract_features("toy", options(tmp_path, jpeg_draft=True, gpu_decode=True, overwrite=True))


def test_too_small_shared_memory_is_one_clear_error(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from featcache.backbones import inputs

    make_dataset(tmp_path, num_train=4, num_test=4)
    real = inputs.shutil.disk_usage
    monkeypatch.setattr(inputs.shutil, "disk_usage", lambda path: SimpleNamespace(free=20_000)
                        if str(path) == "/dev/shm" else real(path))
    with pytest.raises(FeatcacheError, match=r"/dev/shm has 0 MB free.*batches of 4 images at 32 "
                                             r"px.*--shm-size"):
        extract_features("toy", options(tmp_path, workers=1))
    assert not (tmp_path / "cache" / "toy" / "features-resnet50-random.h5").exists()
