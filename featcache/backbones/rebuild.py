"""The backbones a trained run needs again: the one its features came from, or its own
fine-tuned network.

A stage-two head only means something on the features it was trained on, so fine-tuning
(LinearInit), ``featcache predict`` on images and ``featcache cam`` rebuild exactly that
backbone from the identity the run recorded (backbone, weights name, weights sha256; the seed
of random weights) and refuse any other. A fine-tuned run carries its whole network: the trunk
is built from the registry and its ``trunk.*`` weights are loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from featcache.backbones.family import Trunk
from featcache.backbones.preprocess import Preprocess, described_image_size
from featcache.backbones.registry import backbone_spec, create_backbone, state_sha256
from featcache.backbones.transforms import preprocess_mode, resolve_preprocess
from featcache.backbones.weights import WeightsChoice, describe_weights, locate_weights
from featcache.backbones.weightsource import FILE, RANDOM
from featcache.data.featurefile import read_feature_attrs
from featcache.errors import InputError


def trunk_for_features(identity: Mapping, where: str, weights: str | WeightsChoice | None = None,
                       image_size: int | None = None) -> Trunk:
    """The backbone whose features a run was trained on, in eval mode on the CPU, built for
    ``image_size`` inputs (default: the size in ``identity``'s transform, else the backbone's).

    ``identity`` holds ``backbone``, ``weights`` (a torchvision name, a timm/open_clip tag,
    ``random`` or ``file``),
    ``weights_sha256`` and, for random weights, ``weights_seed`` or the ``features_path`` that
    records it. ``weights`` (``--weights``, or the command's resolved :class:`WeightsChoice`)
    may name the same weights another way (a file); anything whose sha256 differs is refused
    with the reason.
    """
    spec = backbone_spec(str(identity.get("backbone")))
    run_name, run_sha = identity.get("weights"), identity.get("weights_sha256")
    choice = weights if isinstance(weights, WeightsChoice) else WeightsChoice(weights)
    if choice.given:
        source = choice.source(spec)
    elif run_name == RANDOM:
        source = describe_weights(spec, RANDOM, _random_seed(identity))
    elif run_name == FILE:
        raise InputError(f"{where} used a weights file (sha256 {str(run_sha)[:12]}…); pass "
                         "--weights PATH to that file")
    else:
        source = describe_weights(spec, str(run_name))
    if source.kind != RANDOM:
        source = locate_weights(source)
        if source.sha256 != run_sha:
            raise InputError(_weights_mismatch(where, identity, source.name, source.sha256))
    trunk = create_backbone(spec.name, source, seed=source.seed,
                            image_size=image_size or recorded_image_size(identity))
    if trunk.weights_identity.get("weights_sha256") != run_sha:
        raise InputError(_weights_mismatch(where, identity, source.name,
                                           trunk.weights_identity.get("weights_sha256")))
    return trunk


def trunk_from_state(backbone: str, state: Mapping[str, Tensor], where: str,
                     prefix: str = "trunk.", image_size: int | None = None) -> Trunk:
    """Backbone ``backbone`` holding the ``prefix``-ed weights of a saved network (a fine-tuned
    run's ``best.pt``), built for ``image_size`` inputs, in eval mode on the CPU; refused when
    the weights do not fit it."""
    spec = backbone_spec(backbone)
    size = image_size or spec.default_image_size
    spec.check_image_size(size)
    trunk = spec.family.empty_trunk(spec, size)  # the family's trunk for that size, overwritten
    own = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    try:
        trunk.load_state_dict(own)
    except RuntimeError as exc:
        raise InputError(f"{where}: its network weights do not fit the {backbone} backbone "
                         f"({str(exc).splitlines()[0]})") from exc
    trunk.weights_identity = {"weights": "fine-tuned", "weights_sha256": state_sha256(trunk)}
    trunk.pooling = spec.pooling
    trunk.image_size = size
    return trunk.eval()


def recorded_image_size(identity: Mapping) -> int | None:
    """The input size a run recorded (``image_size``, else its transform's)."""
    if identity.get("image_size") is not None:
        return int(identity["image_size"])
    return described_image_size(identity.get("transform") or {})


def recorded_preprocess(identity: Mapping) -> Preprocess:
    """The preprocessing a run's features (or network) were made with, from its recorded
    transform: the backbone's own, or the protocol's (``--preprocess protocol``)."""
    backbone = str(identity.get("backbone"))
    transform = identity.get("transform") or {}
    size = recorded_image_size(identity)
    mode = preprocess_mode(transform, backbone, size) if transform and size else None
    return resolve_preprocess(backbone, mode or "native")


def _random_seed(identity: Mapping) -> int:
    if identity.get("weights_seed") is not None:
        return int(identity["weights_seed"])
    path = Path(str(identity.get("features_path", "")))
    if path.is_file():
        return int(read_feature_attrs(path).get("weights_seed", 0))
    return 0


def _weights_mismatch(where: str, identity: Mapping, name: str, sha: str | None) -> str:
    return (f"{where} was trained on features of {identity.get('weights')} weights (sha256 "
            f"{str(identity.get('weights_sha256'))[:12]}…), but the weights to use are {name} "
            f"(sha256 {str(sha)[:12]}…): its head would sit on another network. Drop --weights, or "
            "train a linear run on features of these weights")
