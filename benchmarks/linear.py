"""Stage two speed: the full 8-configuration x 25-epoch search of one loss, ours vs the reference way.

Ours: ``featcache.linear.search.run_search`` (stacked heads, index-slice batches, device mAP).
Baseline: one configuration at a time the way the reference code trains (Cole et al.
``train.py``): a DataLoader over the feature rows yielding a dict per batch, the loss built
with boolean-mask assignments, per-example Python lists in the logger, and scikit-learn AP
(plus the logger's precision/recall@k loops) on train, val and test every epoch. The baseline
runs a few configuration-epochs (one per batch size by default) and is scaled honestly to the
8 x 25 search: mean seconds per configuration-epoch of each batch size x 4 lrs x 25 epochs.

Data: VOC-sized features (4,574 train / 1,143 val / 5,823 test, 2,048-d, 20 classes) with the
real VOC2012 label matrices when ``../shared/data`` is present (else VOC-like generated labels),
or COCO-sized (65,665 / 16,416 / 40,137, 80 classes) with ``--size coco``. Features are
generated: non-negative, label-dependent, so training does something real.

    python -m benchmarks.linear                 # VOC-sized, an-ls, CPU
    python -m benchmarks.linear --all-losses    # also time `--loss all` (every loss)
    python -m benchmarks.linear --size coco --device cuda
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import average_precision_score

from benchmarks._common import BENCH_DIR, describe, machine, save
from featcache.data.featurefile import write_features
from featcache.data.labelfile import LabelSet, SplitLabels, load_labels, write_labels
from featcache.data.sampling import observe_uniform, split_train_val
from featcache.linear.data import load_linear_data
from featcache.linear.search import SearchSpec, run_search
from featcache.losses import loss_names
from featcache.tables import Table

SIZES = {
    "voc": {"train": 5717, "test": 5823, "classes": 20, "k": 1.46},
    "coco": {"train": 82081, "test": 40137, "classes": 80, "k": 2.9},
}
SHARED_VOC = Path(__file__).resolve().parents[2] / "shared" / "data" / "voc2012_labels"
FEATURE_DIM = 2048


# ---------------------------------------------------------------------------- data
def _labels(size: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, str]:
    spec = SIZES[size]
    if size == "voc" and (SHARED_VOC / "voc2012_train_labels.npy").exists():
        return (np.load(SHARED_VOC / "voc2012_train_labels.npy"),
                np.load(SHARED_VOC / "voc2012_val_labels.npy"), "real VOC2012 label matrices")
    out = []
    for n in (spec["train"], spec["test"]):
        prior = rng.dirichlet(np.full(spec["classes"], 0.6))
        counts = np.clip(rng.poisson(spec["k"] - 1, n) + 1, 1, spec["classes"])
        y = np.zeros((n, spec["classes"]), dtype=np.uint8)
        for i, c in enumerate(counts):
            y[i, rng.choice(spec["classes"], size=c, replace=False, p=prior)] = 1
        out.append(y)
    return out[0], out[1], "generated labels"


def _features(labels: np.ndarray, basis: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    noise = rng.standard_normal((labels.shape[0], FEATURE_DIM), dtype=np.float32)
    return np.maximum(labels.astype(np.float32) @ basis + 1.5 * noise, 0.0).astype(np.float32)


def synthetic_dataset(size: str, root: Path = BENCH_DIR / "data") -> tuple[Path, Path, str]:
    """A labels file and a features file of the given size (built once, then reused)."""
    name = f"{size}-synthetic"
    labels_path = root / name / "labels.h5"
    features_path = root / name / "features-synthetic.h5"
    rng = np.random.default_rng(0)
    train, test, source = _labels(size, rng)
    if features_path.exists() and labels_path.exists():
        return labels_path, features_path, source
    classes = [f"class{i:02d}" for i in range(train.shape[1])]
    train_idx, val_idx = split_train_val(len(train))
    labels = LabelSet(
        dataset=name, classes=classes,
        train=SplitLabels(np.array([f"train/{i:06d}" for i in range(len(train))], dtype=object),
                          observe_uniform(train), train),
        test=SplitLabels(np.array([f"test/{i:06d}" for i in range(len(test))], dtype=object),
                         observe_uniform(test), test),
        train_index=train_idx, val_index=val_idx, provenance={"source": f"benchmark, {source}"},
    )
    write_labels(labels, labels_path, overwrite=True)
    labels = load_labels(labels_path)
    basis = rng.standard_normal((train.shape[1], FEATURE_DIM), dtype=np.float32)
    write_features(features_path, labels, {"train": _features(train, basis, rng),
                                           "test": _features(test, basis, rng)},
                   {"backbone": "synthetic", "weights": "none"}, overwrite=True)
    return labels_path, features_path, source


# ---------------------------------------------------------------------------- baseline
class FeatureRows(torch.utils.data.Dataset):
    """The reference's fixed-features Dataset: one dict per example."""

    def __init__(self, features, observed, clean):
        self.features, self.observed, self.clean = features, observed, clean

    def __len__(self):
        return len(self.features)

    def __getitem__(self, idx):
        return {"image": torch.FloatTensor(np.copy(self.features[idx])),
                "label_vec_obs": torch.FloatTensor(np.copy(self.observed[idx])),
                "label_vec_true": torch.FloatTensor(np.copy(self.clean[idx])), "idx": idx}


