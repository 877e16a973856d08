"""Images decode exactly like ``Image.open(p).convert("RGB")``; bad ones are named, not zeroed."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from helpers_images import BAD_KINDS, GOOD_KINDS, write_image
from PIL import Image, ImageFile

from featcache.backbones import inputs
from featcache.backbones.transforms import resize_transform
from featcache.data import images as imgs


@pytest.mark.parametrize("kind", GOOD_KINDS)
def test_every_kind_decodes_like_pil_convert_rgb(tmp_path, kind):
    path = write_image(tmp_path / f"a.{kind}", kind, seed=7)
    expected = Image.open(path).convert("RGB")
    decoded = imgs.load_rgb(path)
    assert decoded.mode == "RGB"
    assert np.array_equal(np.asarray(decoded), np.asarray(expected))
    dataset = inputs.ImageRows(tmp_path, [path.name], image_size=40)
    image, row, ok = dataset[0]
    assert (row, ok) == (0, True)
    assert image.dtype == torch.uint8 and image.shape == (3, 40, 40)
    assert torch.equal(image, resize_transform(40)(expected))
    assert imgs.image_problem(path) is None


def test_exif_orientation_is_not_applied(tmp_path):
    path = write_image(tmp_path / "rotated.jpg", "exif", size=(60, 30))
    with Image.open(path) as raw:
        assert raw.getexif().get(0x0112) == 6
    assert imgs.load_rgb(path).size == (60, 30)  # as stored, like the reference


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_files_are_flagged_with_a_reason(tmp_path, kind):
    path = write_image(tmp_path / "bad.jpg", kind)
    image, row, ok = inputs.ImageRows(tmp_path, ["bad.jpg"], image_size=32)[0]
    assert ok is False and row == 0
    assert int(image.abs().sum()) == 0
    problem = imgs.image_problem(path)
    assert problem is not None
    if kind == "empty":
        assert "empty" in problem
    else:
        assert "cannot be decoded" in problem


def test_missing_file_is_flagged(tmp_path):
    assert inputs.ImageRows(tmp_path, ["nope.jpg"], image_size=32)[0][2] is False
    assert imgs.image_problem(tmp_path / "nope.jpg") == "file does not exist"


def test_truncated_images_are_never_silently_padded(tmp_path, monkeypatch):
    path = write_image(tmp_path / "cut.jpg", "truncated")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.warns(RuntimeWarning, match="LOAD_TRUNCATED_IMAGES"):
        problem = imgs.image_problem(path)
    assert "truncated" in problem
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_device_decode_path_on_the_cpu(tmp_path):
    """--gpu-decode's logic: plain JPEGs travel as bytes, others are decoded with PIL; the
    device decode is close to PIL's (different IDCT and resize), and a bad JPEG is not ok."""
    kinds = ["jpeg", "png_alpha", "cmyk", "gray", "truncated"]
    names = [write_image(tmp_path / f"{i}.img", kind, seed=i, size=(80, 60)).name
             for i, kind in enumerate(kinds)]
    dataset = inputs.JpegBytesRows(tmp_path, names, image_size=48)
    items = [dataset[i] for i in range(len(names))]
    assert [item[3] for item in items] == [True, False, False, True, False]
    assert [item[2] for item in items] == [True, True, True, True, False]
    batch = inputs.collate_jpeg_rows(items)
    assert batch.decoded.shape == (3, 3, 48, 48)  # the three that PIL decoded in the worker
    assert [bytes(v.numpy()) for v in batch.jpeg_views()] == [
        (tmp_path / names[i]).read_bytes() for i in (0, 3)]
    images, decoded = inputs.decode_on_device(batch, 48, torch.device("cpu"))
    assert images.shape == (5, 3, 48, 48) and images.dtype == torch.uint8
    assert decoded.all()
    for i in range(4):
        reference = resize_transform(48)(Image.open(tmp_path / names[i]).convert("RGB"))
        assert (images[i].float() - reference.float()).abs().mean() < 3.0, kinds[i]
    assert torch.equal(images[1], resize_transform(48)(Image.open(tmp_path / names[1]).convert("RGB")))
    assert int(images[4].sum()) == 0  # the truncated file: zeros, flagged by the worker


