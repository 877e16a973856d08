"""Pseudo-label rules (VLPL, AEVLP's DAMP) on hand-computed cases; the pseudo-label command; the
files; and the losses that need them in the search (generated images, tiny random CLIP)."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from helpers_images import make_dataset

from featcache.data.featurefile import read_text_embeddings
from featcache.data.labelfile import load_labels
from featcache.data.pseudofile import (
    available_pseudo_labels,
    load_pseudo_labels,
    pseudo_labels_path,
    write_pseudo_labels,
)
from featcache.errors import InputError, OptionError
from featcache.features.extract import ExtractOptions, extract_features
from featcache.pseudolabels import rules
from featcache.pseudolabels.run import PseudoLabelOptions, pseudo_stats, run_pseudo_labels


def softmax(values, temperature):
    exps = [math.exp((v - max(values)) / temperature) for v in values]
    return [e / sum(exps) for e in exps]


# ------------------------------------------------------------------------------ VLPL's rule
def test_vlpl_rule_by_hand():
    sims = [[0.300, 0.295, 0.250], [0.210, 0.260, 0.255]]
    # q = softmax(s / 0.01): exponents 0, -0.5, -5 -> 1, 0.606531, 0.006738 over 1.613268
    q = [softmax(row, 0.01) for row in sims]
    assert q[0] == pytest.approx([0.6198595794, 0.3759638396, 0.0041765810], abs=1e-9)
    pseudo = rules.vlpl_rule(torch.tensor(sims, dtype=torch.float64), 0.01, 0.3)
    assert pseudo.tolist() == [[1, 1, 0], [0, 1, 1]]  # q > 0.3
    # partial 0.34 (its clip_vision branch): floor(0.34 * 3) = 1 lowest class -> -1
    pseudo = rules.vlpl_rule(torch.tensor(sims, dtype=torch.float64), 0.01, 0.3, 0.34)
    assert pseudo.tolist() == [[1, 1, -1], [-1, 1, 1]]


def test_vlpl_threshold_is_strict():
    tie = torch.tensor([[0.2, 0.2]], dtype=torch.float64)  # q = (0.5, 0.5)
    assert rules.vlpl_rule(tie, 0.01, 0.5).tolist() == [[0, 0]]
    assert rules.vlpl_rule(tie, 0.01, 0.49).tolist() == [[1, 1]]


# ------------------------------------------------------------------------------ AEVLP's rule
GLOBAL = [[0.31, 0.29, 0.28, 0.25], [0.27, 0.275, 0.25, 0.272]]
TILES = [
    [[0.27, 0.30, 0.26, 0.24], [0.29, 0.26, 0.27, 0.25], [0.30, 0.25, 0.27, 0.24],
     [0.28, 0.27, 0.28, 0.26]],
    [[0.28, 0.27, 0.24, 0.27], [0.26, 0.28, 0.25, 0.28], [0.27, 0.27, 0.26, 0.275],
     [0.25, 0.26, 0.262, 0.27]],
]
OBSERVED = [[1, 0, 0, 0], [0, 0, 1, 0]]


def damp_by_hand(eta, temperature=0.01):
    """F = (S^g + (max_v S^v if max > min(rho, eta) else min_v S^v)) / 2 and (S^g + mean_v) / 2."""
    finals, lows = [], []
    for n in range(2):
        s_global = softmax(GLOBAL[n], temperature)
        s_tiles = [softmax(tile, temperature) for tile in TILES[n]]
        rho = max(s * z for s, z in zip(s_global, OBSERVED[n], strict=True))
        gate = min(rho, eta)
        row, low = [], []
        for c in range(4):
            column = [tile[c] for tile in s_tiles]
            local = max(column) if max(column) > gate else min(column)
            row.append(0.5 * (s_global[c] + local))
            low.append(0.5 * (s_global[c] + sum(column) / len(column)))
        finals.append(row)
        lows.append(low)
    return finals, lows


def aevlp(**params):
    base = dict(temperature=0.01, eta=0.3, threshold=0.3, top_k=2, negative_ratio=0.25)
    base.update(params)
    return rules.aevlp_rule(torch.tensor(GLOBAL, dtype=torch.float64),
                            torch.tensor(TILES, dtype=torch.float64),
                            torch.tensor(OBSERVED, dtype=torch.float64), **base).tolist()


def test_aevlp_rule_by_hand():
    finals, lows = damp_by_hand(eta=0.3)
    assert finals[0] == pytest.approx([0.893159, 0.524014, 0.220704, 0.002201], abs=1e-6)
    assert finals[1] == pytest.approx([0.409880, 0.434629, 0.131956, 0.408543], abs=1e-6)
    # image 1: class 3's best tile (0.054) is under the gate min(0.842, 0.3): its worst tile is used
    # image 2: the gate is its observed positive's global score, 0.0338; class 3 (F 0.4085 >= 0.3)
    # is third: the top-2 cut drops it
    assert aevlp() == [[1, 1, 0, 0], [1, 1, 0, 0]]
    # the floor(0.25 * 4) = 1 lowest (S^g + mean) / 2 class: image 1 class 3, image 2 class 2
    assert min(range(4), key=lambda c: lows[0][c]) == 3 and min(range(4), key=lambda c: lows[1][c]) == 2
    assert aevlp(mark_negatives=True) == [[1, 1, 0, -1], [1, 1, -1, 0]]
    # the reference clears them: every pseudo-positive among the floor(0.75 * 4) = 3 lowest is
    # dropped (image 1: classes 3, 2, 1 at 0.010, 0.093, 0.198; image 2: 2, 0, 1 at 0.061,
    # 0.244, 0.344; class 3's 0.351 is the highest)
    assert lows[1] == pytest.approx([0.243619, 0.343903, 0.061261, 0.351217], abs=1e-6)
    assert aevlp(negative_ratio=0.75, threshold=0.0, top_k=4) == [[1, 0, 0, 0], [0, 0, 0, 1]]


def test_aevlp_eta_zero_always_takes_the_best_tile():
    finals, _ = damp_by_hand(eta=0.0)
    assert finals[0][3] == pytest.approx(0.028076, abs=1e-6)  # (0.002087 + 0.054065) / 2
    assert aevlp(eta=0.0) == [[1, 1, 0, 0], [1, 1, 0, 0]]


def test_rule_defaults_follow_the_reference_configs():
    assert rules.rule_defaults("vlpl", "voc") == {"temperature": 0.01, "threshold": 0.3,
                                                  "negative_ratio": 0.0}
    cub = rules.rule_defaults("aevlp", "cub")
    assert (cub["temperature"], cub["eta"], cub["threshold"], cub["top_k"]) == (0.1, 0.005, 0.005, 32)
    assert rules.rule_defaults("aevlp", "voc")["eta"] == 0.0
    assert rules.rule_defaults("aevlp", "shapes") == dict(rules.AEVLP_DEFAULTS["coco"],
                                                          mark_negatives=False)


# ------------------------------------------------------------------------------ statistics
def test_precision_and_recall_on_unobserved_entries(tmp_path):
    labels = load_labels(make_dataset(tmp_path, num_train=4, num_test=2, num_classes=3))
    clean = np.asarray(labels.train.clean, dtype=bool)
    observed = np.asarray(labels.train.observed)
    matrix = np.where(observed == 1, 1, 0).astype(np.int8)  # observed positives do not count
    hidden = np.argwhere(clean & (observed == 0))
    wrong = np.argwhere(~clean & (observed == 0))
    matrix[tuple(hidden[0])] = 1   # one true pseudo-positive
    matrix[tuple(wrong[0])] = 1    # one false pseudo-positive
    matrix[tuple(wrong[1])] = -1   # one true pseudo-negative
    stats = pseudo_stats(matrix, labels, np.zeros(4, dtype=bool))
    assert (stats["positives"], stats["negatives"]) == (2, 1)
    assert stats["positive_precision"] == 0.5                    # 1 of 2
    assert stats["positive_recall"] == pytest.approx(1 / len(hidden))
    assert stats["negative_precision"] == 1.0


# ------------------------------------------------------------------------------ the command
@pytest.fixture(scope="module")
def clip_cache(tmp_path_factory):
    """A toy dataset with tiny-CLIP features, class embeddings and 2x2 tile embeddings."""
    base = tmp_path_factory.mktemp("pseudo")
    make_dataset(base, num_train=12, num_test=4, num_classes=3)
    extract_features("toy", ExtractOptions(backbone="test-clip", weights="random", image_size=32,
                                           text=True, crops=2, device="cpu", workers=0,
                                           cache=str(base / "cache")), say=lambda _: None)
    return base / "cache"


def stored(cache):
    path = cache / "toy" / "features-test-clip-random.h5"
    with h5py.File(path, "r") as h5:
        return (torch.from_numpy(h5["train/features"][()]), torch.from_numpy(h5["train/crops"][()]),
                torch.from_numpy(read_text_embeddings(path).embeddings))


def test_pseudo_label_command_applies_the_rule_to_the_cached_similarities(clip_cache):
    result = invoke("pseudo-label", "--dataset", "toy", "--rule", "aevlp", "--cache", clip_cache,
                    "--threshold", "0.2", "--top-k", "2", "--temperature", "0.05", "--eta", "0.1",
                    "--negative-ratio", "0.34", "--mark-negatives")
    assert result.exit_code == 0, result.output
    assert "pseudo-positives on unobserved entries" in result.output
    assert "positive precision" in result.output  # toy labels are clean: P/R are known
    labels = load_labels(clip_cache / "toy" / "labels.h5")
    found = load_pseudo_labels(pseudo_labels_path(labels.path, "aevlp"), labels)
    images, tiles, texts = stored(clip_cache)
    cos = torch.nn.functional.normalize(images, dim=-1) @ texts.T
    tile_cos = torch.nn.functional.normalize(tiles, dim=-1) @ texts.T
    expected = rules.aevlp_rule(cos, tile_cos, torch.from_numpy(labels.train.observed).float(),
                                temperature=0.05, eta=0.1, threshold=0.2, top_k=2,
                                negative_ratio=0.34, mark_negatives=True)
    assert np.array_equal(found.matrix, expected.numpy())
    assert found.attrs["params"] == {"temperature": 0.05, "eta": 0.1, "threshold": 0.2, "top_k": 2,
                                     "negative_ratio": 0.34, "mark_negatives": True}
    assert found.attrs["backbone"] == "test-clip" and len(found.attrs["features_sha256"]) == 64
    assert set(available_pseudo_labels(labels)) >= {"aevlp"}

    again = invoke("pseudo-label", "--dataset", "toy", "--rule", "aevlp", "--cache", clip_cache)
    assert again.exit_code != 0 and "--overwrite" in again.output
    shown = invoke("info", clip_cache / "toy")
    assert shown.exit_code == 0, shown.output
    assert "| rule " in shown.output and "aevlp" in shown.output
    assert "crop embeddings" in shown.output and "text embeddings" in shown.output


def test_pseudo_label_command_errors(clip_cache, tmp_path):
    wrong = invoke("pseudo-label", "--dataset", "toy", "--rule", "vlpl", "--eta", "0.1",
                   "--cache", clip_cache, "--name", "x")
    assert wrong.exit_code != 0 and "--eta does not apply to the vlpl rule" in wrong.output
    make_dataset(tmp_path, num_train=6, num_test=2, num_classes=3)
    cache = tmp_path / "cache"
    extract_features("toy", ExtractOptions(backbone="test-clip", weights="random", image_size=32,
                                           device="cpu", workers=0, cache=str(cache)),
                     say=lambda _: None)
    with pytest.raises(InputError, match="no features file .* has class-prompt text embeddings"):
        run_pseudo_labels(PseudoLabelOptions("toy", "vlpl", cache=str(cache)))
    extract_features("toy", ExtractOptions(backbone="test-clip", weights="random", image_size=32,
                                           device="cpu", workers=0, cache=str(cache), text=True),
                     say=lambda _: None)
    with pytest.raises(InputError, match=r"aevlp rule needs tile embeddings.*--crops 4x4"):
        run_pseudo_labels(PseudoLabelOptions("toy", "aevlp", cache=str(cache)))
    with pytest.raises(OptionError, match="--temperature 0.0: must be > 0"):
        run_pseudo_labels(PseudoLabelOptions("toy", "vlpl", cache=str(cache),
                                             params={"temperature": 0.0}))
    made = run_pseudo_labels(PseudoLabelOptions("toy", "vlpl", cache=str(cache)),
                             say=lambda _: None)
    assert made.path.name == "pseudo-labels-vlpl.h5"


def test_pseudo_labels_of_another_labels_file_are_refused(clip_cache, tmp_path):
    labels = load_labels(clip_cache / "toy" / "labels.h5")
    other = load_labels(make_dataset(tmp_path, num_train=12, num_test=4, num_classes=3, seed=5))
    path = write_pseudo_labels(tmp_path / "p.h5", other, np.zeros((12, 3), np.int8),
                               {"name": "p", "rule": "vlpl"})
    with pytest.raises(InputError, match="was made for a labels file with sha256"):
        load_pseudo_labels(path, labels)


# ------------------------------------------------------------------------------ the losses
def test_losses_that_need_pseudo_labels_are_skipped_then_trained(clip_cache):
    common = ("train-linear", "--dataset", "toy", "--cache", clip_cache, "--epochs", "1",
              "--lr", "1e-2", "--bsize", "4", "--quiet", "--no-plots", "--device", "cpu")
    invoke("pseudo-label", "--dataset", "toy", "--rule", "vlpl", "--cache", clip_cache,
           "--overwrite")
    chosen = invoke(*common, "--loss", "vlpl", "--run-id", "v", "--pseudo-labels", "nope")
    assert chosen.exit_code != 0 and "needs pseudo-labels 'nope'" in chosen.output
    trained = invoke(*common, "--loss", "vlpl", "--run-id", "v")
    assert trained.exit_code == 0, trained.output
    import json

    document = json.loads((clip_cache / "toy" / "runs" / "vlpl" / "v" / "results.json").read_text())
    assert document["pseudo_labels"]["name"] == "vlpl"
    assert document["pseudo_labels"]["rule"] == "vlpl"
    assert "pseudo_labels_sha256" in document["settings"]
    other = invoke(*common, "--loss", "vlpl", "--run-id", "w", "--pseudo-labels", "aevlp")
    assert other.exit_code == 0, other.output
    document = json.loads((clip_cache / "toy" / "runs" / "vlpl" / "w" / "results.json").read_text())
    assert document["pseudo_labels"]["rule"] == "aevlp"
