"""Stage one with timm / open_clip towers: features, class-prompt text embeddings, tile (crop)
embeddings, resuming, and the records (random tiny towers, generated images, CPU)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from helpers_images import make_dataset
from PIL import Image

from featcache.backbones.inputs import grid_tiles
from featcache.backbones.registry import create_backbone, create_text_tower
from featcache.backbones.transforms import image_transform
from featcache.data.featurefile import load_features, read_feature_attrs, read_text_embeddings
from featcache.errors import InputError, OptionError, OutputExistsError
from featcache.features import extraction as extraction_module
from featcache.features.extract import ExtractOptions, extract_features

pytest.importorskip("timm")
pytest.importorskip("open_clip")

SIZE = 32


@pytest.fixture
def toy(tmp_path):
    labels = make_dataset(tmp_path, num_train=10, num_test=4, num_classes=3, size=(56, 44))
    return tmp_path, labels


def options(tmp_path, **overrides) -> ExtractOptions:
    base = dict(backbone="test-clip", weights="random", image_size=SIZE, batch_size=4,
                chunk_rows=8, workers=0, device="cpu", cache=str(tmp_path / "cache"))
    base.update(overrides)
    return ExtractOptions(**base)


def image(tmp_path, relpath) -> Image.Image:
    with Image.open(tmp_path / "images" / relpath) as im:
        return im.convert("RGB")


def features_images(path) -> list[str]:
    with h5py.File(path, "r") as h5:
        return list(h5["train/images"].asstr()[()])


def test_clip_features_text_and_crops_are_the_towers_outputs(toy):
    tmp_path, labels_path = toy
    result = extract_features("toy", options(tmp_path, text=True, crops=2,
                                             prompts=("a photo of a {}.", "a picture of a {}.")),
                              say=lambda _: None)
    assert result.status == "written" and result.path.name == "features-test-clip-random.h5"
    features = load_features(result.path)
    trunk = create_backbone("test-clip", "random", image_size=SIZE)
    transform = image_transform(SIZE, backbone="test-clip")
    first = features.attrs
    with h5py.File(result.path, "r") as h5:
        crops = h5["train/crops"][()]
        assert "crops" not in h5["test"]
    relpath = features_images(result.path)[3]
    picture = image(tmp_path, relpath)
    with torch.no_grad():
        expected = trunk(transform(picture)[None])[0].numpy()
        tiles = trunk(torch.stack([transform(t) for t in grid_tiles(picture, 2)])).numpy()
    np.testing.assert_allclose(features.train[3], expected, rtol=1e-5, atol=1e-5)
    assert crops.shape == (10, 4, 32)
    np.testing.assert_allclose(crops[3], tiles, rtol=1e-5, atol=1e-5)

    text = read_text_embeddings(result.path)
    assert text.embeddings.shape == (3, 32) and text.classes == ["class0", "class1", "class2"]
    tower = create_text_tower("test-clip", "random", image_size=SIZE)
    with torch.no_grad():
        per_template = torch.nn.functional.normalize(
            tower(["a photo of a class1.", "a picture of a class1."]), dim=-1)
    expected_text = torch.nn.functional.normalize(per_template.mean(0), dim=0).numpy()
    np.testing.assert_allclose(text.embeddings[1], expected_text, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(text.embeddings, axis=1), 1.0, rtol=1e-6)

    assert first["library"] == "open_clip" and first["pooling"] == "token"
    assert first["crops_grid"] == 2 and first["text"]["templates"] == [
        "a photo of a {}.", "a picture of a {}."]
    assert first["transform"]["crop"] == {"center": [SIZE, SIZE]}
    assert first["attention"] == "torch.nn.functional.scaled_dot_product_attention"


def test_tiles_follow_aevlps_grid():
    picture = Image.fromarray(np.arange(10 * 7 * 3, dtype=np.uint8).reshape(7, 10, 3))
    tiles = grid_tiles(picture, 3)  # tw = 10 // 3 = 3, th = 7 // 3 = 2; row-major
    assert len(tiles) == 9 and all(t.size == (3, 2) for t in tiles)
    array = np.asarray(picture)
    assert np.array_equal(np.asarray(tiles[5]), array[2:4, 6:9])  # row 1, column 2


@pytest.mark.slow  # interrupts an extraction, then resumes it
def test_interrupted_run_with_crops_resumes_to_the_same_file(toy, monkeypatch):
    tmp_path, _ = toy
    shutil.copytree(tmp_path / "cache", tmp_path / "a")
    shutil.copytree(tmp_path / "cache", tmp_path / "b")
    whole = extract_features("toy", options(tmp_path, crops=2, cache=str(tmp_path / "a")),
                             say=lambda _: None).path
    real = extraction_module.write_shard
    calls = []

    def stop_after_first(store, chunk, *args):
        real(store, chunk, *args)
        calls.append(chunk)
        raise KeyboardInterrupt

    monkeypatch.setattr(extraction_module, "write_shard", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        extract_features("toy", options(tmp_path, crops=2, cache=str(tmp_path / "b")),
                         say=lambda _: None)
    monkeypatch.setattr(extraction_module, "write_shard", real)
    messages = []
    resumed = extract_features("toy", options(tmp_path, crops=2, cache=str(tmp_path / "b")),
                               say=messages.append)
    assert resumed.resumed_chunks == 1 and any("resuming" in m for m in messages)
    with h5py.File(whole, "r") as a, h5py.File(resumed.path, "r") as b:
        for key in ("train/features", "test/features", "train/crops"):
            assert np.array_equal(a[key][()], b[key][()]), key


def test_text_is_added_to_an_up_to_date_file_and_crops_need_a_new_extraction(toy):
    tmp_path, _ = toy
    path = extract_features("toy", options(tmp_path), say=lambda _: None).path
    before = load_features(path)
    messages = []
    added = extract_features("toy", options(tmp_path, text=True), say=messages.append)
    assert added.status == "text-added" and "embeddings added (3 classes)" in added.summary()
    assert not any("embeddings added" in m for m in messages)  # a result: the summary says it
    after = load_features(path)
    assert np.array_equal(before.train, after.train)
    assert read_text_embeddings(path).embeddings.shape == (3, 32)
    again = extract_features("toy", options(tmp_path, text=True), say=lambda _: None)
    assert again.status == "up-to-date"
    with pytest.raises(OutputExistsError, match="crops_grid: None -> 2"):
        extract_features("toy", options(tmp_path, crops=2), say=lambda _: None)


def test_given_text_embeddings_and_class_names(toy):
    tmp_path, _ = toy
    given = np.arange(3 * 32, dtype=np.float32).reshape(3, 32) + 1
    np.save(tmp_path / "text.npy", given)
    path = extract_features("toy", options(tmp_path, text=True,
                                           text_embeddings=str(tmp_path / "text.npy")),
                            say=lambda _: None).path
    text = read_text_embeddings(path)
    np.testing.assert_allclose(text.embeddings, given / np.linalg.norm(given, axis=1, keepdims=True),
                               rtol=1e-6)
    assert text.attrs["source"].startswith("file ") and len(text.attrs["sha256"]) == 64
    np.save(tmp_path / "wrong.npy", given[:, :8])
    with pytest.raises(InputError, match=r"has shape \(3, 8\); expected \(3, 32\)"):
        extract_features("toy", options(tmp_path, text=True, overwrite=True,
                                        text_embeddings=str(tmp_path / "wrong.npy")),
                         say=lambda _: None)
    (tmp_path / "names.txt").write_text("red thing\nblue thing\n")
    with pytest.raises(InputError, match="has 2 names but the labels file has 3 classes"):
        extract_features("toy", options(tmp_path, text=True, overwrite=True,
                                        class_names=str(tmp_path / "names.txt")),
                         say=lambda _: None)


def test_option_errors(toy):
    tmp_path, _ = toy
    with pytest.raises(OptionError, match="test-vit has no text tower"):
        extract_features("toy", options(tmp_path, backbone="test-vit", text=True), say=print)
    with pytest.raises(OptionError, match="must contain the class name placeholder"):
        extract_features("toy", options(tmp_path, text=True, prompts=("a photo",)), say=print)
    with pytest.raises(OptionError, match="not a multiple of test-clip's patch size 16"):
        extract_features("toy", options(tmp_path, image_size=40), say=print)
    result = invoke("features", "--dataset", "toy", "--cache", str(tmp_path / "cache"),
                    "--backbone", "test-clip", "--crops", "4x3")
    assert result.exit_code != 0 and "not a square grid GxG" in result.output


def test_protocol_preprocessing_gets_its_own_file(toy):
    tmp_path, _ = toy
    native = extract_features("toy", options(tmp_path), say=lambda _: None)
    protocol = extract_features("toy", options(tmp_path, preprocess="protocol"), say=lambda _: None)
    assert protocol.path.name == "features-test-clip-random-protocol.h5"
    attrs = read_feature_attrs(protocol.path)
    assert attrs["transform"]["resize"] == [SIZE, SIZE] and attrs["preprocess"] == "protocol"
    assert not np.array_equal(load_features(native.path).train, load_features(protocol.path).train)


def test_timm_tower_with_a_bad_image_flags_nan_crops(tmp_path):
    make_dataset(tmp_path, num_train=6, num_test=2, num_classes=3, kinds={2: "truncated"})
    result = extract_features("toy", options(tmp_path, backbone="test-vit", crops=2,
                                             skip_bad=True), say=lambda _: None)
    with h5py.File(result.path, "r") as h5:
        crops = h5["train/crops"][()]
        assert h5["train/bad"][2] == 1
    assert np.isnan(crops[2]).all() and np.isfinite(np.delete(crops, 2, axis=0)).all()