def test_device_decode_resizes_each_size_group_at_once_like_one_by_one(tmp_path):
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    sizes = [(80, 60), (64, 48), (80, 60), (64, 48), (80, 60)]
    names = [write_image(tmp_path / f"{i}.jpg", "jpeg", seed=i, size=size).name
             for i, size in enumerate(sizes)]
    items = [inputs.JpegBytesRows(tmp_path, names, image_size=40)[i] for i in range(len(names))]
    batch = inputs.collate_jpeg_rows(items)
    images, decoded = inputs.decode_on_device(batch, 40, torch.device("cpu"))
    assert decoded.all()
    for i, view in enumerate(batch.jpeg_views()):
        one = F.resize(decode_jpeg(view.clone(), mode=ImageReadMode.RGB), [40, 40], antialias=True)
        assert torch.equal(images[i], one), i


def test_one_undecodable_jpeg_fails_alone_and_the_others_decode(tmp_path, monkeypatch):
    """The batched call fails for the whole batch (as nvJPEG's does): each image is then decoded
    on its own, and only the bad one is not ok."""
    names = [write_image(tmp_path / f"{i}.jpg", "jpeg", seed=i, size=(64, 48)).name for i in range(3)]
    items = [inputs.JpegBytesRows(tmp_path, names, image_size=32)[i] for i in range(3)]
    broken = bytearray(items[1][0])
    broken[200:260] = b"\xff" * 60  # garbage in the entropy-coded data: no decoder reads it
    items[1] = (bytes(broken), *items[1][1:])
    calls = []
    one_by_one = inputs._decode_one
    monkeypatch.setattr(inputs, "_decode_one", lambda data, device: calls.append(1) or one_by_one(data, device))
    images, decoded = inputs.decode_on_device(inputs.collate_jpeg_rows(items), 32, torch.device("cpu"))
    assert len(calls) == 3 and decoded.tolist() == [True, False, True]
    assert int(images[1].sum()) == 0
    alone, _ = inputs.decode_on_device(inputs.collate_jpeg_rows(items[2:]), 32, torch.device("cpu"))
    assert torch.equal(images[2], alone[0])


def test_device_decoder_pipeline_yields_every_batch_in_order(tmp_path):
    from torch.utils.data import DataLoader

    names = [write_image(tmp_path / f"{i}.jpg", "jpeg", seed=i, size=(50 + i, 40)).name
             for i in range(7)]
    dataset = inputs.JpegBytesRows(tmp_path, names, image_size=32)
    for workers, ahead in ((0, 1), (2, 2), (0, 5)):
        loader = DataLoader(dataset, batch_size=3, collate_fn=inputs.collate_jpeg_rows,
                            num_workers=workers)
        got = list(inputs.DeviceDecoder(loader, 32, torch.device("cpu"), ahead=ahead))
        assert [rows.tolist() for _, rows, _ in got] == [[0, 1, 2], [3, 4, 5], [6]]
        for images, rows, ok in got:
            assert ok.all()
            expected, _ = inputs.decode_on_device(
                inputs.collate_jpeg_rows([dataset[r] for r in rows.tolist()]), 32, torch.device("cpu"))
            assert torch.equal(images, expected)


