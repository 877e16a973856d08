"""Bad input gets one clear error: what is wrong, and what to do about it."""

from __future__ import annotations

import pytest
import torch
from helpers_finetune import NAME, SIZE, base_cache, copy_cache, finetune, linear_run
from helpers_images import make_dataset

from featcache.backbones.registry import create_backbone
from featcache.data.labelfile import load_labels
from featcache.data.synthetic import write_image_labels
from featcache.errors import OptionError
from featcache.finetune.data import load_finetune_data
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.start import linear_features, resolve_start
from featcache.runtime import Ranks

CPU = Ranks(0, 1, 0, 1, torch.device("cpu"))
SMALL = ("--epochs", "1", "--lr", "1e-3", "--bsize", "4")


@pytest.fixture
def cache(tmp_path_factory, tmp_path):
    return copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")


def _refused(result, *fragments):
    assert result.exit_code == 1, result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)


def test_no_linear_run_and_no_features_says_which_command_makes_them(tmp_path):
    make_dataset(tmp_path, num_train=10, num_test=4, name="bare")
    result = finetune(tmp_path / "cache", "--dataset", "bare", "--loss", "role", *SMALL)
    _refused(result, "no finished linear 'role' run", "featcache features --dataset bare")
    other = finetune(tmp_path / "cache", "--dataset", "bare", "--loss", "an", *SMALL)
    _refused(other, "--linear-lr and --linear-batch-size")


def test_run_of_another_labels_file_is_refused(cache):
    labels = load_labels(cache / NAME / "labels.h5")
    write_image_labels(cache / NAME / "labels.h5", list(labels.train.images),
                       list(labels.test.images), labels.image_root, dataset=NAME, seed=5,
                       overwrite=True)
    result = finetune(cache, "--loss", "role", "--init", str(linear_run(cache)), *SMALL)
    _refused(result, "another labels file", "featcache train-linear")
    # --init best passes the run over; with no features file for these labels, it says so.
    (cache / NAME / "features-resnet50-random.h5").unlink()
    _refused(finetune(cache, "--loss", "role", *SMALL), "featcache features --dataset toy")


def test_run_with_other_weights_or_image_size_is_refused(cache, tmp_path):
    other = tmp_path / "other-resnet50.pth"
    torch.save(create_backbone("resnet50", "random", seed=3).state_dict(), other)
    run = str(linear_run(cache))
    _refused(finetune(cache, "--loss", "role", "--init", run, "--weights", str(other), *SMALL),
             "was trained on features of random weights", "Drop --weights")
    _refused(finetune(cache, "--loss", "role", "--init", run, "--image-size", "48", *SMALL),
             f"features of {SIZE}x{SIZE} images", "--image-size 48")
    _refused(finetune(cache, "--loss", "role", "--init", run, "--backbone", "resnet18", *SMALL),
             "resnet50 features")


def test_run_whose_phi_does_not_fit_the_training_rows_is_refused(cache):
    best = linear_run(cache) / "best.pt"
    head = torch.load(best, weights_only=True)
    head["train_rows"] = head["train_rows"][:-1]
    torch.save(head, best)
    _refused(finetune(cache, "--loss", "role", "--init", str(best), *SMALL),
             "phi covers 15 training rows", "16 rows")


def test_run_of_another_loss_starts_with_a_warning(tmp_path_factory):
    cache = base_cache(tmp_path_factory.getbasetemp())
    data = load_finetune_data(cache / NAME / "labels.h5")
    options = FinetuneOptions(init=str(linear_run(cache)), loss="an-ls", dataset=NAME, cache=str(cache))
    with pytest.warns(UserWarning, match="trained with loss 'role'"):
        start = resolve_start(options, data, CPU)
    assert start.head_weight is not None and not start.handoff


def test_missing_and_broken_images(tmp_path):
    labels = make_dataset(tmp_path, num_train=10, num_test=4, name="holes")
    cache = tmp_path / "cache"
    (tmp_path / "images" / "test" / "img0011.jpg").unlink()
    args = ("--dataset", "holes", "--loss", "an", "--init", "none", "--weights", "random",
            "--image-size", str(SIZE), *SMALL)
    _refused(finetune(cache, *args), "1 of 4 test images are missing", "img0011.jpg",
             "--images-root")
    broken = tmp_path / "broken"
    labels = make_dataset(broken, num_train=10, num_test=4, name="broken",
                          kinds={i: "truncated" for i in range(10)})
    _refused(finetune(broken / "cache", *args[:1], "broken", *args[2:]), "cannot read image",
             "train row", str(labels))


def test_the_linear_phase_finds_its_features_file_by_weights_whatever_its_transform(tmp_path):
    """--weights picks ``<backbone>-<weights>`` or ``...-protocol`` (stage one's names for the
    backbone's own and the protocol's transform), never another backbone's or weights' file."""
    root = tmp_path / "voc"
    root.mkdir()
    for name in ("features-resnet50-random-protocol.h5", "features-resnet50-random7.h5",
                 "features-resnet18-random.h5"):
        (root / name).touch()
    options = FinetuneOptions(dataset="voc", loss="an", weights="random", cache=str(tmp_path))
    assert linear_features(options).name == "features-resnet50-random-protocol.h5"
    (root / "features-resnet50-random.h5").touch()
    with pytest.raises(OptionError, match="several features files for resnet50.*differ in transform"):
        linear_features(options)
