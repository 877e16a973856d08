"""Backbone registry, pooled-feature trunk and the protocol's image transform."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from helpers_images import pattern
from PIL import Image
from torchvision import transforms

from featcache.backbones.preprocess import IMAGENET_MEAN, IMAGENET_STD
from featcache.backbones.registry import (
    backbone_names,
    backbone_spec,
    create_backbone,
    state_sha256,
)
from featcache.backbones.transforms import Uint8Normalize, image_transform, resize_transform
from featcache.errors import OptionError


@pytest.fixture(scope="module")
def resnet50_random():
    return create_backbone("resnet50", "random")


def test_registry_lists_resnet50_with_its_contract():
    assert "resnet50" in backbone_names()
    spec = backbone_spec("resnet50")
    assert spec.dim == 2048
    assert spec.default_weights == "v1"
    assert spec.weights_member("v1").name == "IMAGENET1K_V1"
    assert spec.weights_member("v2").name == "IMAGENET1K_V2"
    assert spec.weights_member("v1").url.endswith("/resnet50-0676ba61.pth")


def test_unknown_backbone_is_an_option_error_listing_choices():
    with pytest.raises(OptionError, match="unknown backbone 'vgg99'.*resnet50"):
        backbone_spec("vgg99")


def test_trunk_maps_a_batch_to_pooled_2048_d_float32(resnet50_random):
    with torch.inference_mode():
        out = resnet50_random(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 2048)
    assert out.dtype == torch.float32
    assert not resnet50_random.training
    assert resnet50_random.weights_identity["weights"] == "random"
    assert resnet50_random.weights_identity["weights_seed"] == 0


def test_trunk_equals_torchvision_resnet_without_its_classifier(resnet50_random):
    """Same state dict keys as torchvision (minus fc) and the same numbers as its forward."""
    net = torchvision.models.resnet50()
    missing = net.load_state_dict(resnet50_random.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["fc.bias", "fc.weight"]
    net.fc = torch.nn.Identity()
    net.eval()
    x = torch.randn(3, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(resnet50_random(x), net(x))


def test_random_weights_are_seeded(resnet50_random):
    again = create_backbone("resnet50", "random", seed=0)
    other = create_backbone("resnet50", "random", seed=1)
    assert state_sha256(again) == state_sha256(resnet50_random)
    assert again.weights_identity["weights_sha256"] == resnet50_random.weights_identity["weights_sha256"]
    assert state_sha256(other) != state_sha256(resnet50_random)


def test_transform_is_resize_without_crop_then_imagenet_normalize():
    steps = image_transform(448).transforms
    assert [type(s) for s in steps] == [transforms.Resize, transforms.ToTensor, transforms.Normalize]
    assert steps[0].size == (448, 448)
    assert tuple(steps[2].mean) == IMAGENET_MEAN and tuple(steps[2].std) == IMAGENET_STD
    train_steps = image_transform(448, train=True).transforms
    assert isinstance(train_steps[1], transforms.RandomHorizontalFlip)
    assert train_steps[1].p == 0.5
    out = image_transform(64)(Image.fromarray(pattern(3, size=(90, 40))))
    assert out.shape == (3, 64, 64)  # squashed, not cropped


def test_split_transform_gives_exactly_the_full_transforms_values():
    """Resizing to uint8 in the workers and normalising on the device changes no bit."""
    images = [Image.fromarray(pattern(seed, size=(57, 41))) for seed in range(4)]
    full = torch.stack([image_transform(48)(im) for im in images])
    split = Uint8Normalize()(torch.stack([resize_transform(48)(im) for im in images]))
    assert split.dtype == torch.float32
    assert torch.equal(full, split)
    assert np.isfinite(split.numpy()).all()


def test_pooled_features_are_the_feature_map_averaged(resnet50_random):
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        spatial = resnet50_random.feature_map(x)
        pooled = resnet50_random(x)
    assert spatial.shape == (2, 2048, 2, 2)
    torch.testing.assert_close(pooled, spatial.float().mean(dim=(2, 3)), rtol=1e-6, atol=1e-6)
