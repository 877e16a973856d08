"""Where featcache keeps its files: one module names them (``featcache.paths``)."""

from __future__ import annotations

from featcache.paths import (
    backbone_feature_files,
    feature_file_name,
    feature_file_tag,
    feature_tag,
    features_files_in,
    features_path,
    pooled_twin,
    spatial_features_path,
)


def test_pooled_and_spatial_files_are_named_from_one_tag(tmp_path):
    assert feature_file_name("resnet50") == "features-resnet50.h5"
    assert feature_file_name("resnet50-random", spatial=True) == "spatial-resnet50-random.h5"
    assert features_path("voc", "resnet50", tmp_path) == tmp_path / "voc" / "features-resnet50.h5"
    spatial = spatial_features_path("voc", "resnet50-random", tmp_path)
    assert spatial == tmp_path / "voc" / "spatial-resnet50-random.h5"
    assert pooled_twin(spatial) == tmp_path / "voc" / "features-resnet50-random.h5"
    assert feature_file_tag(spatial) == "resnet50-random"
    assert feature_file_tag(tmp_path / "features-clip-vit-b16.h5") == "clip-vit-b16"


def test_a_backbones_files_are_found_whatever_their_weights_and_only_its_own(tmp_path):
    root = tmp_path / "voc"
    root.mkdir()
    names = ["features-resnet50.h5", "features-resnet50-random.h5", "features-resnet50x2.h5",
             "features-resnet18.h5", "spatial-resnet50-random.h5", ".features-resnet50.h5.tmp-1"]
    for name in names:
        (root / name).touch()
    assert [p.name for p in backbone_feature_files("voc", "resnet50", cache=tmp_path)] == [
        "features-resnet50-random.h5", "features-resnet50.h5"]
    assert [p.name for p in backbone_feature_files("voc", "resnet50", spatial=True,
                                                   cache=tmp_path)] == ["spatial-resnet50-random.h5"]
    assert backbone_feature_files("voc", "vit-b-16", cache=tmp_path) == []
    assert [p.name for p in features_files_in(root)] == [
        "features-resnet18.h5", "features-resnet50-random.h5", "features-resnet50.h5",
        "features-resnet50x2.h5"]  # never the hidden temporary file
    assert [p.name for p in features_files_in(root, spatial=True)] == ["spatial-resnet50-random.h5"]


def test_a_longer_backbone_name_owns_its_files(tmp_path):
    root = tmp_path / "voc"
    root.mkdir()
    for name in ("features-clip-vit-l14.h5", "features-clip-vit-l14-protocol.h5",
                 "features-clip-vit-l14-336.h5", "features-clip-vit-l14-336-protocol.h5"):
        (root / name).touch()
    names = ["clip-vit-l14", "clip-vit-l14-336", "resnet50"]
    assert [p.name for p in backbone_feature_files("voc", "clip-vit-l14", cache=tmp_path,
                                                   backbones=names)] == [
        "features-clip-vit-l14-protocol.h5", "features-clip-vit-l14.h5"]
    assert [p.name for p in backbone_feature_files("voc", "clip-vit-l14-336", cache=tmp_path,
                                                   backbones=names)] == [
        "features-clip-vit-l14-336-protocol.h5", "features-clip-vit-l14-336.h5"]


def test_one_function_composes_a_features_files_tag():
    assert feature_tag("resnet50") == "resnet50"
    assert feature_tag("resnet50", "random") == "resnet50-random"
    assert feature_tag("clip-vit-b16", None, protocol=True) == "clip-vit-b16-protocol"
    assert feature_tag("resnet50", "weights-ab12", protocol=True) == "resnet50-weights-ab12-protocol"
