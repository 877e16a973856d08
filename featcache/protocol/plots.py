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