def _reference_an_ls(preds: torch.Tensor, observed: torch.Tensor, eps: float = 0.1) -> torch.Tensor:
    """AN-LS the reference's way: boolean-mask assignments into a zero matrix."""
    loss_mtx = torch.zeros_like(observed)
    pos, neg = observed == 1, observed == 0
    loss_mtx[pos] = (1 - eps) * -torch.log(preds[pos] + 1e-5) + eps * -torch.log(1 - preds[pos] + 1e-5)
    loss_mtx[neg] = (1 - eps) * -torch.log(1 - preds[neg] + 1e-5) + eps * -torch.log(preds[neg] + 1e-5)
    return (loss_mtx / (preds.shape[0] * preds.shape[1])).sum()


def _check_inputs(targets: np.ndarray, preds: np.ndarray) -> None:
    """The reference metrics' input validation, run on every call as there."""
    assert np.shape(preds) == np.shape(targets)
    assert (np.max(preds) <= 1.0) and (np.min(preds) >= 0.0)
    assert (np.max(targets) <= 1.0) and (np.min(targets) >= 0.0)
    assert len(np.unique(targets)) <= 2


def _average_precision(targets: np.ndarray, preds: np.ndarray) -> float:
    _check_inputs(targets, preds)
    return 0.0 if np.all(targets == 0) else average_precision_score(targets, preds)


def _at_k(targets: np.ndarray, preds: np.ndarray, k: int, recall: bool) -> float:
    _check_inputs(targets, preds)
    relevant = np.flatnonzero(targets == 1)
    if len(relevant) == 0:
        return 0.0
    hits = len(np.intersect1d(np.argsort(preds)[::-1][:k], relevant))
    return hits / (len(relevant) if recall else k)


def _reference_metrics(preds: list, targets: list) -> float:
    """The reference logger's end-of-phase metrics: AP per class plus precision/recall@k."""
    y_pred = np.array(preds)
    y_true = np.array(np.array(targets) == 1, dtype=np.float32)
    aps = [_average_precision(y_true[:, j], y_pred[:, j]) for j in range(y_true.shape[1])]
    for k in (1, 3, 5):
        for i in range(len(y_true)):
            _at_k(y_true[i], y_pred[i], k, recall=True)
            _at_k(y_true[i], y_pred[i], k, recall=False)
    return 100.0 * float(np.mean(aps))


