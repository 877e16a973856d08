"""Stage two at full speed and any size: every figure of README "Performance" (stage two).

1. Speed, side by side (default): the 8-configuration x 25-epoch search of one loss
   (``--loss``, default ``an``) with ``featcache.linear.engine.search.run_search``, next to the
   reference loop measured in the same run. The reference loop is Cole et al.'s ``train.py``
   as it trains one configuration: a DataLoader with its 4 workers over the feature rows
   yielding a dict per example, the label estimator's forward on every batch, the loss built
   with boolean-mask assignments, per-example Python lists in the logger, and the logger's
   metrics (AP per class with scikit-learn plus precision/recall@k loops) against the clean
   and the observed labels for train, val and test every epoch. It runs a few
   configuration-epochs (one per batch size by default) and is scaled to the search: mean
   seconds per configuration-epoch of each batch size x 4 learning rates x 25 epochs.
   Then the whole command as a user runs it, ``featcache train-linear --loss LOSS`` in a fresh
   process from start to exit (results, best.pt, summary, curves.png): the median wall and CPU
   seconds of ``--command-repeat`` runs, and one run under cProfile split into phases (import,
   reading, the search, writing, the plot); ``--command-baseline REF`` runs the code at git
   revision REF beside it.
2. ``--all-losses``: ``featcache train-linear --loss all`` (every loss, outputs and plots);
   ``--all-losses-timeout S`` stops it (with every process it started) after S seconds and
   records the losses it finished.
3. ``--out-of-core``: generated features files (built once under cache/bench/data,
   ``--delete-big`` removes them afterwards) trained by ``featcache train-linear`` in a child
   process: 250,000 x 2048 float32 (2 GB), one configuration, ``--max-memory 256MB``; and
   1,000,000 x 2048 float16 (4 GB), the default grid, ``--max-memory 1GB``. Each: time per
   epoch, the plan (blocks, window), and the peak memory of the process tree (RSS summed, and
   PSS, which counts shared pages once) less the PSS of an interpreter that has only imported
   torch and featcache (what the budget counts).
4. ``--stream-check``: the real ``bibtex`` and ``tmc2007-500`` feature sets (../shared/data
   or $FEATCACHE_SHARED_DATA), the search in memory and streamed (blocks of 1024 rows, 2
   blocks per shuffle window), over several seeds: selected test mAP mean and std.

Data for 1 and 2: VOC-sized features (4,574 train / 1,143 val / 5,823 test, 2,048-d, 20
classes) with the real VOC2012 label matrices when the shared data is present (else VOC-like
generated labels), or COCO-sized (65,665 / 16,416 / 40,137, 80 classes) with ``--size coco``.
Features are generated: non-negative, label-dependent, so training does something real.
Every timed block also records the CPU time other processes took meanwhile. ``--no-search``,
``--no-command`` and ``--no-variants`` leave parts out (the gpu-check runs the search, the
command and ``--loss all`` as separate processes with time limits), and ``--partial PATH``
writes the figures measured so far after each one, for a caller that may have to stop the run.

    python -m benchmarks.linear                       # 1: VOC-sized, an, CPU
    python -m benchmarks.linear --all                 # 1-4: every figure of the README
    python -m benchmarks.linear --all-losses --out-of-core --delete-big
    python -m benchmarks.linear --size coco --device cuda
    python -m benchmarks.linear --reference-code ../single-positive-multi-label  # + the authors' loop
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import average_precision_score

from benchmarks import record
from benchmarks._common import (
    BENCH_DIR,
    Busy,
    describe,
    environment,
    machine,
    save,
    tree_memory,
)
from benchmarks.reference_code import authors_config_epochs, write_reference_layout
from featcache.data.featurewrite import write_features
from featcache.data.labelfile import LabelSet, SplitLabels, load_labels, write_labels
from featcache.data.sampling import observe_uniform, split_train_val
from featcache.fileio import write_json_atomic
from featcache.linear.data import load_linear_data
from featcache.linear.engine.search import SearchSpec, run_search
from featcache.linear.memory import parse_size
from featcache.protocol.runs import load_results
from featcache.runtime import usable_cpus
from featcache.tables import Table

SIZES = {
    "voc": {"train": 5717, "test": 5823, "classes": 20, "k": 1.46},
    "coco": {"train": 82081, "test": 40137, "classes": 80, "k": 2.9},
}
SHARED_DATA = Path(os.environ.get("FEATCACHE_SHARED_DATA",
                                  Path(__file__).resolve().parents[2] / "shared" / "data"))
SHARED_VOC = SHARED_DATA / "voc2012_labels"
ROOT = Path(__file__).resolve().parents[1]
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
    if (features_path.exists() and labels_path.exists()  # a set from before the marker: again
            and load_labels(labels_path).provenance.get("source_format") == "generated"):
        return labels_path, features_path, source
    classes = [f"class{i:02d}" for i in range(train.shape[1])]
    train_idx, val_idx = split_train_val(len(train))
    labels = LabelSet(
        dataset=name, classes=classes,
        train=SplitLabels(np.array([f"train/{i:06d}" for i in range(len(train))], dtype=object),
                          observe_uniform(train), train),
        test=SplitLabels(np.array([f"test/{i:06d}" for i in range(len(test))], dtype=object),
                         observe_uniform(test), test),
        train_index=train_idx, val_index=val_idx, provenance={"source": f"benchmark, {source}",
                                                        "source_format": "generated"},
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


def _reference_an(preds: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
    """AN the reference's way: boolean-mask assignments into a zero matrix."""
    loss_mtx = torch.zeros_like(observed)
    loss_mtx[observed == 1] = -torch.log(preds[observed == 1] + 1e-5)
    loss_mtx[observed == 0] = -torch.log(1.0 - preds[observed == 0] + 1e-5)
    return (loss_mtx / (preds.shape[0] * preds.shape[1])).sum()


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


