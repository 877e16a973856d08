"""The issue's end-to-end check on the shapes demo: a timm tower and an open_clip tower (random
weights) extract features, pseudo-labels are made from the CLIP similarities, every loss trains
on both feature sets, and each fine-tunes one epoch from its linear run (all on the CPU)."""

from __future__ import annotations

import json

import pytest
from dataset_fixtures import invoke

from featcache.losses import SPATIAL_FEATURES, loss_class, loss_names

pytest.importorskip("timm")
pytest.importorskip("open_clip")

QUICK = ("--epochs", "1", "--lr", "1e-3", "--bsize", "16", "--quiet", "--no-plots", "--device",
         "cpu")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    cache = tmp_path_factory.mktemp("shapes") / "cache"
    made = invoke("prepare", "shapes", "--num-train", "80", "--num-test", "30", "--cache", cache)
    assert made.exit_code == 0, made.output
    for backbone, extra in (("test-vit", ()), ("test-clip", ("--text", "--crops", "2x2"))):
        made = invoke("features", "--dataset", "shapes", "--backbone", backbone, "--weights",
                      "random", "--image-size", "32", "--device", "cpu", "--workers", "0",
                      "--cache", cache, *extra)
        assert made.exit_code == 0, made.output
    for rule in ("vlpl", "aevlp"):
        made = invoke("pseudo-label", "--dataset", "shapes", "--rule", rule, "--cache", cache,
                      "--threshold", "0.1", "--temperature", "0.05")
        assert made.exit_code == 0, made.output
        assert "positive precision" in made.output
    return cache


@pytest.mark.parametrize("tag", ["test-vit-random", "test-clip-random"])
def test_every_loss_trains_on_the_towers_features(shapes, tag):
    result = invoke("train-linear", "--dataset", "shapes", "--backbone", tag, "--loss", "all",
                    "--run-id", tag, "--cache", shapes, *QUICK)
    assert result.exit_code == 0, result.output
    # only the losses on feature maps are skipped (this cache has no spatial features file),
    # and the zero-shot row where the file has no class-prompt embeddings (the ViT's)
    spatial = [n for n in loss_names() if SPATIAL_FEATURES in loss_class(n).needs]
    skipped = [line for line in result.output.splitlines()
               if line.startswith("skipping") and not line.startswith("skipping zero-shot")]
    assert len(skipped) == len(spatial) and all("--spatial` first" in line for line in skipped)
    rows = json.loads((shapes / "shapes" / "runs" / f"table-{tag}.json").read_text())
    zero_shot = {"zero-shot"} if "clip" in tag else set()
    assert sorted(row["loss"] for row in rows) == sorted(set(loss_names()) - set(spatial)
                                                         | zero_shot)
    document = json.loads((shapes / "shapes" / "runs" / "an-ls" / tag / "results.json").read_text())
    assert document["features"]["backbone"] == tag.removesuffix("-random")
    assert document["features"]["dim"] == (64 if "vit" in tag else 32)


@pytest.mark.slow  # fine-tunes a network
@pytest.mark.parametrize("tag, loss", [("test-vit-random", "an-ls"), ("test-clip-random", "vlpl")])
def test_one_epoch_of_fine_tuning_from_the_linear_run(shapes, tag, loss):
    trained = invoke("train-linear", "--dataset", "shapes", "--backbone", tag, "--loss", loss,
                     "--run-id", f"ft-{tag}", "--cache", shapes, *QUICK)
    assert trained.exit_code == 0, trained.output
    run = shapes / "shapes" / "runs" / loss / f"ft-{tag}"
    result = invoke("finetune", "--dataset", "shapes", "--loss", loss, "--init", run,
                    "--epochs", "1", "--lr", "1e-4", "--batch-size", "16", "--workers", "0",
                    "--run-id", tag, "--cache", shapes, "--quiet", "--no-plots", "--device", "cpu")
    assert result.exit_code == 0, result.output
    document = json.loads((shapes / "shapes" / "finetune" / loss / tag / "results.json").read_text())
    assert document["backbone"]["name"] == tag.removesuffix("-random")
    assert document["backbone"]["image_size"] == 32
    assert document["init"]["mode"] == "linear"
    assert document["selection"]["epoch"] == 1
    if loss == "vlpl":
        assert document["pseudo_labels"]["rule"] == "vlpl"
    images = sorted(shapes.rglob("*.jpg"))[:3]
    for folder in (run, shapes / "shapes" / "finetune" / loss / tag):
        predicted = invoke("predict", "--run", folder, *map(str, images), "--workers", "0",
                           "--device", "cpu", "--format", "jsonl")
        assert predicted.exit_code == 0, predicted.output
        assert predicted.output.count('"probabilities"') == 3  # one JSON row per image
        drawn = invoke("cam", "--run", folder, str(images[0]), "--out", shapes / f"{tag}.png",
                       "--device", "cpu", "--overwrite")
        assert drawn.exit_code == 0, drawn.output
        assert (shapes / f"{tag}.png").stat().st_size > 0


def test_class_maps_cover_the_part_of_the_image_the_backbone_saw():
    import torch

    from featcache.api.cam import seen_box, upsample_maps
    from featcache.backbones import PROTOCOL, resolve_preprocess

    clip = resolve_preprocess("clip-vit-b16")  # shorter side to s, centre crop s x s
    # 100 x 200 image, s = 50: resized to 50 x 100, crop columns 25..75 -> original 50..150
    assert seen_box((100, 200), 50, clip) == (0, 50, 100, 100)
    assert seen_box((200, 100), 50, clip) == (50, 0, 100, 100)
    assert seen_box((100, 200), 50, PROTOCOL) == (0, 0, 100, 200)
    maps = torch.arange(4.0).view(1, 2, 2)
    out = upsample_maps(maps, (100, 200), 50, clip)
    assert out.shape == (1, 100, 200)
    assert (out[0, :, :50] == out[0].min()).all() and (out[0, :, 150:] == out[0].min()).all()
    assert out[0, 99, 149] > out[0, 0, 50]