def reference_config_epochs(labels_path: Path, features_path: Path, bsize: int, lr: float,
                            epochs: int, device: torch.device, workers: int = 4) -> float:
    """Seconds per configuration-epoch of the reference-style loop (AN-LS).

    As the reference's ``train.py``: DataLoaders with 4 workers and ``drop_last=True`` for the
    three phases, a dict per example, the loss's validation asserts, per-example Python lists
    in the logger, and its metrics twice per phase (against the clean and the observed labels).
    """
    data = load_linear_data(labels_path, features_path)
    loaders = {}
    for name, split in (("train", data.train), ("val", data.val), ("test", data.test)):
        dataset = FeatureRows(split.features.numpy(), split.observed.numpy(),
                              (split.clean if split.clean is not None else split.observed).numpy())
        loaders[name] = torch.utils.data.DataLoader(dataset, batch_size=bsize, num_workers=workers,
                                                    shuffle=name == "train", drop_last=True)
    model = torch.nn.Linear(data.feature_dim, data.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    started = time.perf_counter()
    for _ in range(epochs):
        for phase in ("train", "val", "test"):
            preds, trues, observed_rows, indices = [], [], [], []
            model.train(phase == "train")
            for batch in loaders[phase]:
                x = batch["image"].to(device)
                observed = batch["label_vec_obs"].to(device)
                with torch.set_grad_enabled(phase == "train"):
                    p = torch.sigmoid(model(x))
                    if phase == "train":
                        optimizer.zero_grad()
                        assert torch.max(observed) <= 1 and torch.min(observed) >= -1
                        assert torch.max(p) <= 1 and torch.min(p) >= 0
                        _reference_an_ls(p, observed).backward()
                        optimizer.step()
                p_np = p.detach().cpu().numpy()
                for i in range(len(batch["idx"])):
                    preds.append(p_np[i, :].tolist())
                    trues.append(batch["label_vec_true"][i, :].tolist())
                    observed_rows.append(batch["label_vec_obs"][i, :].tolist())
                    indices.append(int(batch["idx"][i]))
            _reference_metrics(preds, trues)
            _reference_metrics(preds, observed_rows)
    return (time.perf_counter() - started) / epochs


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="voc")
    parser.add_argument("--loss", default="an-ls")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--baseline-epochs", type=int, default=1,
                        help="epochs of the baseline per batch size (then scaled to 8 x 25)")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--all-losses", action="store_true", help="also time every loss's search")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    info = machine(device)
    labels_path, features_path, source = synthetic_dataset(args.size)
    data = load_linear_data(labels_path, features_path, device=device)

    def search(loss: str):
        spec = SearchSpec(loss=loss)  # every parameter resolved by run_search
        return run_search(data, spec, device=device, progress=False)

    search(args.loss)  # warm-up: allocator, thread pools
    result = search(args.loss)
    ours = result.seconds
    document = {"benchmark": "linear-search", "size": args.size, "labels": source,
                "loss": args.loss, "machine": info, "ours_seconds": ours,
                "sizes": {"train": len(data.train), "val": len(data.val), "test": len(data.test),
                          "classes": data.num_classes, "dim": data.feature_dim},
                "selected_test_map": result.selected.best.test_map}
    table = Table(["what", "seconds", "per config-epoch (s)", "speed-up"])
    table.add(f"featcache search, {args.loss} (8 configs x 25 epochs)", ours, ours / 200, None)
    if not args.no_baseline:
        per_epoch = {bs: reference_config_epochs(labels_path, features_path, bs, 1e-3,
                                                 args.baseline_epochs, device) for bs in (8, 16)}
        baseline = sum(4 * 25 * s for s in per_epoch.values())
        document.update(baseline_seconds_per_config_epoch=per_epoch,
                        baseline_seconds_estimated=baseline, speedup=baseline / ours,
                        baseline_epochs_measured=args.baseline_epochs)
        table.add("reference-style loop, bs 8 (measured)", per_epoch[8], per_epoch[8], None)
        table.add("reference-style loop, bs 16 (measured)", per_epoch[16], per_epoch[16], None)
        table.add("reference-style search (scaled to 8 x 25)", baseline, baseline / 200, baseline / ours)
    if args.all_losses:
        started = time.perf_counter()
        per_loss = {}
        for loss in loss_names():
            try:
                per_loss[loss] = search(loss).seconds
            except Exception as exc:  # a loss the data cannot serve
                per_loss[loss] = f"skipped: {exc}"
        total = time.perf_counter() - started
        document.update(all_losses_seconds=total, per_loss_seconds=per_loss)
        table.add(f"every loss ({len(per_loss)} searches)", total, None, None)
    print(f"machine: {describe(info)}; data: {args.size}-sized ({source}), "
          f"{len(data.train)}/{len(data.val)}/{len(data.test)} x {data.feature_dim}")
    print(table.markdown())
    if args.all_losses:
        for loss, seconds in document["per_loss_seconds"].items():
            print(f"  {loss}: {seconds if isinstance(seconds, str) else f'{seconds:.1f} s'}")
    path = save(f"linear-{args.size}-{device.type}", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
