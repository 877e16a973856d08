"""The features file LinearInit's linear phase trains on (stage three's side of
:mod:`featcache.protocol.feature_source`: a backbone, ``--weights`` and ``--image-size`` resolve
into the same :class:`~featcache.protocol.feature_source.FeatureSource`). A module of its own
because it reads the backbones' registry, which stage two never needs to import."""

from __future__ import annotations

from featcache.backbones import backbone_names, backbone_spec
from featcache.backbones.weights import describe_weights
from featcache.data.featurefile import read_feature_attrs
from featcache.errors import InputError, OptionError
from featcache.paths import (
    backbone_feature_files,
    dataset_dir,
    feature_file_tag,
    feature_tag,
    pooled_twin,
    runs_dir,
)
from featcache.protocol.feature_source import DEFAULT_BACKBONE, FeatureSource
from featcache.protocol.loss_choice import needs_spatial


def linear_phase_source(dataset: str, loss: str, backbone: str | None, weights: str | None,
                        image_size: int | None, cache: str | None) -> FeatureSource:
    """The features file LinearInit's linear phase trains on (the spatial one for a loss that
    reads feature maps): ``backbone``'s (default resnet50), of ``weights`` and ``image_size``
    when given; the error says which command makes one. Fine-tuning reads images, so the
    source came from them."""
    backbone = backbone or DEFAULT_BACKBONE
    spec = backbone_spec(backbone)
    root = dataset_dir(dataset, cache)
    spatial = needs_spatial(loss)
    make = (f"`featcache features --dataset {dataset}"
            + (f" --backbone {backbone}" if backbone != DEFAULT_BACKBONE else "")
            + (f" --weights {weights}" if weights else "")
            + (f" --image-size {image_size}" if image_size else "")
            + (" --spatial" if spatial else "") + "`")
    found = backbone_feature_files(dataset, backbone, spatial, cache, backbones=backbone_names())
    if weights is not None:
        # made with these weights, with the backbone's own transform or the protocol's
        weights_tag = describe_weights(spec, weights).tag
        wanted = {feature_tag(spec.name, weights_tag, protocol) for protocol in (False, True)}
        found = [p for p in found if feature_file_tag(p) in wanted]
    if image_size is not None:
        found = [p for p in found if read_feature_attrs(p).get("image_size") == image_size]
    if not found:
        raise InputError(
            f"no finished linear {loss!r} run in {runs_dir(dataset, loss, cache)} "
            f"fits, and there is no {'spatial ' if spatial else ''}features file in {root} to "
            f"train one on: run {make} first (then this command trains the linear phase "
            "itself), or use --init none"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        kind = "spatial features" if spatial else "features"
        fix = ("they differ in transform (the backbone's own and --preprocess protocol): move "
               "away the one the linear phase should not train on" if weights is not None
               else "choose the weights of the linear phase with --weights")
        raise OptionError(f"{root} holds several {kind} files for {backbone} ({names}); {fix}")
    if not spatial:
        return FeatureSource(feature_file_tag(found[0]), found[0], None)
    twin = pooled_twin(found[0])
    return FeatureSource(feature_file_tag(found[0]), twin if twin.exists() else None, found[0])
