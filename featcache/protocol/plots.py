"""Validation and test mAP curves per epoch, one line per configuration (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from featcache.fileio import atomic_output

#: one curve: (label, epochs (1-based), validation mAP per epoch, test mAP per epoch)
Curve = tuple[str, Sequence[int], Sequence[float], Sequence[float]]


def plot_series(curves: Sequence[Curve], selected: tuple[int, float], path: Path,
                title: str = "") -> Path:
    """Save validation (solid) and test (dotted) curves with a star at the selected epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, epochs, val, test in curves:
        (line,) = ax.plot(epochs, val, label=label)
        ax.plot(epochs, test, linestyle=":", color=line.get_color())
    ax.scatter([selected[0]], [selected[1]], marker="*", s=160, color="black",
               zorder=5, label="selected")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mAP (%) - val solid, test dotted")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic_output(path, overwrite=True) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


#: one panel of a sweep: (title, {parameter value: test mAPs}, reference (mean, std) or None)
SweepPanel = tuple[str, dict[float, Sequence[float]], tuple[float, float] | None]


def plot_sweep(panels: Sequence[SweepPanel], param: str, path: Path, title: str = "") -> Path:
    """Save test mAP against a parameter, one panel per dataset: mean +- std per value (error
    bars, the single runs as dots) and the reference runs' mean +- std as a shaded band."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 3.2 * len(panels)), dpi=110,
                             squeeze=False)
    for ax, (name, points, band) in zip(axes[:, 0], panels, strict=True):
        values = sorted(points)
        means = [statistics.fmean(points[v]) for v in values]
        stds = [statistics.stdev(points[v]) if len(points[v]) > 1 else 0.0 for v in values]
        if band is not None:
            ax.axhspan(band[0] - band[1], band[0] + band[1], color="tab:gray", alpha=0.25,
                       label=f"reference {band[0]:.2f} +- {band[1]:.2f}")
            ax.axhline(band[0], color="tab:gray", linewidth=1)
        ax.errorbar(values, means, yerr=stds, marker="o", capsize=3, label="mean +- std")
        for value in values:
            ax.scatter([value] * len(points[value]), points[value], s=8, color="black", alpha=0.4)
        ax.set_xlabel(param)
        ax.set_ylabel("test mAP (%)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_output(path, overwrite=True) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
