"""Validation and test mAP curves per epoch, one line per configuration (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from featcache.fileio import atomic_output
from featcache.protocol import plot_process

#: one curve: (label, epochs (1-based), validation mAP per epoch, test mAP per epoch)
Curve = tuple[str, Sequence[int], Sequence[float], Sequence[float]]


def series_figure(curves: Sequence[Curve], selected: tuple[int, float], title: str = "",
                  start: tuple[float | None, float | None] | None = None,
                  start_label: str = "start"):
    """The figure of :func:`plot_series`: validation (solid) and test (dotted) curves, a marker
    at every epoch, a star at the selected epoch; ``start`` (validation, test mAP before the
    first epoch, e.g. LinearInit's linear head) is epoch 0 of every curve, drawn as a diamond."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    start_val, start_test = start if start is not None else (None, None)
    values = []
    for label, epochs, val, test in curves:
        val_x, val_y = _from_start(epochs, val, start_val)
        test_x, test_y = _from_start(epochs, test, start_test)
        (line,) = ax.plot(val_x, val_y, marker="o", markersize=4, label=label)
        ax.plot(test_x, test_y, linestyle=":", marker=".", color=line.get_color())
        values += [v for v in (*val_y, *test_y) if v is not None]
    ax.scatter([selected[0]], [selected[1]], marker="*", s=160, color="black",
               zorder=5, label="selected")
    if start is not None and any(v is not None for v in start):
        ax.scatter([0] * sum(v is not None for v in start), [v for v in start if v is not None],
                   marker="D", s=40, color="gray", zorder=4, label=f"{start_label} (epoch 0)")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    first = 0 if start is not None else 1
    last = max([first + 1, *(max(c[1], default=first) for c in curves)])
    ax.set_xlim(first - 0.3, last + 0.3)
    if values:  # at least a 5-point window: a short, flat run is not blown up to noise
        low, high = min(values), max(values)
        middle, half = (low + high) / 2, max((high - low) / 2 * 1.15, 2.5)
        bottom = min(max(0.0, middle - half), max(0.0, 100.0 - 2 * half))  # within [0, 100]
        ax.set_ylim(bottom, bottom + 2 * half)
    ax.set_ylabel("mAP (%) - val solid, test dotted")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def _from_start(epochs: Sequence[int], values: Sequence[float],
                start: float | None) -> tuple[list[int], list[float]]:
    if start is None:
        return list(epochs), list(values)
    return [0, *epochs], [start, *values]


def plot_series(curves: Sequence[Curve], selected: tuple[int, float], path: Path,
                title: str = "", start: tuple[float | None, float | None] | None = None,
                start_label: str = "start") -> Path:
    """Save :func:`series_figure` as a PNG (atomically), in the drawing process where one
    runs (:mod:`featcache.protocol.plot_process`; there this same call draws in place)."""
    return start_series(curves, selected, path, title, start, start_label)()


def start_series(curves: Sequence[Curve], selected: tuple[int, float], path: Path,
                 title: str = "", start: tuple[float | None, float | None] | None = None,
                 start_label: str = "start") -> Callable[[], Path]:
    """:func:`plot_series` begun in the drawing process where one runs, so the caller goes on
    meanwhile: the function returned waits for the PNG (draws it here where no drawing process
    took it, or where it is gone) and returns its path."""
    drawing = plot_process.send(plot_series, curves, selected, path, title, start, start_label)

    def finish() -> Path:
        if drawing is not None and drawing.wait():
            return path
        import matplotlib.pyplot as plt

        fig = series_figure(curves, selected, title, start, start_label)
        with atomic_output(path, overwrite=True) as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
        return path

    return finish


#: one panel of a sweep: (title, {parameter value: test mAPs}, reference (mean, std) or None)
SweepPanel = tuple[str, Mapping[float, Sequence[float]], tuple[float, float] | None]


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
