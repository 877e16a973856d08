"""Images at prepare time and their decoding: every ordinary mode decodes bit for bit as the
reference's ``Image.open(p).convert("RGB")``; a 16-bit PNG is scaled, not clipped to white
(and stage one sees it so); ``prepare --verify-images`` summarises modes and sizes and names
the images that cannot be read."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from dataset_fixtures import invoke
from helpers_images import GOOD_KINDS, make_dataset, write_image
from PIL import Image

from featcache.data.images import DEPTH_RULE, load_rgb, survey_images, to_rgb
from featcache.data.labelfile import load_labels
from featcache.features.extract import ExtractOptions, extract_features


@pytest.mark.parametrize("kind", GOOD_KINDS)
def test_ordinary_modes_decode_bit_for_bit_as_the_reference(tmp_path, kind):
    path = write_image(tmp_path / f"x-{kind}", kind)
    reference = np.asarray(Image.open(path).convert("RGB"))
    assert np.array_equal(np.asarray(load_rgb(path)), reference)


def test_a_16_bit_png_is_scaled_to_8_bits_not_clipped_to_white(tmp_path):
    deep = write_image(tmp_path / "deep.png", "png16", seed=3)
    twin = write_image(tmp_path / "twin.png", "gray16_twin", seed=3)
    assert Image.open(deep).mode == "I;16"
    clipped = np.asarray(Image.open(deep).convert("RGB"))
    assert (clipped == 255).mean() > 0.9  # what the reference's decode gives: nearly white
    decoded = np.asarray(load_rgb(deep))
    assert np.array_equal(decoded, np.asarray(load_rgb(twin)))  # v * 257 -> v exactly
    # the rule by hand: round(v * 255 / 65535) for a 16-bit value v
    assert np.asarray(to_rgb(Image.fromarray(np.array([[0, 257, 30000, 65535]], np.uint16))))[
        0, :, 0].tolist() == [0, 1, 117, 255]


def test_32_bit_integer_and_float_images_follow_the_documented_rule():
    wide = Image.fromarray(np.array([[0, 300, 65535, 70000]], np.int32))  # mode I, 16-bit values
    assert np.asarray(to_rgb(wide))[0, :, 0].tolist() == [0, 1, 255, 255]
    narrow = Image.fromarray(np.array([[0, 17, 255]], np.int32))  # 8-bit values: as the reference
    assert np.array_equal(np.asarray(to_rgb(narrow)), np.asarray(narrow.convert("RGB")))
    unit = Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32))  # float in [0, 1]
    assert np.asarray(to_rgb(unit))[0, :, 0].tolist() == [0, 128, 255]
    assert "round(v * 255 / 65535)" in DEPTH_RULE


def test_stage_one_sees_a_16_bit_png_as_its_8_bit_twin(tmp_path):
    make_dataset(tmp_path, num_train=4, num_test=2, kinds={0: "png16", 1: "gray16_twin"}, seed=0)
    # both images hold the same picture only if they share a seed: rewrite image 1 from seed 0
    labels = load_labels(tmp_path / "cache" / "toy" / "labels.h5")
    root = tmp_path / "images"
    write_image(root / labels.train.images[1], "gray16_twin", seed=0)
    result = extract_features("toy", ExtractOptions(
        backbone="resnet18", weights="random", image_size=32, batch_size=2, workers=0,
        device="cpu", cache=str(tmp_path / "cache")), say=lambda _: None)
    with h5py.File(result.path) as h5:
        features = h5["train/features"][()]
    assert np.array_equal(features[0], features[1])


def _csv_dataset(folder, kinds: dict[str, str]):
    for name, kind in kinds.items():
        write_image(folder / "images" / name, kind, seed=len(name))
    rows = "\n".join(f"{name},{'cat' if i % 2 else 'dog'}" for i, name in enumerate(kinds))
    (folder / "train.csv").write_text(f"image,label\n{rows}\n")
    write_image(folder / "images" / "test.jpg", "jpeg", seed=99)  # a test image of its own
    (folder / "test.csv").write_text("image,label\ntest.jpg,dog\n")


def _prepare(folder, *extra):
    return invoke("prepare", "csv", "--train", folder / "train.csv", "--test",
                  folder / "test.csv", "--images", folder / "images", "--name", "mine", *extra)


KINDS = {"a.jpg": "jpeg", "b.png": "png16", "c.png": "palette", "d.jpg": "cmyk",
         "e.png": "png_alpha", "f.jpg": "gray"}


def test_prepare_verifies_images_and_summarises_modes_and_sizes(tmp_path, cache_dir):
    _csv_dataset(tmp_path, KINDS)
    result = _prepare(tmp_path)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "images verified" in x)
    assert line.startswith("note: images verified: 7 decoded (")
    for mode in ("RGB 2", "I;16 1", "P 1", "CMYK 1", "RGBA 1", "L 1"):  # a.jpg and test.jpg
        assert mode in line, mode
    assert "sizes 56x44 to 56x44 (median 56x44)" in line
    assert "1 deeper than 8 bits, scaled to 8 bits" in line
    assert "2 with transparency: alpha dropped, as the reference does" in line
    record = load_labels(cache_dir / "mine" / "labels.h5").provenance["images_verified"]
    assert record["count"] == 7 and record["modes"]["I;16"] == 1 and record["bad"] == []


def test_prepare_names_the_images_that_cannot_be_read(tmp_path, cache_dir):
    _csv_dataset(tmp_path, {**KINDS, "g.jpg": "truncated", "h.jpg": "empty"})
    result = _prepare(tmp_path)
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert error.startswith(f"Error: 2 of 9 images under {tmp_path / 'images'} cannot be read: ")
    assert "g.jpg (cannot be decoded (OSError: image file is truncated" in error
    assert "h.jpg (file is empty (0 bytes))" in error
    assert "--no-verify-images" in error and "--skip-bad" in error
    assert not (cache_dir / "mine").exists()
    skipped = _prepare(tmp_path, "--no-verify-images")
    assert skipped.exit_code == 0 and "images verified" not in skipped.output
    assert load_labels(cache_dir / "mine" / "labels.h5").provenance["images_verified"] is False


def test_large_sets_are_not_verified_unless_asked(tmp_path, cache_dir, monkeypatch):
    from featcache.data import prepare as prepare_module

    monkeypatch.setattr(prepare_module, "VERIFY_LIMIT", 3)
    _csv_dataset(tmp_path, KINDS)
    result = _prepare(tmp_path)
    assert result.exit_code == 0
    assert "not decoding the 7 images now (more than 3): pass --verify-images" in result.output
    asked = _prepare(tmp_path, "--verify-images", "--overwrite")
    assert "images verified: 7 decoded" in asked.output


def test_survey_counts_sizes_and_reasons(tmp_path):
    write_image(tmp_path / "a.jpg", "jpeg", size=(80, 60))
    write_image(tmp_path / "b.png", "png", size=(40, 30))
    survey = survey_images(tmp_path, ["a.jpg", "b.png", "missing.jpg"])
    assert survey.count == 3 and dict(survey.modes) == {"RGB": 2}
    assert survey.bad == [("missing.jpg", "file does not exist")]
    assert "sizes 40x30 to 80x60" in survey.summary() and "1 unreadable" in survey.summary()