REFERENCE_LOSSES = {"an": _reference_an, "an-ls": _reference_an_ls}


def reference_config_epochs(labels_path: Path, features_path: Path, bsize: int, lr: float,
                            epochs: int, device: torch.device, loss: str = "an",
                            workers: int = 4) -> float:
    """Seconds per configuration-epoch of the reference-style loop (AN or AN-LS).

    As the reference's ``train.py``: DataLoaders with 4 workers and ``drop_last=True`` for the
    three phases, a dict per example, the label estimator (an N x L parameter, in the
    optimizer at 10x the rate, sigmoid of its rows on every batch; its estimates read after
    every phase), the loss's validation asserts, per-example Python lists in the logger, and
    its metrics twice per phase (against the clean and the observed labels).
    """
    with warnings.catch_warnings():  # its 4 workers on 2 cores, as the reference has them
        warnings.simplefilter("ignore", UserWarning)
        return _reference_config_epochs(labels_path, features_path, bsize, lr, epochs, device,
                                        loss, workers)


def _reference_config_epochs(labels_path, features_path, bsize, lr, epochs, device, loss,
                             workers) -> float:
    loss_fn = REFERENCE_LOSSES.get(loss, _reference_an_ls)
    data = load_linear_data(labels_path, features_path)
    loaders = {}
    for name, split in (("train", data.train), ("val", data.val), ("test", data.test)):
        dataset = FeatureRows(split.features.numpy(), split.observed.numpy(),
                              (split.clean if split.clean is not None else split.observed).numpy())
        loaders[name] = torch.utils.data.DataLoader(dataset, batch_size=bsize, num_workers=workers,
                                                    shuffle=name == "train", drop_last=True)
    model = torch.nn.Linear(data.feature_dim, data.num_classes).to(device)
    estimator = torch.nn.Parameter(torch.zeros(len(data.train), data.num_classes, device=device))
    optimizer = torch.optim.Adam([{"params": model.parameters(), "lr": lr},
                                  {"params": [estimator], "lr": 10 * lr}], lr=lr)
    started = time.perf_counter()
    for _ in range(epochs):
        for phase in ("train", "val", "test"):
            preds, trues, observed_rows, indices, losses = [], [], [], [], []
            model.train(phase == "train")
            for batch in loaders[phase]:
                x = batch["image"].to(device)
                labels_np = batch["label_vec_obs"].clone().numpy()  # noqa: F841 (as the reference)
                observed = batch["label_vec_obs"].to(device)
                with torch.set_grad_enabled(phase == "train"):
                    if phase == "train":
                        optimizer.zero_grad()
                    p = torch.sigmoid(model(x))
                    if phase == "train":
                        torch.sigmoid(estimator[batch["idx"]])  # the label estimator's forward
                        assert torch.max(observed) <= 1 and torch.min(observed) >= -1
                        assert torch.max(p) <= 1 and torch.min(p) >= 0
                        loss_value = loss_fn(p, observed)
                        loss_value.backward()
                        optimizer.step()
                        losses.append(float(loss_value.clone().detach().cpu().numpy()))
                p_np = p.clone().detach().cpu().numpy()
                for i in range(len(batch["idx"])):
                    preds.append(p_np[i, :].tolist())
                    trues.append(batch["label_vec_true"][i, :].tolist())
                    observed_rows.append(batch["label_vec_obs"][i, :].tolist())
                    indices.append(int(batch["idx"][i]))
            _reference_metrics(preds, trues)
            _reference_metrics(preds, observed_rows)
            estimates = torch.sigmoid(estimator.detach()).cpu().numpy()
            float(np.mean(np.sum(estimates, axis=1)))
    return (time.perf_counter() - started) / epochs


