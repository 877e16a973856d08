"""Stage one's decoder: the choice of auto, explicit flags, and files on disk kept as they are."""

from __future__ import annotations

import h5py
import pytest
from click.testing import CliRunner
from helpers_images import make_dataset

from featcache.backbones.decoders import recorded_decoder
from featcache.backbones.transforms import preprocess_mode, transform_description
from featcache.cli import cli
from featcache.errors import InputError, OutputExistsError
from featcache.features import extraction as extraction_module
from featcache.features.decoder import (
    DecoderChoice,
    Recorded,
    choose_decoder,
    recorded_on_disk,
)
from featcache.features.extract import ExtractOptions, extract_features
from featcache.features.shards import parts_dir
from featcache.finetune.start import check_transform, decoder_note

pytestmark = pytest.mark.usefixtures("reuse_model")


def _never() -> bool:
    raise AssertionError("the images were sampled although the choice did not depend on them")


def test_auto_decodes_jpegs_on_cuda_only_and_flags_win():
    assert choose_decoder("cuda", None) == DecoderChoice("device", "default")
    assert choose_decoder("cpu", None, has_jpegs=_never) == DecoderChoice("pil", "cpu")
    assert choose_decoder("cpu", None, jpeg_draft=True, has_jpegs=_never).decode == "pil-draft"
    assert choose_decoder("cuda", None, jpeg_draft=True, has_jpegs=_never) == DecoderChoice("pil-draft", "draft")
    assert choose_decoder("cuda", None, crops=True, has_jpegs=_never) == DecoderChoice("pil", "crops")
    assert choose_decoder("cuda", None, has_jpegs=lambda: False) == DecoderChoice("pil", "no-jpeg")
    # explicit flags, whatever is on disk (the up-to-date check then says what differs)
    pil_file, device_work = Recorded("pil", "file"), Recorded("device", "work")
    assert choose_decoder("cpu", True, has_jpegs=_never) == DecoderChoice("device", "asked")
    assert choose_decoder("cuda", True, recorded=pil_file, has_jpegs=_never).decode == "device"
    assert choose_decoder("cuda", False, recorded=device_work, has_jpegs=_never) == DecoderChoice("pil", "asked")
    assert choose_decoder("cuda", False, jpeg_draft=True, has_jpegs=_never).decode == "pil-draft"


def test_auto_keeps_the_decoder_on_disk():
    assert choose_decoder("cuda", None, recorded=Recorded("pil", "file"), has_jpegs=_never) == \
        DecoderChoice("pil", "file")
    assert choose_decoder("cuda", None, recorded=Recorded("pil", "work"), has_jpegs=_never) == \
        DecoderChoice("pil", "work")
    assert choose_decoder("cuda", None, recorded=Recorded("device", "file"), has_jpegs=_never) == \
        DecoderChoice("device", "file")
    # a record auto cannot follow (--jpeg-draft's without the flag, an unreadable file): the
    # default, and the up-to-date check refuses the file naming the difference, as before
    assert choose_decoder("cuda", None, recorded=Recorded("pil-draft", "file")).reason == "default"
    assert choose_decoder("cuda", None, recorded=Recorded(None, "file")).reason == "default"
    # the CPU keeps PIL, as before: a device-made file is refused there as it always was
    assert choose_decoder("cpu", None, recorded=Recorded("device", "file")).decode == "pil"


@pytest.mark.parametrize("preprocess", ["native", "protocol"])
@pytest.mark.parametrize("decode", ["pil", "pil-draft", "device"])
def test_the_transform_records_its_decoder_and_preprocessing(decode, preprocess):
    description = transform_description(224, "clip-vit-b16", decode, preprocess)
    assert recorded_decoder(description) == decode
    assert preprocess_mode(description, "clip-vit-b16", 224) == preprocess
    assert recorded_decoder({"decode": "something else"}) is None and recorded_decoder({}) is None


def test_linearinit_accepts_device_features_with_a_note_and_refuses_draft():
    device = {"transform": transform_description(64, "resnet50", "device")}
    assert check_transform(device, "run R", None, "resnet50") == (64, "native")
    assert "decoded on the GPU" in decoder_note(device, "run R")
    assert "--pil-decode" in decoder_note(device, "run R")
    assert decoder_note({"transform": transform_description(64, "resnet50")}, "run R") is None
    draft = {"transform": transform_description(64, "resnet50", "pil-draft")}
    with pytest.raises(InputError, match="without --jpeg-draft"):
        check_transform(draft, "run R", None, "resnet50")


def options(tmp_path, **overrides) -> ExtractOptions:
    base = dict(weights="random", image_size=32, batch_size=4, chunk_rows=4, workers=0,
                device="cpu", cache=str(tmp_path / "cache"))
    return ExtractOptions(**dict(base, **overrides))


