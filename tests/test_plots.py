"""Curves of runs: a short run (one epoch) must still be readable."""

from __future__ import annotations

from featcache.protocol.plots import series_figure


def test_a_one_epoch_run_plots_its_start_at_epoch_0_with_markers():
    curves = [("lr=0.0001 bs=16", [1], [71.5], [70.2])]
    fig = series_figure(curves, (1, 71.5), title="shapes / role: fine-tuned", start=(64.0, 63.1),
                        start_label="LinearInit start")
    ax = fig.axes[0]
    val, test = ax.lines[:2]
    assert list(val.get_xdata()) == [0, 1] and list(val.get_ydata()) == [64.0, 71.5]
    assert list(test.get_xdata()) == [0, 1] and list(test.get_ydata()) == [63.1, 70.2]
    assert val.get_marker() not in (None, "None", "") and test.get_marker() not in (None, "None", "")
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "LinearInit start (epoch 0)"
    low, high = ax.get_xlim()
    assert low < 0 and high > 1 and [t for t in ax.get_xticks() if low <= t <= high] == [0, 1]
    low, high = ax.get_ylim()
    assert high - low >= 5  # never an axis from 0.96 to 1.04


def test_without_a_start_the_curves_begin_at_epoch_1():
    fig = series_figure([("lr=0.01 bs=8", [1, 2], [50.0, 52.0], [49.0, 51.0])], (2, 52.0))
    assert list(fig.axes[0].lines[0].get_xdata()) == [1, 2]