# ---------------------------------------------------------------------------- big data
def big_dataset(rows: int, dtype: str = "float16", root: Path = BENCH_DIR / "data",
                block: int = 65536) -> tuple[Path, Path]:
    """A labels file and a ``rows`` x 2048 features file (80 % official train, 20 % test; VOC's
    20 classes, generated labels), written block by block (built once, then reused)."""
    name = f"big-{rows}"
    labels_path, features_path = root / name / "labels.h5", root / name / f"features-{dtype}.h5"
    if labels_path.exists() and features_path.exists():
        return labels_path, features_path
    rng = np.random.default_rng(0)
    spec = SIZES["voc"]
    n_train = int(rows * 0.8)
    prior = np.log(rng.dirichlet(np.full(spec["classes"], 0.6)))
    splits = {}
    for part, n in (("train", n_train), ("test", rows - n_train)):
        counts = np.clip(rng.poisson(spec["k"] - 1, n) + 1, 1, spec["classes"])
        keys = prior - np.log(-np.log(rng.random((n, spec["classes"]))))  # Gumbel top-k
        rank = np.argsort(np.argsort(-keys, axis=1), axis=1)
        splits[part] = (rank < counts[:, None]).astype(np.uint8)
    train_idx, val_idx = split_train_val(n_train)
    labels = LabelSet(
        dataset=name, classes=[f"class{i:02d}" for i in range(spec["classes"])],
        train=SplitLabels(np.array([f"train/{i:07d}" for i in range(n_train)], dtype=object),
                          observe_uniform(splits["train"]), splits["train"]),
        test=SplitLabels(np.array([f"test/{i:07d}" for i in range(rows - n_train)], dtype=object),
                         observe_uniform(splits["test"]), splits["test"]),
        train_index=train_idx, val_index=val_idx,
        provenance={"source": "benchmark, generated", "source_format": "generated"},
    )
    write_labels(labels, labels_path, overwrite=True)
    labels = load_labels(labels_path)
    basis = rng.standard_normal((spec["classes"], FEATURE_DIM), dtype=np.float32)

    def blocks(y):
        for start in range(0, len(y), block):
            yield _features(y[start:start + block], basis, rng).astype(dtype)

    write_features(features_path, labels, {"train": blocks(splits["train"]),
                                           "test": blocks(splits["test"])},
                   {"backbone": "synthetic", "weights": "none"}, overwrite=True, dtype=dtype)
    return labels_path, features_path


# ---------------------------------------------------------------------------- measurements
def measure_speed(args, device, labels_path, features_path, table: Table,
                  keep=lambda out: None) -> dict:
    """Ours and the reference loop, side by side in one run (``keep(out)`` sees the figures
    so far after each one)."""
    data = load_linear_data(labels_path, features_path, device=device)
    run_search(data, SearchSpec(loss=args.loss, epochs=2), device=device, progress=False,
               jobs=args.jobs)  # warm-up: allocator, worker start-up
    with Busy() as ours_busy:
        result = run_search(data, SearchSpec(loss=args.loss), device=device, progress=False,
                            jobs=args.jobs)
    ours = result.seconds
    out = {"loss": args.loss, "ours_seconds": ours, "ours_busy": ours_busy.record(),
           "jobs": args.jobs or usable_cpus(),
           "sizes": {"train": len(data.train), "val": len(data.val), "test": len(data.test),
                     "classes": data.num_classes, "dim": data.feature_dim},
           "selected_test_map": result.selected.best.test_map}
    table.add(f"featcache search, {args.loss} (8 configs x 25 epochs)", ours, ours / 200, None,
              ours_busy.others)
    print(f"  ours: {ours:.2f} s; {ours_busy.note()}", flush=True)
    keep(out)
    out["arithmetic"] = arithmetic(out["sizes"], ours, out["jobs"])
    work = out["arithmetic"]
    print(f"  arithmetic: {work['gflop']:.0f} GFLOP of matmuls (training {work['training_gflop']:.0f},"
          f" evaluation {work['evaluation_gflop']:.0f}) at {work['gflops_reached']:.1f} GFLOP/s; "
          f"this machine's sgemm peak {work['peak_gflops']:.0f} GFLOP/s would take "
          f"{work['floor_seconds']:.1f} s; the other {work['rest_seconds']:.1f} s are "
          f"{work['steps']:,} optimizer steps at {work['rest_cpu_us_per_step']:.0f} CPU-us each "
          "(loss, Adam over every weight, dispatch)", flush=True)
    if device.type == "cuda" and not args.no_variants:
        keep(out)
        out["cuda_variants"] = cuda_variants(args, data, device, table,
                                             lambda done: keep({**out, "cuda_variants": done}))
    keep(out)
    if args.no_baseline:
        return out
    reference = "an" if args.loss == "an" else "an-ls"
    with Busy() as busy:
        per_epoch = {bs: reference_config_epochs(labels_path, features_path, bs, 1e-3,
                                                 args.baseline_epochs, device, reference)
                     for bs in (8, 16)}
    baseline = sum(4 * 25 * s for s in per_epoch.values())
    out.update(baseline_loss=reference, baseline_seconds_per_config_epoch=per_epoch,
               baseline_seconds_estimated=baseline, speedup=baseline / ours,
               baseline_epochs_measured=args.baseline_epochs, baseline_busy=busy.record())
    for bs in (8, 16):
        table.add(f"reference loop ({reference}), bs {bs}, measured", per_epoch[bs] *
                  args.baseline_epochs, per_epoch[bs], None, None)
    table.add(f"reference loop ({reference}), scaled to 8 x 25", baseline, baseline / 200,
              baseline / ours, busy.others)
    print(f"  reference: {baseline:.0f} s estimated; {busy.note()}", flush=True)
    if args.reference_code:
        out["authors_code"] = measure_authors_code(args, data, reference, ours, table)
    return out


