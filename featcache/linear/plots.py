"""Validation mAP curves of a search, one line per configuration (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

from featcache.linear.engine.search import SearchResult
from featcache.protocol.plots import plot_series


def plot_curves(result: SearchResult, path: Path, title: str = "") -> Path:
    """Save validation (solid) and test (dotted) mAP per epoch of every configuration of seed 0."""
    curves = []
    for head in result.seeds[0].heads:
        label = f"lr={head.config.lr:g} bs={head.config.batch_size}"
        varied = [k for k, values in result.spec.resolved_params.values.items() if len(values) > 1]
        if varied:
            label += " " + " ".join(f"{k}={head.config.param_dict[k]:g}" for k in varied)
        curves.append((label, [r.epoch + 1 for r in head.epochs],
                       [r.val_map if r.val_map is not None else r.val_map_observed for r in head.epochs],
                       [r.test_map for r in head.epochs]))
    best = result.selected
    return plot_series(curves, (best.best_epoch + 1, best.best_val), path, title)