@pytest.fixture
def as_if_on_cuda(monkeypatch):
    """The engine's decision as on a CUDA machine; the run itself stays on the CPU (where the
    device decoder's path runs too, with torchvision's CPU decoder)."""
    real = extraction_module.choose_decoder
    monkeypatch.setattr(extraction_module, "choose_decoder",
                        lambda _device_type, *args, **kwargs: real("cuda", *args, **kwargs))


def read_file(path):
    with h5py.File(path, "r") as h5:
        return h5["train/features"][()], h5.attrs["transform"]


def test_pil_files_and_unfinished_pil_work_are_kept_on_cuda(tmp_path, monkeypatch, as_if_on_cuda):
    make_dataset(tmp_path, num_train=6, num_test=2)
    final = tmp_path / "cache" / "toy" / "features-resnet50-random.h5"
    real_write = extraction_module.write_shard

    def crash_after_first(store, chunk, *args):
        real_write(store, chunk, *args)
        raise KeyboardInterrupt

    # unfinished work made with PIL (--pil-decode; before this default, every run's), then the
    # same command without a flag: it resumes with PIL
    monkeypatch.setattr(extraction_module, "write_shard", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        extract_features("toy", options(tmp_path, gpu_decode=False))
    monkeypatch.setattr(extraction_module, "write_shard", real_write)
    assert recorded_on_disk(final, overwrite=False) == Recorded("pil", "work")
    at = {size: lambda decode, size=size: transform_description(size, "resnet50", decode)
          for size in (32, 64)}
    assert recorded_on_disk(final, False, at[32]) == Recorded("pil", "work")
    assert recorded_on_disk(final, False, at[64]) is None  # other settings: not resumed anyway
    messages: list[str] = []
    resumed = extract_features("toy", options(tmp_path), say=messages.append)
    assert resumed.resumed_chunks == 1 and resumed.decode == "pil"
    assert any("resuming with PIL" in m for m in messages), messages
    assert not parts_dir(final).exists()

    # the finished PIL file is up to date for the same command; identical to a plain PIL run
    assert recorded_on_disk(final, overwrite=False) == Recorded("pil", "file")
    assert extract_features("toy", options(tmp_path)).status == "up-to-date"
    with pytest.raises(OutputExistsError, match="decode_jpeg"):  # --gpu-decode: another transform
        extract_features("toy", options(tmp_path, gpu_decode=True))
    kept, transform = read_file(final)
    reference = extract_features("toy", options(tmp_path, gpu_decode=False, overwrite=True))
    again, _ = read_file(reference.path)
    assert (kept == again).all() and recorded_decoder(eval_json(transform)) == "pil"

    # --overwrite replaces the file: the default then decodes the JPEGs on the device
    messages.clear()
    replaced = extract_features("toy", options(tmp_path, overwrite=True), say=messages.append)
    assert replaced.decode == "device" and "JPEGs decoded on the device" in replaced.summary()
    assert any("decoding JPEGs on the GPU" in m for m in messages), messages
    assert recorded_decoder(eval_json(read_file(final)[1])) == "device"
    assert extract_features("toy", options(tmp_path)).status == "up-to-date"  # kept as well


def eval_json(text):
    import json

    return json.loads(text)


def test_auto_on_cuda_keeps_pil_for_a_dataset_without_jpegs(tmp_path, as_if_on_cuda):
    make_dataset(tmp_path, num_train=3, num_test=1, kinds={i: "png" for i in range(4)})
    result = extract_features("toy", options(tmp_path))
    assert result.decode == "pil"


def test_the_cli_flags_and_info(tmp_path, monkeypatch):
    make_dataset(tmp_path, num_train=3, num_test=1)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    args = ["features", "--dataset", "toy", "--weights", "random", "--image-size", "32",
            "--batch-size", "4", "--workers", "0", "--device", "cpu", "--cache", "cache"]
    refused = runner.invoke(cli, [*args, "--gpu-decode"])
    assert refused.exit_code == 2 and "--gpu-decode" in refused.output and "needs a CUDA" in refused.output
    done = runner.invoke(cli, [*args, "--pil-decode"])
    assert done.exit_code == 0, done.output
    assert "decoded with PIL" in done.output
    assert "up to date" in runner.invoke(cli, args).output  # auto on the CPU: PIL, as the file
    info = runner.invoke(cli, ["info", "cache/toy/features-resnet50-random.h5"])
    assert "| decoder " in info.output and "PIL (the protocol's decoder)" in info.output


def test_the_shipped_recipes_extract_with_pil():
    """The recipes reproduce published numbers, which were made with PIL: on a GPU too."""
    from pathlib import Path

    from featcache.pipeline import load_recipe

    steps = [step for path in sorted((Path(__file__).parents[1] / "pipelines").glob("*.toml"))
             for step in load_recipe(path).steps if step.command[0] == "features"]
    assert steps and all("--pil-decode" in step.command for step in steps)