def cuda_variants(args, data, device, table: Table, keep=lambda out: None) -> dict:
    """The same search on CUDA without graphs (``FEATCACHE_CUDA_GRAPHS=0``) and with one group
    at a time (``FEATCACHE_CUDA_GROUPS=1``): what the graphs and the groups trained at once
    each bring (``keep(out)`` sees each as it is measured)."""
    from featcache.linear.engine.graphs import GRAPHS_ENV
    from featcache.linear.engine.workers import CUDA_GROUPS_ENV

    out = {}
    for label, env in (("without CUDA graphs", {GRAPHS_ENV: "0"}),
                       ("one group at a time", {CUDA_GROUPS_ENV: "1"})):
        with environment(**env), Busy() as busy:
            seconds = run_search(data, SearchSpec(loss=args.loss), device=device,
                                 progress=False).seconds
        out[label] = {"seconds": seconds, "env": env, "busy": busy.record()}
        table.add(f"featcache search, {args.loss}, {label}", seconds, seconds / 200, None,
                  busy.others)
        print(f"  ours, {label}: {seconds:.2f} s; {busy.note()}", flush=True)
        keep(out)
    return out


def sgemm_peak(size: int = 2048, repeat: int = 8) -> float:
    """GFLOP/s of a large float32 matmul on every core torch uses: the arithmetic's ceiling."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    started = time.perf_counter()
    for _ in range(repeat):
        a @ b
    return 2 * size**3 * repeat / (time.perf_counter() - started) / 1e9


def arithmetic(sizes: dict, seconds: float, jobs: int, batch_sizes=(8, 16), heads: int = 4,
               epochs: int = 25) -> dict:
    """The default search's matmul work (per group of ``heads`` learning rates and per batch
    size: forward and weight gradient of every training step, the validation and test scores of
    every epoch), the rate it ran at, and what is left at this machine's sgemm peak."""
    n, dim, classes = sizes["train"], sizes["dim"], sizes["classes"]
    per_row = 2 * dim * classes * heads
    steps = sum(n // b for b in batch_sizes) * epochs
    training = sum(2 * (n // b) * b * per_row for b in batch_sizes) * epochs
    evaluation = (sizes["val"] + sizes["test"]) * per_row * len(batch_sizes) * epochs
    total = training + evaluation
    peak = sgemm_peak()
    floor = total / peak / 1e9
    return {"gflop": total / 1e9, "training_gflop": training / 1e9,
            "evaluation_gflop": evaluation / 1e9, "gflops_reached": total / seconds / 1e9,
            "peak_gflops": peak, "floor_seconds": floor, "rest_seconds": seconds - floor,
            "steps": steps, "rest_cpu_us_per_step": (seconds - floor) * jobs / steps * 1e6}


#: runs ``featcache ARGV`` under cProfile and prints, as JSON, the seconds each phase of the
#: main process took (the workers' time is their CPU time, ``children_cpu``)
PHASES = """
import cProfile, json, os, pstats, sys, time
started, before = time.perf_counter(), os.times()
profile = cProfile.Profile()
profile.enable()
import featcache.linear.run
imported = time.perf_counter() - started
from featcache.cli import cli
try:
    cli.main(sys.argv[1:], prog_name="featcache")
except SystemExit as exc:
    assert not exc.code, exc.code
profile.disable()
after = os.times()
stats = pstats.Stats(profile).stats
def cumulative(name):
    return sum(v[3] for k, v in stats.items() if k[2] == name and 'featcache' in k[0])
phases = {"import torch and featcache": imported,
          "read labels and features": cumulative("load_training_data"),
          "search (workers)": cumulative("run_searches") - cumulative("write_loss_run"),
          "write results, best.pt, summary (curves.png drawn meanwhile)": cumulative("write_run")}
phases["the rest (command line, labels, checks)"] = (
    time.perf_counter() - started - sum(phases.values()))
print("PHASES " + json.dumps({"phases": phases, "main_cpu": after.user - before.user
      + after.system - before.system, "children_cpu": after.children_user
      + after.children_system}))
"""


def measure_command(args, labels_path: Path, table: Table, keep=lambda out: None) -> dict:
    """The whole ``featcache train-linear --loss LOSS`` as a user runs it, from process start to
    exit (results, best.pt, summary and curves.png written): wall and CPU seconds of plain runs,
    then one run under cProfile split into phases; with ``--command-baseline REF`` the code at
    git revision REF runs beside it, alternating."""
    from benchmarks.commands import export_revision

    argv = ["train-linear", "--dataset", labels_path.parent.name, "--cache",
            str(labels_path.parent.parent.resolve()), "--loss", args.loss, "--device",
            args.device, "--run-id", "bench-command", "--overwrite", "--quiet"]
    out = {"command": "featcache " + " ".join(argv), "versions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"this checkout": str(ROOT)}
        if args.command_baseline:
            versions[f"at {args.command_baseline}"] = str(
                export_revision(args.command_baseline, Path(tmp)))
        runs = {version: [] for version in versions}
        for _ in range(args.command_repeat):
            for version, path in versions.items():
                env = {**os.environ, "PYTHONPATH": path}
                load, before = os.getloadavg()[0], os.times()
                with Busy() as busy:
                    subprocess.run([sys.executable, "-m", "featcache", *argv], cwd=path, env=env,
                                   check=True, capture_output=True)
                after = os.times()
                runs[version].append({"seconds": busy.seconds, "load_before": round(load, 2),
                                      "cpu": after.children_user - before.children_user
                                      + after.children_system - before.children_system,
                                      "others_cpu": busy.others})
                keep({**out, "runs": runs})
        for version, path in versions.items():
            done = subprocess.run([sys.executable, "-c", PHASES, *argv], cwd=path, check=True,
                                  capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": path})
            line = next(x for x in done.stdout.splitlines() if x.startswith("PHASES "))
            median = sorted(runs[version], key=lambda r: r["seconds"])[len(runs[version]) // 2]
            out["versions"][version] = {"runs": runs[version], "median": median,
                                        "profiled": json.loads(line[len("PHASES "):])}
            table.add(f"the whole command, {args.loss} ({version}; median of "
                      f"{args.command_repeat}, {median['cpu']:.1f} CPU-s)", median["seconds"],
                      median["seconds"] / 200, None, median["others_cpu"])
            phases = out["versions"][version]["profiled"]["phases"]
            print(f"  whole command ({version}): {median['seconds']:.2f} s, {median['cpu']:.1f} "
                  f"CPU-s, load {median['load_before']:.1f}; profiled: " + ", ".join(
                      f"{name} {seconds:.2f} s" for name, seconds in phases.items()), flush=True)
    return out


def measure_authors_code(args, data, loss: str, ours: float, table: Table) -> dict:
    """The authors' own ``train.py`` (a clone at ``--reference-code``) on the same data."""
    root = write_reference_layout(data, BENCH_DIR / "reference-code" / args.size)
    with Busy() as busy:
        per_epoch = {bs: authors_config_epochs(Path(args.reference_code), root, bs,
                                               args.baseline_epochs, loss=loss) for bs in (8, 16)}
    total = sum(4 * 25 * s for s in per_epoch.values())
    for bs in (8, 16):
        table.add(f"the authors' train.py ({loss}), bs {bs}, measured",
                  per_epoch[bs] * args.baseline_epochs, per_epoch[bs], None, None)
    table.add(f"the authors' train.py ({loss}), scaled to 8 x 25", total, total / 200,
              total / ours, busy.others)
    print(f"  the authors' code: {total:.0f} s estimated; {busy.note()}", flush=True)
    return {"repository": str(args.reference_code), "seconds_per_config_epoch": per_epoch,
            "seconds_estimated": total, "speedup": total / ours, "busy": busy.record()}


def measure_all_losses(args, device, labels_path, table: Table, loss: str = "all") -> dict:
    """``featcache train-linear --loss all`` (or ``--loss LOSS``) as a user runs it: a fresh
    process from start to exit (every loss's results, best.pt, summary and curves.png, the
    losses table); with ``--command-baseline REF`` the code at git revision REF runs it too,
    after this checkout. With ``--all-losses-timeout S`` a run still going after S seconds is
    stopped (its whole process group) and recorded as timed out, with the losses it finished."""
    from benchmarks.commands import export_revision

    cache = labels_path.parent.parent.resolve()
    run_id = f"bench-{loss.replace(',', '-')}"
    argv = ["train-linear", "--dataset", labels_path.parent.name, "--cache", str(cache),
            "--loss", loss, "--device", args.device, "--run-id", run_id, "--overwrite",
            "--quiet", *(["--jobs", str(args.jobs)] if args.jobs else [])]
    out: dict = {"command": "featcache " + " ".join(argv), "versions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"this checkout": str(ROOT)}
        if args.command_baseline:
            versions[f"at {args.command_baseline}"] = str(
                export_revision(args.command_baseline, Path(tmp)))
        for version, path in versions.items():
            before, began = os.times(), time.time()
            with Busy() as busy:
                timed_out = run_until([sys.executable, "-m", "featcache", *argv], path,
                                      getattr(args, "all_losses_timeout", None))
            after = os.times()
            runs = sorted(p for p in (cache / labels_path.parent.name / "runs").glob(
                f"*/{run_id}/results.json") if p.stat().st_mtime >= began)
            per_loss = {p.parent.parent.name: json.loads(p.read_text())["timings"]["seconds"]
                        for p in runs}
            cpu = (after.children_user - before.children_user + after.children_system
                   - before.children_system)
            out["versions"][version] = {"seconds": busy.seconds, "cpu_seconds": cpu,
                                        "losses": len(per_loss), "per_loss_seconds": per_loss,
                                        "busy": busy.record(), "timed_out": timed_out}
            stopped = "; stopped: out of time" if timed_out else ""
            table.add(f"train-linear --loss {loss}, whole command ({len(per_loss)} losses, 8 x "
                      f"25 each; {version}, {cpu:.0f} CPU-s{stopped})", busy.seconds, None,
                      None, busy.others)
            print(f"  --loss {loss} ({version}): {busy.seconds:.0f} s, {cpu:.0f} CPU-s"
                  f"{stopped} ({len(per_loss)} losses done); {busy.note()}", flush=True)
    ours = out["versions"]["this checkout"]
    out["all_losses_seconds"] = None if ours["timed_out"] else ours["seconds"]
    for version, found in out["versions"].items():
        if version != "this checkout" and not (found["timed_out"] or ours["timed_out"]):
            found["speedup"] = found["seconds"] / ours["seconds"]
    return out


def run_until(argv: list[str], cwd: str, timeout: float | None) -> bool:
    """Run ``argv`` (featcache at ``cwd`` first on the path) to its end, or stop it and every
    process it started after ``timeout`` seconds: whether it was stopped. A failure raises,
    with the end of its error output."""
    process = subprocess.Popen(argv, cwd=cwd, env={**os.environ, "PYTHONPATH": cwd},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        _, error = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return True
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, argv, stderr=error[-2000:])
    return False


MEMORY_FIELDS = ("Rss", "Pss", "Pss_Anon")


def interpreter_pss() -> tuple[int, int, int]:
    """RSS, PSS and anonymous PSS of a fresh interpreter that has only imported torch and
    featcache's stage two: what ``--max-memory`` does not count."""
    code = ("import sys, torch, featcache.cli, featcache.linear.run\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    child.stdout.readline()
    time.sleep(0.5)
    sizes = tree_memory(child.pid, MEMORY_FIELDS)
    child.communicate("")
    return sizes


def measure_out_of_core(args, table: Table, rows: int, dtype: str, budget_text: str,
                        grid: list[str], what: str) -> dict:
    """A ``rows`` x 2048 features file trained under ``--max-memory`` in a child process: time
    per epoch, the plan (blocks, window) and the peak memory of the process tree (RSS summed,
    and PSS, which counts shared pages once) less that of a bare interpreter."""
    with Busy() as built:
        labels_path, features_path = big_dataset(rows, dtype)
    size = features_path.stat().st_size
    print(f"  {features_path} ({size / 2**30:.2f} GiB) ready in {built.seconds:.0f} s", flush=True)
    run_id = f"bench-ooc-{budget_text}"
    command = [sys.executable, "-m", "featcache", "train-linear", "--dataset",
               labels_path.parent.name, "--cache", str(labels_path.parent.parent), "--loss",
               "an", "--epochs", str(args.big_epochs), *grid, "--max-memory", budget_text,
               "--quiet", "--no-plots", "--device", "cpu", "--run-id", run_id, "--overwrite"]
    _, interpreter, interpreter_anon = interpreter_pss()
    peak_rss = peak_pss = peak_anon = 0
    with Busy() as busy:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        while child.poll() is None:
            rss, pss, anon = tree_memory(child.pid, MEMORY_FIELDS)
            peak_rss, peak_pss, peak_anon = max(peak_rss, rss), max(peak_pss, pss), max(peak_anon, anon)
            time.sleep(0.1)
        output = child.stdout.read()
    if child.returncode != 0:  # a refusal (or failure) is a figure too: keep the run's others
        print(f"  out of core ({what}): failed, exit {child.returncode}: {output.strip()}",
              flush=True)
        table.add(f"{rows:,} x 2048 {dtype}, {what}, --max-memory {budget_text}: failed "
                  f"({output.strip().splitlines()[-1][:160]})", None, None, None, busy.others)
        return {"what": what, "rows": rows, "dtype": dtype, "budget": budget_text,
                "command": " ".join(command[1:]), "returncode": child.returncode,
                "output": output.strip().splitlines()[-3:], "busy": busy.record()}
    results = load_results(labels_path.parent / "runs" / "an" / run_id)
    search = results["timings"]["seconds"]
    per_epoch = search / args.big_epochs
    budget = parse_size(budget_text)
    allocated = peak_pss - interpreter
    out = {"what": what, "rows": rows, "file_bytes": size, "dtype": dtype,
           "budget_bytes": budget, "epochs": args.big_epochs, "search_seconds": search,
           "seconds_per_epoch": per_epoch, "wall_seconds": busy.seconds,
           "peak_rss_tree_bytes": peak_rss, "peak_pss_tree_bytes": peak_pss,
           "interpreter_pss_bytes": interpreter, "allocated_pss_bytes": allocated,
           "peak_pss_anon_tree_bytes": peak_anon, "interpreter_pss_anon_bytes": interpreter_anon,
           "allocated_pss_anon_bytes": peak_anon - interpreter_anon,
           "within_budget": allocated <= budget, "plan": results["protocol"].get("memory"),
           "features": results["protocol"]["features"], "selected_test_map":
           results["selection"]["test_map"], "command": " ".join(command[1:]),
           "busy": busy.record(), "output": output.strip().splitlines()[-3:]}
    table.add(f"{rows:,} x 2048 {dtype} ({size / 2**30:.1f} GiB), {what}, --max-memory "
              f"{budget_text}: peak PSS {allocated / 2**20:.0f} MiB beyond the interpreter's "
              f"{interpreter / 2**20:.0f} (anonymous: {(peak_anon - interpreter_anon) / 2**20:.0f}"
              f" MiB); one epoch", per_epoch, None, None, busy.others)
    print(f"  out of core ({what}): {per_epoch:.0f} s per epoch, peak PSS {peak_pss / 2**20:.0f} "
          f"MiB, {allocated / 2**20:.0f} MiB beyond the interpreter ({interpreter / 2**20:.0f} "
          f"MiB) under {budget_text}; anonymous PSS {(peak_anon - interpreter_anon) / 2**20:.0f} MiB "
          f"beyond the interpreter's; {results['protocol']['features']}; {busy.note()}",
          flush=True)
    if args.delete_big:
        shutil.rmtree(labels_path.parent)
    return out


def measure_streaming_fidelity(args, table: Table) -> dict:
    """Selected test mAP, in memory and streamed, over seeds, on real feature sets."""
    from featcache.cli import cli
    from featcache.data.featurefile import open_features
    from featcache.linear.memory import Placement
    from featcache.linear.stream import load_streamed_data

    out = {}
    root = BENCH_DIR / "data"
    for name in ("bibtex", "tmc2007-500"):
        npz = SHARED_DATA / name / f"{name}.npz"
        if not npz.exists():
            print(f"  {npz} not found: skipping", flush=True)
            continue
        labels_path = root / name / "labels.h5"
        if not labels_path.exists():
            cli.main(["prepare", "features", "--npz", str(npz), "--name", name, "--cache",
                      str(root), "--overwrite"], standalone_mode=False)
        features_path = next((root / name).glob("features-*.h5"))
        memory = load_linear_data(labels_path, features_path)
        labels = load_labels(labels_path)
        placement = Placement(("train",), block_rows=1024, window_blocks=2, forced=True)
        streamed = load_streamed_data(labels, open_features(features_path, labels), placement)
        spec = SearchSpec(loss="an", seeds=tuple(range(args.seeds)))
        maps = {}
        for label, data in (("in memory", memory), ("streamed", streamed)):
            result = run_search(data, spec, progress=False, jobs=args.jobs)
            maps[label] = [s.selected.best.test_map for s in result.seeds]
        out[name] = {"rows": {"train": len(memory.train), "val": len(memory.val),
                              "test": len(memory.test)},
                     "placement": placement.describe(), "loss": "an", "test_map": maps}
        for label, values in maps.items():
            table.add(name, "an", label, len(values), float(np.mean(values)),
                      float(np.std(values, ddof=1)) if len(values) > 1 else 0.0)
        print(f"  {name}: in memory {np.mean(maps['in memory']):.2f} +- "
              f"{np.std(maps['in memory'], ddof=1):.2f}, streamed {np.mean(maps['streamed']):.2f} "
              f"+- {np.std(maps['streamed'], ddof=1):.2f}", flush=True)
    return out


# ---------------------------------------------------------------------------- main
def results_table() -> Table:
    """The table every timed row of this benchmark goes to (its rows are added as measured)."""
    return Table(["what", "seconds", "per config-epoch (s)", "speed-up", "others' CPU-s"],
                 formats={"per config-epoch (s)": "{:.4f}", "others' CPU-s": "{:.1f}"})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="voc")
    parser.add_argument("--loss", default="an")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--jobs", type=int, default=None, help="CPU worker processes (default: one per core)")
    parser.add_argument("--baseline-epochs", type=int, default=1,
                        help="epochs of the reference loop per batch size (then scaled to 8 x 25)")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--reference-code", metavar="PATH",
                        default=os.environ.get("FEATCACHE_REFERENCE_CODE") or None,
                        help="also run the authors' own train.py from this clone of "
                             "elijahcole/single-positive-multi-label (benchmarks.reference_code; "
                             "default: $FEATCACHE_REFERENCE_CODE)")
    parser.add_argument("--no-command", action="store_true",
                        help="leave out the whole train-linear command as a user runs it")
    parser.add_argument("--command-repeat", type=int, default=3,
                        help="plain runs of the whole command (the median is reported)")
    parser.add_argument("--command-baseline", metavar="REF", default=None,
                        help="also run the whole command with featcache at this git revision, "
                             "alternating with this checkout")
    parser.add_argument("--all-losses", action="store_true", help="also time --loss all")
    parser.add_argument("--all-losses-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop --loss all after this many seconds and record the losses it "
                             "finished (default: no limit)")
    parser.add_argument("--no-search", action="store_true",
                        help="leave out the search in the process (figure 1's first rows)")
    parser.add_argument("--no-variants", action="store_true",
                        help="on CUDA, leave out the search without graphs and with one group "
                             "at a time")
    parser.add_argument("--partial", metavar="PATH", default=None,
                        help="also write the figures measured so far to PATH after each one "
                             "(what a caller that has to stop this run reads)")
    parser.add_argument("--out-of-core", action="store_true", help="also the big streamed file")
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--big-epochs", type=int, default=1)
    parser.add_argument("--budget", default="1GB",
                        help="--max-memory of the out-of-core grid run (--big-rows, float16)")
    parser.add_argument("--one-config-rows", type=int, default=250_000,
                        help="rows of the out-of-core one-configuration run (float32)")
    parser.add_argument("--one-config-budget", default="256MB",
                        help="--max-memory of the out-of-core one-configuration runs (on "
                             "--one-config-rows float32 and on the --big-rows file)")
    parser.add_argument("--delete-big", action="store_true", help="delete the big file afterwards")
    parser.add_argument("--stream-check", action="store_true",
                        help="also in-memory vs streamed mAP on bibtex and tmc2007-500")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of --stream-check")
    parser.add_argument("--all", action="store_true", help="every figure (1-4)")
    args = parser.parse_args(argv)
    if args.all:
        args.all_losses = args.out_of_core = args.stream_check = True
    device = torch.device(args.device)
    info = machine(device)
    labels_path, features_path, source = synthetic_dataset(args.size)
    document = {"benchmark": "linear", "command": record.command_line("linear", argv),
                "size": args.size, "labels": source, "machine": info}
    table = results_table()
    print(f"machine: {describe(info)}; data: {args.size}-sized ({source})", flush=True)

    def keep(key: str):
        def kept(figures: dict) -> None:
            document[key] = figures
            if args.partial:
                write_json_atomic(Path(args.partial), document)
        return kept

    keep("table")([])
    if not args.no_search:
        document["speed"] = measure_speed(args, device, labels_path, features_path, table,
                                          keep("speed"))
        keep("speed")(document["speed"])
    if not args.no_command:
        document["command"] = measure_command(args, labels_path, table, keep("command"))
        keep("command")(document["command"])
        authors = document.get("speed", {}).get("authors_code")
        if authors:  # the whole command against the authors' train.py scaled to 8 x 25
            whole = document["command"]["versions"]["this checkout"]["median"]["seconds"]
            document["command"]["speedup_vs_authors"] = authors["seconds_estimated"] / whole
    if args.all_losses:
        document["all_losses"] = measure_all_losses(args, device, labels_path, table)
        keep("all_losses")(document["all_losses"])
    if args.out_of_core:
        one = ["--lr", "1e-3", "--batch-size", "16"]
        document["out_of_core"] = [
            measure_out_of_core(args, table, args.one_config_rows, "float32",
                                args.one_config_budget, one, "one configuration"),
            measure_out_of_core(args, table, args.big_rows, "float16", args.one_config_budget,
                                one, "one configuration"),
            measure_out_of_core(args, table, args.big_rows, "float16", args.budget, [],
                                "the default grid (8 configurations)")]
    if args.stream_check:
        fidelity = Table(["data", "loss", "features", "seeds", "test mAP mean", "std"])
        document["streaming_fidelity"] = measure_streaming_fidelity(args, fidelity)
        document["streaming_table"] = fidelity.records()
    print(table.markdown())
    if args.stream_check:
        print(fidelity.markdown())
    document["table"] = table.records()
    keep("table")(document["table"])
    path = save(f"linear-{args.size}-{device.type}", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
