"""The torchvision family (the ResNets: the papers' ResNet-50): its specs, weights found in the
torch hub cache, build, load a weights file, cut to pooled features.

A torchvision ResNet without its ``fc`` layer is the trunk (:class:`ResNetTrunk`); a weights
file is a torchvision state dict (or one under ``state_dict``/``model``, with or without a
``module.`` prefix), loaded by :func:`load_state_dict`.

Order of search for torchvision weights (``v1`` = ``IMAGENET1K_V1``, the papers' choice):

1. the torch hub cache, ``torch.hub.get_dir()/checkpoints/<file>``, where ``<file>`` is the
   last part of the weights enum's url (``resnet50-0676ba61.pth`` for ResNet-50 V1);
2. a download through torch hub into that directory (skipped when ``$FEATCACHE_OFFLINE`` is set);
3. otherwise one error naming the file, the directory to put it in, and the url.

A file found by name is checked against the hash prefix in its name (as torch hub does), so a
truncated download is caught; a file given by path that names a torchvision checkpoint and
carries its hash counts as those torchvision weights.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import torch
import torchvision
from torch import Tensor, nn

from featcache.backbones.family import BackboneFamily, BackboneSpec, Trunk
from featcache.backbones.hub import OFFLINE_ENV, offline_hub
from featcache.backbones.weightsource import WeightsSource, file_sha256, file_source, url_file_name
from featcache.errors import InputError, OptionError, plural

#: the kind of a named torchvision checkpoint's source
TORCHVISION = "torchvision"
_HASH_IN_NAME = re.compile(r"-([a-f0-9]{6,})\.")


class ResNetTrunk(Trunk):
    """A torchvision ResNet without its ``fc`` layer: pooled, flattened features.

    The submodules keep torchvision's names (``conv1`` ... ``layer4``, ``avgpool``), so a
    torchvision state dict without ``fc.*`` loads as is. Pooling runs in float32 even under
    autocast: averaging 196 (448 px) activations in bf16 would throw away precision for nothing.

    Every trunk offers :meth:`feature_map`, the spatial map (B, D, h, w) its pooled output
    averages (the last convolutional block: 14 x 14 at 448 px), so that ``forward(x)`` is
    exactly ``feature_map(x)`` averaged over positions. A linear head over the pooled features
    applied at every position of the map gives its class activation map.
    """

    def __init__(self, net: torchvision.models.ResNet):
        super().__init__()
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = net.layer1, net.layer2, net.layer3, net.layer4
        self.avgpool = net.avgpool

    def feature_map(self, x: Tensor) -> Tensor:
        """The last convolutional block's output, (B, D, h, w), before pooling."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def pool_map(self, fmap: Tensor) -> Tensor:
        """The pooled features of a map from :meth:`feature_map` (what ``forward`` returns)."""
        return torch.flatten(self.avgpool(fmap.float()), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool_map(self.feature_map(x))


def _resnet(name: str, dim: int, weights_enum: type) -> BackboneSpec:
    return BackboneSpec(
        name=name, dim=dim, build=getattr(torchvision.models, name), weights_enum=weights_enum,
        weights_aliases={"v1": "IMAGENET1K_V1", "v2": "IMAGENET1K_V2"},
        summary="torchvision ImageNet ResNet; the protocol's transform", library=TORCHVISION,
    )


class TorchvisionFamily(BackboneFamily):
    """torchvision's ImageNet ResNets, always installed; weights in the torch hub cache."""

    name = TORCHVISION
    package = "torchvision"

    def specs(self) -> tuple[BackboneSpec, ...]:
        return (_resnet("resnet50", 2048, torchvision.models.ResNet50_Weights),
                _resnet("resnet101", 2048, torchvision.models.ResNet101_Weights),
                _resnet("resnet18", 512, torchvision.models.ResNet18_Weights))

    def tags(self, spec: BackboneSpec) -> list[str]:
        """The short aliases (``v1``) and torchvision's enum members they stand for."""
        return list(spec.weights_aliases) + [m for m in spec.weights_aliases.values()]

    def weights_choices(self, spec: BackboneSpec) -> list[str]:
        return spec.weights_names() + ["random"]

    def describe_weights(self, spec: BackboneSpec, value: str) -> WeightsSource:
        """A torchvision name (``v1``, ``IMAGENET1K_V2``) or a checkpoint path."""
        member = spec.weights_member(value)
        if member is not None and not Path(value).exists():
            return WeightsSource(TORCHVISION, member.name, _tag(spec, member.name), url=member.url,
                                 library=self.name)
        path = Path(value).expanduser()
        if not path.exists():
            if os.sep in value or path.suffix:
                raise InputError(f"weights file {path} does not exist; give the path to a checkpoint "
                                 "(.pth) or one of " + ", ".join(self.weights_choices(spec)))
            raise OptionError(f"unknown --weights {value!r} for {spec.name}; choose "
                              + ", ".join(self.weights_choices(spec)) + " or a checkpoint path")
        if not path.is_file():
            raise InputError(f"weights path {path} is not a file")
        digest = file_sha256(path)
        known = _member_for(spec, path.name, digest)
        if known is not None:
            return WeightsSource(TORCHVISION, known.name, _tag(spec, known.name), path=path,
                                 url=known.url, sha256=digest, library=self.name)
        return file_source(path, self.name, digest)

    def locate_weights(self, source: WeightsSource, download: bool | None) -> WeightsSource:
        """The torch hub cache's checkpoint (downloaded there when allowed), hash-checked."""
        name = url_file_name(source.url)
        target = hub_checkpoint_dir() / name
        if download is None:
            download = not offline_hub()
        if not target.exists():
            if not download:
                raise _missing_weights(source, target, f"${OFFLINE_ENV} is set" if offline_hub()
                                       else "downloads are off")
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                torch.hub.download_url_to_file(source.url, str(target),
                                               hash_prefix=_hash_prefix(name), progress=True)
            except Exception as exc:  # URLError, HTTPError, OSError, hash mismatch: all mean "not here"
                raise _missing_weights(source, target, f"download failed: {exc}") from exc
        digest = file_sha256(target)
        prefix = _hash_prefix(name)
        if prefix and not digest.startswith(prefix):
            raise InputError(
                f"weights file {target} is corrupt or truncated (its sha256 starts with {digest[:8]}, "
                f"its name says {prefix}); delete it and download {source.url} again"
            )
        return WeightsSource(source.kind, source.name, source.tag, path=target, url=source.url,
                             sha256=digest, seed=source.seed, library=source.library)

    def cache_entry(self, source: WeightsSource) -> dict:
        return {"torch_hub": url_file_name(source.url)}

    def build(self, spec: BackboneSpec, image_size: int, source: WeightsSource | None) -> Trunk:
        """The trunk of ``spec``'s network (``image_size`` does not matter to a ResNet)."""
        net = cast(Callable[[], nn.Module], spec.build)()  # every torchvision entry has one
        if source is not None and source.path is not None:
            load_state_dict(net, source.path)
        return (spec.trunk or ResNetTrunk)(net)

    def empty_trunk(self, spec: BackboneSpec, image_size: int) -> Trunk:
        """Drawn from the global generator, as torchvision initialises a network."""
        return self.build(spec, image_size, None)


FAMILY = TorchvisionFamily()


def hub_checkpoint_dir() -> Path:
    """``torch.hub.get_dir()/checkpoints`` (moved by ``$TORCH_HOME``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def load_state_dict(net: nn.Module, path: Path) -> None:
    """Load the checkpoint ``path`` into the full torchvision network ``net``.

    Accepts a plain state dict or one under ``state_dict``/``model``, with or without a
    ``module.`` prefix (DataParallel); the classifier (``fc.*``) may be absent. Any other
    missing or unexpected key is an error naming the keys.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and tensor errors all mean an unreadable checkpoint
        raise InputError(f"cannot read weights file {path}: {exc}") from exc
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not state:
        raise InputError(f"weights file {path} holds no state dict (got {type(state).__name__})")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    result = net.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("fc.")]
    if missing or result.unexpected_keys:
        problems = []
        if missing:
            problems.append(f"missing {plural(len(missing), 'key')} (first: {', '.join(missing[:3])})")
        if result.unexpected_keys:
            extra = result.unexpected_keys
            problems.append(f"{plural(len(extra), 'unexpected key')} (first: {', '.join(extra[:3])})")
        raise InputError(f"weights file {path} does not fit the {type(net).__name__} backbone: "
                         + "; ".join(problems))


def _tag(spec: BackboneSpec, member_name: str) -> str:
    default = spec.weights_member(spec.default_weights)
    if default is not None and default.name == member_name:
        return ""
    for alias, name in spec.weights_aliases.items():
        if name == member_name:
            return alias
    return member_name.lower()


def _hash_prefix(file_name: str) -> str:
    match = _HASH_IN_NAME.search(file_name)
    return match.group(1) if match else ""


def _member_for(spec: BackboneSpec, file_name: str, digest: str):
    """The torchvision member whose checkpoint ``file_name`` (with matching hash) is, or None."""
    for member in cast(Iterable[Any], spec.weights_enum or ()):  # a torchvision WeightsEnum
        if url_file_name(member.url) == file_name:
            prefix = _hash_prefix(file_name)
            if prefix and digest.startswith(prefix):
                return member
    return None


def _missing_weights(source: WeightsSource, target: Path, why: str) -> InputError:
    return InputError(
        f"{source.name} weights are not on this machine ({why}). Download {source.url} "
        f"and put it at {target} (the torch hub cache; $TORCH_HOME moves it), or pass "
        f"--weights /path/to/{target.name}"
    )
