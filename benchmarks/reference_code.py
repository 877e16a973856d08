"""The authors' own training loop as a baseline: Cole et al.'s ``train.py``, run unmodified from
a clone of https://github.com/elijahcole/single-positive-multi-label on the benchmark's data.

``benchmarks.linear --reference-code PATH`` runs it beside the loop written the reference's
way, so the side-by-side figure can be checked against the authors' code itself. Each batch
size runs in a child process (their modules are named ``train``, ``datasets``, ``metrics``...,
which must not meet ours). Their loader reads ``data/pascal/formatted_*.npy`` and the feature
files relative to the working directory; the official training split is our train + val
rows (they draw their own 80/20 split with their seed: the same sizes, other rows), the test
split is theirs "val". Their code spells ``np.Inf``, which NumPy 2 removed: the child
restores that one alias before importing it; nothing else is touched.

    python -m benchmarks.reference_code --repo PATH --data DIR --bsize 8 --epochs 1
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from featcache.linear.data import TrainingSplits

ROOT = Path(__file__).resolve().parents[1]


def write_reference_layout(data: TrainingSplits, root: Path) -> Path:
    """``data`` in the reference loader's layout under ``root`` (the run's working directory)."""
    folder = root / "data" / "pascal"
    folder.mkdir(parents=True, exist_ok=True)

    def rows(*splits):
        return {key: np.concatenate([getattr(s, key).cpu().numpy() for s in splits])
                for key in ("features", "clean", "observed")}

    for phase, split in (("train", rows(data.train, data.val)), ("val", rows(data.test))):
        np.save(folder / f"formatted_{phase}_labels.npy", split["clean"].astype(np.float32))
        np.save(folder / f"formatted_{phase}_labels_obs.npy",
                np.clip(split["observed"], 0, 1).astype(np.float32))
        np.save(folder / f"formatted_{phase}_images.npy",
                np.array([f"{phase}/{i:06d}.jpg" for i in range(len(split["clean"]))]))
        np.save(folder / f"{phase}_features_imagenet_resnet50.npy",
                split["features"].astype(np.float32))
    return root


def authors_config_epochs(repo: Path, root: Path, bsize: int, epochs: int, lr: float = 1e-3,
                          loss: str = "an") -> float:
    """Seconds per configuration-epoch of the authors' loop (a child process, timed inside)."""
    command = [sys.executable, "-m", "benchmarks.reference_code", "--repo", str(repo.resolve()),
               "--data", str(root.resolve()), "--bsize", str(bsize), "--epochs", str(epochs), "--lr", str(lr),
               "--loss", loss]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"the reference code failed ({' '.join(command)}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds_per_config_epoch"]


def _params(bsize: int, epochs: int, lr: float, loss: str, root: Path) -> dict:
    """The reference ``train.py``'s parameters for a fixed-features linear run on VOC."""
    feats = root / "data" / "pascal" / "{}_features_imagenet_resnet50.npy"
    return {
        "dataset": "pascal", "loss": loss.replace("-", "_"), "train_mode": "linear_fixed_features",
        "val_set_variant": "clean", "experiment_name": "featcache_bench", "load_path": "./data",
        "save_path": str(root / "results"), "lr_mult": 10.0, "stop_metric": "map",
        "ls_coef": 0.1, "seed": 1200, "use_pretrained": True, "num_workers": 4,
        "split_seed": 1200, "val_frac": 0.2, "ss_seed": 999, "ss_frac_train": 1.0,
        "ss_frac_val": 1.0, "train_set_variant": "observed", "num_epochs": epochs,
        "freeze_feature_extractor": True, "use_feats": True, "arch": "linear",
        "feature_extractor_arch": "resnet50", "feat_dim": 2048, "expected_num_pos": 1.5,
        "train_feats_file": str(feats).format("train"), "val_feats_file": str(feats).format("val"),
        "bsize": bsize, "lr": lr,
    }


def _run_child(args) -> None:
    np.Inf = np.inf  # removed in NumPy 2; the reference code still uses the old alias
    root = Path(args.data).resolve()
    sys.path.insert(0, str(Path(args.repo).resolve()))
    os.chdir(root)
    import train as reference  # noqa: PLC0415 (their module, importable only from their clone)

    params = _params(args.bsize, args.epochs, args.lr, args.loss, root)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # their 4 loader workers on 2 cores
        params, state, model = reference.initialize_training_run(copy.deepcopy(params), None,
                                                                 None, None)
        model.to(state["device"])
        started = time.perf_counter()
        reference.train(model, params, state)
        seconds = time.perf_counter() - started
    sizes = {phase: len(dataset) for phase, dataset in state["datasets"].items()}
    print(json.dumps({"seconds_per_config_epoch": seconds / args.epochs, "sizes": sizes}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True, help="a clone of the authors' repository")
    parser.add_argument("--data", required=True, help="a folder from write_reference_layout")
    parser.add_argument("--bsize", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--loss", default="an")
    _run_child(parser.parse_args())