def test_device_decoder_decodes_ahead_on_its_own_thread(tmp_path, monkeypatch):
    """While the consumer holds batch i, batches i + 1 .. i + ahead are decoded (on the helper
    thread, not the one that runs the forward pass), and no further: the overlap's structure."""
    import threading

    from torch.utils.data import DataLoader

    names = [write_image(tmp_path / f"{i}.jpg", "jpeg", seed=i, size=(40, 30)).name for i in range(10)]
    loader = DataLoader(inputs.JpegBytesRows(tmp_path, names, image_size=32), batch_size=2,
                        collate_fn=inputs.collate_jpeg_rows)
    decoded, threads = [], set()
    real = inputs.decode_on_device

    def recording(batch, *args, **kwargs):
        threads.add(threading.current_thread().name)
        out = real(batch, *args, **kwargs)
        decoded.append(batch.rows[0].item() // 2)
        return out

    monkeypatch.setattr(inputs, "decode_on_device", recording)
    batches = iter(inputs.DeviceDecoder(loader, 32, torch.device("cpu"), ahead=2))
    for step in range(5):
        _, rows, _ = next(batches)
        assert rows[0].item() // 2 == step
        time.sleep(0.2)  # the consumer's forward pass
        assert decoded == list(range(min(step + 3, 5))), (step, decoded)  # i, i + 1, i + 2
    assert threads and all(name.startswith("featcache-decode") for name in threads)
    assert next(batches, None) is None


def test_worker_batches_pack_their_bytes_in_one_shared_buffer(tmp_path):
    """In a worker the packed bytes are allocated in shared memory: a batch crosses to the main
    process as a handful of tensors, not one per image."""
    from torch.utils.data import DataLoader

    names = [write_image(tmp_path / f"{i}.jpg", "jpeg", seed=i, size=(40, 30)).name for i in range(4)]
    loader = DataLoader(inputs.JpegBytesRows(tmp_path, names, image_size=32), batch_size=4,
                        collate_fn=_collate_and_report_sharing, num_workers=1)
    batch, shared = next(iter(loader))
    assert shared and isinstance(batch, inputs.JpegBatch)
    assert [bytes(v.numpy()) for v in batch.jpeg_views()] == [(tmp_path / n).read_bytes() for n in names]


def _collate_and_report_sharing(items):
    batch = inputs.collate_jpeg_rows(items)
    return batch, batch.data.is_shared()


def test_jpeg_draft_decodes_large_jpegs_at_a_reduced_scale(tmp_path):
    path = write_image(tmp_path / "big.jpg", "jpeg", seed=3, size=(400, 300))
    full = imgs.load_rgb(path)
    assert imgs.load_rgb(path, draft=(140, 140)).size == (200, 150)  # 1/2 keeps >= 140 x 140
    assert imgs.load_rgb(path, draft=(160, 160)).size == (400, 300)  # 1/2 would be too small
    small = inputs.ImageRows(tmp_path, ["big.jpg"], image_size=140, draft=True)[0][0]
    reference = resize_transform(140)(full)
    assert small.shape == reference.shape and not torch.equal(small, reference)
    assert (small.float() - reference.float()).abs().mean() < 4.0  # close, not equal
    png = write_image(tmp_path / "big.png", "png", seed=3, size=(400, 300))
    assert imgs.load_rgb(png, draft=(140, 140)).size == (400, 300)  # only JPEGs are drafted


def test_loader_prefetch_fits_the_batches_in_shared_memory(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from featcache.errors import FeatcacheError

    free = {"bytes": 10_000}
    monkeypatch.setattr(inputs.shutil, "disk_usage", lambda path: SimpleNamespace(free=free["bytes"]))
    assert inputs.loader_prefetch(100, workers=0, wanted=2) is None
    assert inputs.loader_prefetch(100, workers=4, wanted=2) == 2  # 800 of 5,000 planned bytes
    assert inputs.loader_prefetch(1000, workers=2, wanted=4) == 2  # 5,000 // 2,000
    assert inputs.loader_prefetch(1000, workers=2, wanted=4, ranks_here=2) == 1
    free["bytes"] = 3_000
    with pytest.raises(FeatcacheError, match=r"has 0 MB free.*2 workers.*--shm-size=1g"):
        inputs.loader_prefetch(1000, workers=2, wanted=2)
    monkeypatch.setattr(inputs.shutil, "disk_usage", _no_shm)
    assert inputs.loader_prefetch(1000, workers=2, wanted=2) == 2  # nothing to plan against
    assert inputs.uint8_batch_bytes(256, 448) == 154_140_672  # the batch, as uint8


def _no_shm(path):
    raise FileNotFoundError(path)
