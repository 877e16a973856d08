"""Finding weights offline (hub cache, explicit path), and the errors when they are not there."""

from __future__ import annotations

import hashlib
import urllib.error

import pytest
import torch
import torchvision
from torchvision.models._api import Weights, WeightsEnum
from torchvision.models.resnet import BasicBlock, ResNet

from featcache.backbones import registry as backbones
from featcache.backbones.registry import BackboneSpec, backbone_spec, create_backbone
from featcache.backbones.torchvision_nets import hub_checkpoint_dir
from featcache.backbones.weights import (
    OFFLINE_ENV,
    describe_weights,
    locate_weights,
    resolve_weights,
)
from featcache.errors import InputError, OptionError


def tiny_resnet() -> ResNet:
    return ResNet(BasicBlock, [1, 1, 1, 1])


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty torch hub cache, no downloads."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv(OFFLINE_ENV, "1")
    return tmp_path / "torch" / "hub" / "checkpoints"


@pytest.fixture
def tiny(tmp_path, monkeypatch, hub):
    """A registered 'tiny' backbone whose V1 checkpoint exists (named like torchvision's files)."""
    torch.manual_seed(5)
    net = tiny_resnet()
    saved = tmp_path / "saved.pth"
    torch.save(net.state_dict(), saved)
    digest = hashlib.sha256(saved.read_bytes()).hexdigest()
    enum = WeightsEnum("TinyWeights", {
        "IMAGENET1K_V1": Weights(url=f"https://example.invalid/models/tiny-{digest[:8]}.pth",
                                 transforms=None, meta={}),
        "IMAGENET1K_V2": Weights(url="https://example.invalid/models/tiny-00000000.pth",
                                 transforms=None, meta={}),
    })
    spec = BackboneSpec("tiny", 512, tiny_resnet, enum, {"v1": "IMAGENET1K_V1", "v2": "IMAGENET1K_V2"})
    monkeypatch.setitem(backbones._REGISTRY, "tiny", spec)
    return spec, net, saved, f"tiny-{digest[:8]}.pth"


def test_aliases_and_file_tags():
    spec = backbone_spec("resnet50")
    v1, v2, rnd = (describe_weights(spec, w) for w in ("v1", "v2", "random"))
    assert (v1.kind, v1.name, v1.tag) == ("torchvision", "IMAGENET1K_V1", "")
    assert (v2.name, v2.tag) == ("IMAGENET1K_V2", "v2")
    assert v1.file_name == "resnet50-0676ba61.pth"  # derived from the enum's url
    assert v2.file_name == "resnet50-11ad3fa6.pth"
    assert describe_weights(spec, "IMAGENET1K_V1").tag == ""
    assert (rnd.kind, rnd.tag, rnd.seed) == ("random", "random", 0)
    assert describe_weights(spec, "random", seed=3).tag == "random3"


def test_unknown_name_and_missing_file_are_clear_errors(tmp_path):
    spec = backbone_spec("resnet50")
    with pytest.raises(OptionError, match="unknown --weights 'v9'.*v1, v2.*random"):
        describe_weights(spec, "v9")
    with pytest.raises(InputError, match="weights file .*nope.pth does not exist"):
        describe_weights(spec, str(tmp_path / "nope.pth"))


def test_offline_without_the_file_names_file_directory_and_url(hub):
    source = describe_weights(backbone_spec("resnet50"), "v1")
    with pytest.raises(InputError) as info:
        locate_weights(source)
    message = str(info.value)
    assert "resnet50-0676ba61.pth" in message
    assert str(hub) in message
    assert "https://download.pytorch.org/models/resnet50-0676ba61.pth" in message
    assert "--weights" in message


def test_failed_download_says_why(hub, monkeypatch):
    monkeypatch.delenv(OFFLINE_ENV)

    def no_network(url, dst, hash_prefix=None, progress=True):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    with pytest.raises(InputError, match="download failed.*Name or service not known.*put it at"):
        resolve_weights(backbone_spec("resnet50"), "v2")


def test_hub_cache_file_is_found_hashed_and_loaded(tiny, hub):
    spec, net, saved, name = tiny
    hub.mkdir(parents=True)
    (hub / name).write_bytes(saved.read_bytes())
    source = resolve_weights(spec, "v1")
    assert source.path == hub_checkpoint_dir() / name
    assert source.sha256 == hashlib.sha256(saved.read_bytes()).hexdigest()
    model = create_backbone("tiny", "v1")
    for key, value in model.state_dict().items():
        assert torch.equal(value, net.state_dict()[key]), key
    assert model.weights_identity == {
        "weights": "IMAGENET1K_V1", "weights_file": name, "weights_sha256": source.sha256,
        "weights_url": spec.weights_member("v1").url,
    }


def test_truncated_hub_file_is_refused(tiny, hub):
    spec, _, saved, name = tiny
    hub.mkdir(parents=True)
    (hub / name).write_bytes(saved.read_bytes()[:1000])
    with pytest.raises(InputError, match="corrupt or truncated.*delete it"):
        resolve_weights(spec, "v1")


def test_explicit_path_with_a_torchvision_name_counts_as_those_weights(tiny, tmp_path):
    spec, _, saved, name = tiny
    copy = tmp_path / "elsewhere" / name
    copy.parent.mkdir()
    copy.write_bytes(saved.read_bytes())
    source = describe_weights(spec, str(copy))
    assert (source.kind, source.name, source.tag, source.path) == ("torchvision", "IMAGENET1K_V1", "", copy)


def test_explicit_checkpoint_file_in_a_wrapper_with_module_prefix(tiny, tmp_path):
    spec, net, _, _ = tiny
    wrapped = tmp_path / "my run.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()
                               if not k.startswith("fc.")}, "epoch": 3}, wrapped)
    source = describe_weights(spec, str(wrapped))
    assert (source.kind, source.name, source.tag) == ("file", "file", "my_run")
    model = create_backbone("tiny", source)
    assert torch.equal(model.conv1.weight, net.conv1.weight)
    assert model.weights_identity["weights_file"] == "my run.pt"


def test_checkpoint_of_another_architecture_names_the_keys(tiny, tmp_path):
    spec, _, _, _ = tiny
    other = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), other)
    with pytest.raises(InputError, match="does not fit.*missing .*keys|unexpected keys"):
        create_backbone("tiny", str(other))


def test_unreadable_checkpoint_is_an_input_error(tiny, tmp_path):
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="cannot read weights file .*broken.pth"):
        create_backbone("tiny", str(bad))
