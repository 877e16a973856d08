"""Where featcache keeps its files: one module names them (``featcache.paths``)."""

from __future__ import annotations

import pytest

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


# ------------------------------------------------------------------ names that become paths
@pytest.mark.parametrize("value, problem", [
    ("", "is empty"),
    ("..", "is a path, not a name"),
    ("../elsewhere", "is a path, not a name"),
    ("a/b", "is a path, not a name"),
    ("/tmp/x", "is a path, not a name"),
    (".hidden", "starts with '.'"),
    ("-x", "starts with '-'"),
    ("run id", "holds ' '"),
    ("run\nid", "holds '\\n'"),
    ("x" * 101, "is 101 characters long (at most 100)"),
])
def test_a_name_is_a_name(value, problem):
    from featcache.errors import OptionError
    from featcache.paths import check_name

    with pytest.raises(OptionError) as caught:
        check_name(value, "--run-id")
    message = str(caught.value)
    shown = repr(value if len(value) <= 60 else value[:40] + "...")  # a long name is cut short
    assert message.startswith(f"--run-id {shown} {problem}") and "\n" not in message.replace(
        repr(value), "")
    assert check_name("k1.5-s0", "--run-id") == "k1.5-s0"
    assert check_name("demo-resnet50-random", "--run-id") == "demo-resnet50-random"


@pytest.mark.parametrize("args", [
    ("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "../../escape"),
    ("finetune", "--dataset", "toy", "--loss", "an", "--run-id", "../escape"),
    ("prepare", "features", "--npz", "x.npz", "--name", "../outside"),
    ("train-linear", "--dataset", "bad name", "--loss", "an"),
])
def test_commands_refuse_a_path_where_a_name_belongs(cache_dir, args):
    from dataset_fixtures import invoke

    result = invoke(*args)
    assert result.exit_code != 0
    assert "a name is 1 to 100 letters" in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1
    assert not any(p.name in ("escape", "outside") for p in cache_dir.parent.rglob("*"))


def test_a_cache_root_that_is_a_file_is_one_clear_line(tmp_path, monkeypatch):
    from dataset_fixtures import invoke

    not_a_folder = tmp_path / "cachefile"
    not_a_folder.write_text("x")
    monkeypatch.setenv("FEATCACHE_CACHE", str(not_a_folder))
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an")
    assert result.exit_code != 0
    assert f"$FEATCACHE_CACHE {not_a_folder} is a file, not a folder" in result.output
