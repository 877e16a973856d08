"""``make gpu-check``'s stage-two checks (:mod:`benchmarks.gpu_check` runs them).

- graphs vs eager: the same searches on CUDA with each epoch's step replayed as a CUDA graph
  and run step by step (``FEATCACHE_CUDA_GRAPHS=0``): the same selections, every epoch's
  mAP within :data:`TOL_STACKED_MAP`;
- stacked vs alone: every loss of a ``--loss all``-like pass (one stacked group per kind of
  data) against each loss trained alone, on CUDA: the same selections and mAP within
  :data:`TOL_STACKED_MAP` (on the CPU they are equal bit for bit: ``tests/test_linear_stacked.py``);
- CPU after CUDA: stage two on the CPU with worker processes in a process that trained on
  CUDA (forking there broke autograd; workers are not forked there any more);
- the timing rows: ``benchmarks.linear`` on CUDA, the default ``an`` search in the process,
  the whole command, and ``--loss all`` (targets: 1 s, 4 s and 20 s on one H100/H200).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

#: stage two, graphs vs eager and stacked vs alone on CUDA: largest difference of an epoch's
#: validation or test mAP, in points (float rounding only)
TOL_STACKED_MAP = 1e-3
#: the losses of the equality checks: hand-written gradients and autograd, per-example state
#: trained beside the heads (role) and changed once an epoch (ll-cp, em-apl), a schedule (gr)
LOSSES = ("an", "an-ls", "role", "ll-cp", "em-apl", "gr", "asl", "opml")
#: the timing targets on one H100/H200 (seconds): the default search, the whole command,
#: --loss all
TARGETS = {"search": 1.0, "command": 4.0, "all_losses": 20.0}


def _data(check, device: str):
    from featcache.linear.data import load_linear_data

    root = check.cache / "shapes"
    return load_linear_data(root / "labels.h5", root / f"features-{check.sizes.features_tag}.h5",
                            device=device)


def _specs(data, losses: Sequence[str]):
    from featcache.linear.engine.search import SearchSpec
    from featcache.losses import loss_class

    usable = [n for n in losses if loss_class(n).unmet_need(data.facts) is None]
    return [SearchSpec(loss=n, learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=5)
            for n in usable]


def _compare(ours, theirs, what: str) -> float:
    """The largest epoch mAP difference between two lists of search results; CheckFailed
    (from the caller's module) when a selection differs."""
    from benchmarks.gpu_check import CheckFailed

    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        for seed_a, seed_b in zip(a.seeds, b.seeds, strict=True):
            chosen = [(h.config, h.best_epoch) for h in (seed_a.selected, seed_b.selected)]
            if chosen[0] != chosen[1]:
                raise CheckFailed(f"{what}: {a.spec.loss} selected {chosen[0]} and {chosen[1]}")
            for head_a, head_b in zip(seed_a.heads, seed_b.heads, strict=True):
                for ra, rb in zip(head_a.epochs, head_b.epochs, strict=True):
                    for key in ("val_map", "val_map_observed", "test_map"):
                        x, y = getattr(ra, key), getattr(rb, key)
                        if x is not None and y is not None:
                            worst = max(worst, abs(x - y))
    if worst > TOL_STACKED_MAP:
        raise CheckFailed(f"{what}: an epoch's mAP differs by {worst:.5f} points (tolerance "
                          f"{TOL_STACKED_MAP})")
    return worst


def graphs_vs_eager(check) -> tuple[str, dict]:
    from featcache.linear.engine.graphs import GRAPHS_ENV
    from featcache.linear.engine.search import run_searches

    data = _data(check, "cuda")
    specs = _specs(data, LOSSES)
    found = {}
    for mode in ("0", "1"):
        os.environ[GRAPHS_ENV] = mode
        try:
            found[mode] = run_searches(data, specs, "cuda", progress=False)
        finally:
            os.environ.pop(GRAPHS_ENV, None)
    worst = _compare(found["1"], found["0"], "graphs vs eager")
    return (f"{len(specs)} losses: the same selections, epoch mAP within {worst:.5f} points",
            {"losses": [s.loss for s in specs], "largest_difference": worst,
             "tolerance": TOL_STACKED_MAP})


def stacked_vs_alone(check) -> tuple[str, dict]:
    from featcache.linear.engine.search import run_search, run_searches
    from featcache.losses import loss_names

    data = _data(check, "cuda")
    specs = _specs(data, loss_names())
    together = run_searches(data, specs, "cuda", progress=False)
    alone = [run_search(data, spec, "cuda", progress=False) for spec in specs]
    worst = _compare(together, alone, "stacked vs alone")
    return (f"{len(specs)} losses in one pass and alone: the same selections, epoch mAP within "
            f"{worst:.5f} points", {"losses": [s.loss for s in specs],
                                    "largest_difference": worst, "tolerance": TOL_STACKED_MAP})


def cpu_after_cuda(check) -> tuple[str, dict]:
    """Stage two with CPU worker processes in this process, which has trained on CUDA."""
    import torch

    from featcache.linear.engine.search import run_searches
    from featcache.linear.engine.workers import fork_is_safe

    if not torch.cuda.is_initialized():
        run_searches(_data(check, "cuda"), _specs(_data(check, "cuda"), ("an",)), "cuda",
                     progress=False)
    data = _data(check, "cpu")
    results = run_searches(data, _specs(data, ("an", "role")), "cpu", progress=False, jobs=2)
    return (f"trained on the CPU with --jobs 2 after CUDA (workers forked: {fork_is_safe()})",
            {"test_map": [r.selected.best.test_map for r in results]})


def timing_rows(check) -> tuple[str, dict]:
    """``benchmarks.linear`` on CUDA: the default search in the process, the whole command
    (median of 3), and --loss all; beside their targets (a timing never fails the check)."""
    done = check.subprocess([sys.executable, "-m", "benchmarks.linear", "--device", "cuda",
                             "--no-baseline", "--all-losses", "--command-repeat", "3"],
                            timeout=240)
    path = next(line.split("figures written to ", 1)[1].strip()
                for line in done.stdout.splitlines() if line.startswith("figures written to"))
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    figures = {"search": document["speed"]["ours_seconds"],
               "command": document["command"]["versions"]["this checkout"]["median"]["seconds"],
               "all_losses": document["all_losses"]["all_losses_seconds"]}
    met = {k: v <= TARGETS[k] for k, v in figures.items()}
    detail = "; ".join(f"{k} {v:.2f} s (target {TARGETS[k]:g} s: {'met' if met[k] else 'missed'})"
                       for k, v in figures.items())
    return detail, {"seconds": figures, "targets": TARGETS, "met": met, "benchmark": path}
