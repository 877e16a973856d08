"""timm and open_clip backbones: specs against the libraries, trunks, preprocessing, weights
found offline in the Hugging Face cache (random tiny towers, fake caches; no network)."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
import torch
from helpers_images import pattern
from PIL import Image

from featcache.backbones import hub
from featcache.backbones.registry import (
    backbone_names,
    backbone_spec,
    create_backbone,
    create_text_tower,
    state_sha256,
)
from featcache.backbones.transforms import (
    Uint8Normalize,
    image_transform,
    resize_transform,
    resolve_preprocess,
    transform_description,
)
from featcache.backbones.weights import OFFLINE_ENV, describe_weights, locate_weights
from featcache.errors import InputError, OptionError

timm = pytest.importorskip("timm")
open_clip = pytest.importorskip("open_clip")

REAL = ["vit-b16", "convnext-b", "dinov2-vit-b14", "dinov2-vit-l14", "clip-vit-b16",
        "clip-vit-l14", "clip-vit-l14-336", "siglip-vit-b16"]


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache; downloads off."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv(OFFLINE_ENV, "1")
    return tmp_path / "hf"


def put_in_cache(cache, repo: str, filename: str, state: dict) -> None:
    """A hub cache entry as `hf download` leaves it: snapshots/<rev>/<file> and refs/main."""
    from safetensors.torch import save_file

    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    (folder / "snapshots" / "abc123").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "snapshots" / "abc123" / filename)


# ------------------------------------------------------------------------------- the registry
def test_registry_lists_the_issue_backbones_and_hides_test_networks():
    names = backbone_names(testing=False)
    assert set(REAL) <= set(names) and "resnet50" in names
    assert not {"test-vit", "test-convnext", "test-clip"} & set(names)
    assert {"test-vit", "test-clip"} <= set(backbone_names())


@pytest.mark.parametrize("name", [n for n in REAL if backbone_spec(n).library == "timm"])
def test_timm_specs_match_timm(name):
    """Width, default weights and preprocessing as timm declares them (built on the meta device)."""
    spec = backbone_spec(name)
    cfg = timm.models.get_pretrained_cfg(f"{spec.model}.{spec.default_weights}")
    with torch.device("meta"):
        model = timm.create_model(spec.model, pretrained=False, num_classes=0)
    assert model.num_features == spec.dim
    assert (spec.preprocess.mean, spec.preprocess.std) == (tuple(cfg.mean), tuple(cfg.std))
    assert spec.preprocess.interpolation == cfg.interpolation == "bicubic"
    if name.startswith("dinov2"):
        # DINOv2's linear evaluation (resize 256, centre crop 224), not timm's 518 px default
        assert (spec.default_image_size, spec.preprocess.crop_pct) == (224, 0.875)
        assert spec.patch_size == 14
    else:
        assert (spec.preprocess.resize, spec.preprocess.crop_pct) == ("center", cfg.crop_pct)
        assert spec.default_image_size == cfg.input_size[-1]


@pytest.mark.parametrize("name", [n for n in REAL if backbone_spec(n).library == "open_clip"])
def test_open_clip_specs_match_open_clip(name):
    spec = backbone_spec(name)
    config = open_clip.get_model_config(spec.model)
    cfg = open_clip.get_pretrained_cfg(spec.model, spec.default_weights)
    assert config["embed_dim"] == spec.dim
    assert config["vision_cfg"]["image_size"] == spec.default_image_size
    assert (spec.preprocess.mean, spec.preprocess.std) == (tuple(cfg["mean"]), tuple(cfg["std"]))
    assert spec.preprocess.resize == {"shortest": "center", "squash": "squash"}[cfg["resize_mode"]]
    if spec.default_weights == "openai":
        assert config.get("quick_gelu") and cfg.get("quick_gelu")  # the QuickGELU trap avoided


def test_specs_name_the_hub_files_the_libraries_load():
    vit = describe_weights(backbone_spec("vit-b16"))
    assert (vit.kind, vit.name, vit.tag) == ("hub", "augreg2_in21k_ft_in1k", "")
    assert vit.repo == "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert vit.files == ("model.safetensors", "pytorch_model.bin")
    clip = describe_weights(backbone_spec("clip-vit-l14-336"))
    assert clip.repo == "timm/vit_large_patch14_clip_336.openai"
    assert clip.files == ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    other = describe_weights(backbone_spec("vit-b16"), "augreg_in1k")
    assert other.tag == "augreg_in1k" and other.repo.endswith(".augreg_in1k")
    with pytest.raises(OptionError, match="unknown --weights 'v1' for vit-b16.*augreg2_in21k_ft_in1k"):
        describe_weights(backbone_spec("vit-b16"), "v1")


# ------------------------------------------------------------------------------- the trunks
def test_timm_vit_trunk_pools_the_class_token_and_maps_the_patch_tokens():
    trunk = create_backbone("test-vit", "random", image_size=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        tokens = trunk.model.forward_features(x)  # (B, 1 + 16, 64), after the final norm
        pooled, spatial = trunk(x), trunk.feature_map(x)
    assert pooled.shape == (2, 64) and spatial.shape == (2, 64, 4, 4)
    assert trunk.pooling == "token" and trunk.image_size == 64
    torch.testing.assert_close(pooled, tokens[:, 0])
    torch.testing.assert_close(spatial[:, :, 1, 2], tokens[:, 1 + 1 * 4 + 2])  # row-major grid


def test_timm_convnext_trunk_is_the_norm_of_the_average():
    trunk = create_backbone("test-convnext", "random", image_size=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        raw = trunk.model.forward_features(x)
        pooled, spatial = trunk(x), trunk.feature_map(x)
    assert trunk.pooling == "avg+norm"
    expected = trunk.model.head.norm(raw.mean(dim=(2, 3), keepdim=True)).flatten(1)
    torch.testing.assert_close(pooled, expected)
    torch.testing.assert_close(spatial, trunk.model.head.norm(raw))


def test_clip_trunk_is_encode_image_and_its_map_the_projected_patch_tokens():
    trunk = create_backbone("test-clip", "random", image_size=64)
    model = open_clip.create_model("featcache-test-clip", force_image_size=64)
    model.visual.load_state_dict(trunk.visual.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        pooled, spatial = trunk(x), trunk.feature_map(x)
        encoded = model.encode_image(x)
        model.visual.output_tokens = True
        embedding, tokens = model.visual(x)  # tokens after ln_post, before the projection
    torch.testing.assert_close(pooled, encoded)
    torch.testing.assert_close(pooled, embedding)
    assert spatial.shape == (2, 32, 4, 4)
    torch.testing.assert_close(spatial.flatten(2).transpose(1, 2), tokens @ model.visual.proj)


@pytest.mark.parametrize("name", ["test-vit", "test-clip"])
def test_transformer_towers_attend_through_sdpa(name):
    from torch.profiler import ProfilerActivity, profile

    trunk = create_backbone(name, "random", image_size=32)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as trace:
        trunk(torch.randn(2, 3, 32, 32))
    ops = {event.key for event in trace.key_averages()}
    assert "aten::scaled_dot_product_attention" in ops
    assert "aten::_native_multi_head_attention" not in ops
    assert torch.backends.mha.get_fastpath_enabled()  # restored after the forward pass


def test_random_towers_are_seeded_and_sized():
    a = create_backbone("test-vit", "random", seed=0, image_size=32)
    b = create_backbone("test-vit", "random", seed=0, image_size=32)
    c = create_backbone("test-vit", "random", seed=1, image_size=32)
    assert state_sha256(a) == state_sha256(b) != state_sha256(c)
    assert a.weights_identity["weights_sha256"] == state_sha256(a)
    with pytest.raises(OptionError, match="--image-size 40 is not a multiple of test-vit's patch size 16; use 32 or 48"):
        create_backbone("test-vit", "random", image_size=40)


def test_text_tower_belongs_to_the_same_random_clip():
    trunk = create_backbone("test-clip", "random", image_size=64)
    tower = create_text_tower("test-clip", "random", image_size=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = open_clip.create_model("featcache-test-clip", force_image_size=64)
    assert torch.equal(model.visual.proj, trunk.visual.proj)
    tokens = open_clip.get_tokenizer("featcache-test-clip")(["a photo of a dog."])
    with torch.no_grad():
        torch.testing.assert_close(tower(["a photo of a dog."]), model.encode_text(tokens))
    with pytest.raises(OptionError, match="has no text tower.*clip-vit-b16"):
        create_text_tower("vit-b16", "random")


# ------------------------------------------------------------------------------- preprocessing
@pytest.mark.parametrize("name", ["vit-b16", "convnext-b"])
def test_native_preprocessing_is_timms_eval_transform(name):
    spec = backbone_spec(name)
    cfg = timm.models.get_pretrained_cfg(f"{spec.model}.{spec.default_weights}").to_dict()
    theirs = timm.data.create_transform(input_size=cfg["input_size"], interpolation="bicubic",
                                        mean=cfg["mean"], std=cfg["std"], crop_pct=cfg["crop_pct"],
                                        crop_mode=cfg["crop_mode"])
    image = Image.fromarray(pattern(1, size=(131, 90)))
    assert torch.equal(theirs(image), image_transform(224, backbone=name)(image))


@pytest.mark.parametrize("name", ["clip-vit-b16", "siglip-vit-b16"])
def test_native_preprocessing_is_open_clips_val_transform(name):
    from open_clip.transform import PreprocessCfg, image_transform_v2

    spec = backbone_spec(name)
    cfg = open_clip.get_pretrained_cfg(spec.model, spec.default_weights)
    theirs = image_transform_v2(PreprocessCfg(size=224, mean=cfg["mean"], std=cfg["std"],
                                              interpolation=cfg["interpolation"],
                                              resize_mode=cfg["resize_mode"]), is_train=False)
    image = Image.fromarray(pattern(2, size=(90, 131)))
    ours = image_transform(224, backbone=name)(image)
    assert torch.equal(theirs(image), ours)
    split = Uint8Normalize(name)(resize_transform(224, resolve_preprocess(name))(image)[None])[0]
    assert torch.equal(split, ours)  # workers' uint8 half + the device's half: the same bits


def test_protocol_preprocessing_keeps_resnet50s_description_and_differs_for_clip():
    resnet = transform_description(448, "resnet50")
    assert resnet == transform_description(448, "resnet50", preprocess="protocol")
    assert resnet["resize"] == [448, 448] and resnet["crop"] is None
    clip = transform_description(224, "clip-vit-b16")
    assert clip["resize"] == {"shorter_side": 224} and clip["crop"] == {"center": [224, 224]}
    assert transform_description(224, "clip-vit-b16", preprocess="protocol")["normalize"] == \
        resnet["normalize"]
    # --jpeg-draft may shrink a JPEG only down to what the resize needs before its crop
    assert "draft(None, (248, 248))" in transform_description(224, "vit-b16", "pil-draft")["decode"]
    assert "draft(None, (448, 448))" in transform_description(448, "resnet50", "pil-draft")["decode"]


# ------------------------------------------------------------------------------- weights
def test_weights_found_in_the_hub_cache_load_offline(hf_cache):
    """test_vit's published name, a file in a fake cache: found, hashed, loaded (the position
    embedding resampled from 160 to 32 px by timm), nothing downloaded."""
    torch.manual_seed(3)
    saved = timm.create_model("test_vit", pretrained=False)
    put_in_cache(hf_cache, "timm/test_vit.r160_in1k", "model.safetensors", saved.state_dict())
    trunk = create_backbone("test-vit", image_size=160)
    identity = trunk.weights_identity
    assert identity["weights"] == "r160_in1k"
    assert identity["weights_repo"] == "timm/test_vit.r160_in1k"
    assert identity["weights_file"] == "model.safetensors" and len(identity["weights_sha256"]) == 64
    x = torch.randn(2, 3, 160, 160)
    saved.reset_classifier(0)
    with torch.no_grad():
        torch.testing.assert_close(trunk(x), saved.eval()(x))
    small = create_backbone("test-vit", image_size=32)
    assert small.model.pos_embed.shape == (1, 1 + 4, 64)


def test_missing_weights_name_the_file_the_cache_and_the_option(hf_cache):
    with pytest.raises(InputError) as info:
        create_backbone("clip-vit-b16")
    message = str(info.value)
    assert "open_clip_model.safetensors" in message
    assert "timm/vit_base_patch16_clip_224.openai" in message
    assert str(hf_cache / "models--timm--vit_base_patch16_clip_224.openai" / "snapshots") in message
    assert "--weights /path/to/open_clip_model.safetensors" in message
    assert "FEATCACHE_OFFLINE is set" in message


def test_no_download_is_attempted_offline(hf_cache, monkeypatch):
    monkeypatch.setattr(hub, "download_file", lambda *a: pytest.fail("download attempted"))
    with pytest.raises(InputError):
        locate_weights(describe_weights(backbone_spec("vit-b16")))
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_weights_file_path_for_an_open_clip_tower(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = open_clip.create_model("featcache-test-clip")
    path = tmp_path / "tiny-clip.pt"
    torch.save(model.state_dict(), path)
    trunk = create_backbone("test-clip", str(path), image_size=64)
    assert trunk.weights_identity["weights"] == "file"
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(trunk(x), model.encode_image(x))
    broken = tmp_path / "other.pt"
    torch.save({"visual.proj": torch.zeros(3)}, broken)
    with pytest.raises(InputError, match="does not fit the test-clip backbone"):
        create_backbone("test-clip", str(broken), image_size=64)


def test_missing_extra_is_one_error_naming_it(monkeypatch):
    real_import_module = importlib.import_module

    def no_timm(name, *args, **kwargs):
        if name == "timm":
            raise ImportError("No module named 'timm'")
        return real_import_module(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_timm)
    with pytest.raises(OptionError, match=r"backbone 'test-vit' needs the timm package.*pip install "
                                          r"'featcache\[backbones\]'"):
        create_backbone("test-vit", "random")


def test_feature_values_do_not_depend_on_the_batch(tmp_path):
    trunk = create_backbone("test-clip", "random", image_size=32)
    x = torch.from_numpy(np.stack([pattern(s, size=(32, 32)) for s in range(3)])).permute(0, 3, 1, 2)
    x = x.float() / 255
    with torch.no_grad():
        together = trunk(x)
        alone = torch.cat([trunk(x[i:i + 1]) for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
