"""Backbones that map a normalised image batch to pooled features, and their image transform.

A small registry in the style of timm: :func:`create_backbone` builds a registered torchvision
network with the requested weights and returns its *trunk*, everything up to and including
global average pooling, flattened: ``(B, 3, H, W) -> (B, D)``. Stage one caches the trunk's
output; stage three puts a linear head on the same module. Adding a backbone is one
:class:`BackboneSpec` entry in ``_REGISTRY`` (or a :func:`register_backbone` call).

The transform is the protocol's (PROTOCOL.md section 2; Cole et al., ``datasets.get_transforms``):
``Resize((s, s))`` (no crop), a random horizontal flip only when training, ``ToTensor`` and
ImageNet ``Normalize``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torchvision
from torch import Tensor, nn
from torchvision import transforms

from featcache.errors import OptionError, unknown_name

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_IMAGE_SIZE = 448


class ResNetTrunk(nn.Module):
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

    def forward(self, x: Tensor) -> Tensor:
        return torch.flatten(self.avgpool(self.feature_map(x).float()), 1)


@dataclass(frozen=True)
class BackboneSpec:
    """What featcache needs to know about one backbone.

    ``build`` makes the torchvision network with random weights; ``trunk`` cuts it down to
    pooled features of width ``dim``; ``weights_enum`` is torchvision's weights enum (its urls
    name the checkpoint files); ``weights_aliases`` maps short names (``v1``) to enum members.
    """

    name: str
    dim: int
    build: Callable[[], nn.Module]
    weights_enum: type
    weights_aliases: Mapping[str, str] = field(default_factory=dict)
    default_weights: str = "v1"
    trunk: Callable[[nn.Module], nn.Module] = ResNetTrunk
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def weights_member(self, alias: str):
        """The torchvision weights enum member for ``alias`` (``v1`` or a member name), or None."""
        member_name = self.weights_aliases.get(alias.lower(), alias.upper())
        return getattr(self.weights_enum, member_name, None)

    def weights_names(self) -> list[str]:
        """Short names and torchvision member names accepted by ``--weights``."""
        return list(self.weights_aliases) + [m for m in self.weights_aliases.values()]


def _resnet(name: str, dim: int, weights_enum: type) -> BackboneSpec:
    return BackboneSpec(
        name=name, dim=dim, build=getattr(torchvision.models, name), weights_enum=weights_enum,
        weights_aliases={"v1": "IMAGENET1K_V1", "v2": "IMAGENET1K_V2"},
    )


_REGISTRY: dict[str, BackboneSpec] = {
    spec.name: spec
    for spec in (
        _resnet("resnet50", 2048, torchvision.models.ResNet50_Weights),
        _resnet("resnet101", 2048, torchvision.models.ResNet101_Weights),
        _resnet("resnet18", 512, torchvision.models.ResNet18_Weights),
    )
}


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    """Add (or replace) a backbone in the registry; returns ``spec``."""
    _REGISTRY[spec.name] = spec
    return spec


def backbone_names() -> list[str]:
    """Names accepted by ``--backbone``."""
    return sorted(_REGISTRY)


def backbone_spec(name: str) -> BackboneSpec:
    """The registry entry of ``name``; an OptionError lists the choices."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError(unknown_name("backbone", name, backbone_names(),
                                       listing="`featcache features --help` lists them")) from None


def create_backbone(name: str = "resnet50", weights="v1", seed: int = 0) -> nn.Module:
    """Build backbone ``name`` with ``weights`` (``v1``, ``v2``, ``random``, a file path, or a
    resolved :class:`~featcache.backbones.weights.WeightsSource`), in eval mode on the CPU.

    The module maps a normalised batch ``(B, 3, H, W)`` to pooled features ``(B, dim)``. Its
    attribute ``weights_identity`` says which weights it holds (recorded in features files).
    ``seed`` fixes the initialisation of ``random`` weights.
    """
    from featcache.backbones.weights import WeightsSource, load_state_dict, resolve_weights

    spec = backbone_spec(name)
    source = weights if isinstance(weights, WeightsSource) else resolve_weights(spec, weights, seed)
    if source.kind == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(source.seed)
            net = spec.build()
        trunk = spec.trunk(net)
        identity = dict(source.identity(), weights_sha256=state_sha256(trunk))
    else:
        net = spec.build()
        load_state_dict(net, source)
        trunk = spec.trunk(net)
        identity = source.identity()
    trunk.weights_identity = identity
    return trunk.eval()


def state_sha256(module: nn.Module) -> str:
    """sha256 over a module's state dict (names, dtypes, shapes and bytes, in order)."""
    digest = hashlib.sha256()
    for key, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def image_transform(image_size: int = DEFAULT_IMAGE_SIZE, train: bool = False,
                    backbone: str = "resnet50") -> transforms.Compose:
    """The protocol's transform: PIL RGB image -> normalised float tensor (3, s, s)."""
    spec = backbone_spec(backbone)
    steps = [transforms.Resize((image_size, image_size))]
    if train:
        steps.append(transforms.RandomHorizontalFlip(0.5))
    steps += [transforms.ToTensor(), transforms.Normalize(mean=spec.mean, std=spec.std)]
    return transforms.Compose(steps)


def resize_transform(image_size: int = DEFAULT_IMAGE_SIZE) -> transforms.Compose:
    """The CPU half of the evaluation transform: PIL image -> resized uint8 tensor (3, s, s).

    :class:`Uint8Normalize` finishes it on the device; together they give exactly the values of
    :func:`image_transform` while moving a quarter of the bytes between processes.
    """
    return transforms.Compose([transforms.Resize((image_size, image_size)), transforms.PILToTensor()])


class Uint8Normalize(nn.Module):
    """uint8 batch (B, 3, H, W) -> float32, normalised exactly as ``ToTensor`` + ``Normalize``.

    A module so that mean and std live on the device once (a per-batch host-to-device copy of
    them would make the host wait for the GPU).
    """

    def __init__(self, backbone: str = "resnet50"):
        super().__init__()
        spec = backbone_spec(backbone)
        self.register_buffer("mean", torch.tensor(spec.mean, dtype=torch.float32).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(spec.std, dtype=torch.float32).view(-1, 1, 1))

    def forward(self, batch: Tensor) -> Tensor:
        # Same operations in the same order as torchvision's to_tensor and normalize.
        return batch.to(torch.float32).div(255).sub_(self.mean).div_(self.std)


def transform_description(image_size: int, backbone: str = "resnet50",
                          decode: str = "pil") -> dict:
    """The evaluation transform as data, recorded in features files and compared on resume;
    ``decode`` is ``pil`` (the reference's way), ``pil-draft`` (``--jpeg-draft``) or ``device``
    (``--gpu-decode``)."""
    spec = backbone_spec(backbone)
    on_device = decode == "device"
    decoders = {
        "pil": "PIL.Image.open(path).convert('RGB')",
        "pil-draft": (f"PIL.Image.open(path), draft(None, ({image_size}, {image_size})) for JPEGs, "
                      ".convert('RGB')"),
        "device": "torchvision.io.decode_jpeg on the device (PIL for other files)",
    }
    return {
        "decode": decoders[decode],
        "resize": [image_size, image_size],
        "interpolation": "bilinear, antialiased tensor resize" if on_device else "bilinear",
        "crop": None,
        "to_tensor": "uint8 / 255",
        "normalize": {"mean": list(spec.mean), "std": list(spec.std)},
    }
