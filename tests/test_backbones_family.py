"""Backbone families: found by listing the package, a new library is one file, and weights
files are hashed once per command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from featcache.backbones import registry, weightsource
from featcache.backbones.family import FAMILY_SUFFIX, families, family_named
from featcache.backbones.weights import WeightsChoice, describe_weights, locate_weights
from featcache.errors import OptionError

REPO = Path(__file__).resolve().parents[1]

# A whole family in one file: a one-layer convolutional "library" with one backbone.
TOY_FAMILY = '''
import torch
from torch import nn

from featcache.backbones.family import BackboneFamily, BackboneSpec, Trunk
from featcache.backbones.weightsource import file_source


class ToyTrunk(Trunk):
    def __init__(self, dim):
        super().__init__()
        self.conv = nn.Conv2d(3, dim, 4, stride=4)

    def feature_map(self, x):
        return self.conv(x)

    def forward(self, x):
        return self.feature_map(x).mean((2, 3))


class ToyFamily(BackboneFamily):
    name = "toylib"

    def installed(self):
        return True

    def specs(self):
        return (BackboneSpec("toy-net", 8, library=self.name, default_weights="random",
                             default_image_size=16, summary="a toy"),)

    def tags(self, spec):
        return []

    def weights_choices(self, spec):
        return ["random"]

    def describe_weights(self, spec, value):
        return file_source(__import__("pathlib").Path(value), self.name)

    def locate_weights(self, source, download):
        return source

    def cache_entry(self, source):
        return {}

    def build(self, spec, image_size, source):
        trunk = ToyTrunk(spec.dim)
        if source is not None:
            trunk.load_state_dict(torch.load(source.path))
        return trunk


FAMILY = ToyFamily()
'''


def test_every_family_module_is_found_and_each_spec_names_its_family():
    package = REPO / "featcache" / "backbones"
    modules = {path.stem for path in package.glob(f"*{FAMILY_SUFFIX}.py")}
    assert modules == {"torchvision_nets", "timm_nets", "openclip_nets"}
    assert {family.name for family in families()} == {"torchvision", "timm", "open_clip"}
    for name in registry.backbone_names():
        spec = registry.backbone_spec(name)
        assert spec.family is family_named(spec.library)
        assert spec in spec.family.specs()
    with pytest.raises(OptionError, match="no backbone family for library 'nope'.*_nets.py"):
        family_named("nope")


def test_a_new_family_is_one_file(tmp_path):
    """A ``*_nets`` module beside the others (here a second folder of the package) is picked
    up: its backbone is registered, built with random weights or a file, and rebuilt."""
    (tmp_path / "toy_nets.py").write_text(TOY_FAMILY)
    code = f'''
import torch
import featcache.backbones as package
package.__path__.append({str(tmp_path)!r})
from featcache.backbones import backbone_names, create_backbone
from featcache.backbones.rebuild import trunk_for_features, trunk_from_state
assert "toy-net" in backbone_names(), backbone_names()
trunk = create_backbone("toy-net")
assert trunk(torch.zeros(2, 3, 16, 16)).shape == (2, 8)
assert trunk.weights_identity["weights"] == "random" and trunk.pooling == "avg"
torch.save(trunk.state_dict(), {str(tmp_path / "toy.pt")!r})
again = trunk_for_features(dict(trunk.weights_identity, backbone="toy-net", weights_seed=0), "run")
assert torch.equal(again.conv.weight, trunk.conv.weight)
loaded = create_backbone("toy-net", {str(tmp_path / "toy.pt")!r})
assert loaded.weights_identity["weights"] == "file"
state = {{"trunk." + k: v for k, v in trunk.state_dict().items()}}
assert torch.equal(trunk_from_state("toy-net", state, "run").conv.bias, trunk.conv.bias)
print("OK")
'''
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OK"


def test_a_weights_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "my.pth"
    torch.save({"w": torch.zeros(3)}, path)
    calls = []
    real = weightsource.sha256_file
    monkeypatch.setattr(weightsource, "sha256_file", lambda p: calls.append(p) or real(p))
    spec = registry.backbone_spec("resnet18")
    first = describe_weights(spec, str(path))
    assert locate_weights(first) is first  # a file given by path is ready as it is
    assert describe_weights(spec, str(path)) == first and len(calls) == 1
    torch.save({"w": torch.ones(5)}, path)
    os.utime(path, ns=(1, 1))  # a new size and time: hashed again
    second = describe_weights(spec, str(path))
    assert len(calls) == 2 and second.sha256 != first.sha256
    assert second.sha256 == real(path)


def test_weights_choice_describes_once_per_backbone(tmp_path):
    path = tmp_path / "ckpt.pth"
    torch.save({"w": torch.zeros(2)}, path)
    choice = WeightsChoice(str(path))
    resnet18, resnet50 = registry.backbone_spec("resnet18"), registry.backbone_spec("resnet50")
    assert choice.given and choice.source(resnet18) is choice.source(resnet18)
    assert choice.recorded_in(resnet50, {"weights": "file", "weights_sha256": choice.source(resnet50).sha256})
    assert not choice.recorded_in(resnet50, {"weights": "file", "weights_sha256": "0" * 64})
    named = WeightsChoice("v2")
    assert named.recorded_in(resnet50, {"weights": "IMAGENET1K_V2"})
    assert not named.recorded_in(resnet50, {"weights": "IMAGENET1K_V1"})
    assert WeightsChoice().recorded_in(resnet50, {"weights": "anything"})
    with pytest.raises(OptionError, match="unknown --weights 'v9' for resnet50"):
        WeightsChoice("v9").source(resnet50)
