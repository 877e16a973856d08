"""Curves of runs: a short run (one epoch) must still be readable."""

from __future__ import annotations

import pytest

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


@pytest.mark.slow  # fine-tunes a network
def test_a_one_epoch_fine_tuning_draws_its_linearinit_start(tmp_path, monkeypatch):
    """Issue 36, item 15: `finetune --epochs 1` drew a lone star and dot: the run's outputs
    stopped handing the LinearInit start to the figure (the test above only covered the
    figure)."""
    import json

    from dataset_fixtures import invoke
    from helpers_finetune import NAME, copy_cache

    from featcache.finetune import outputs

    drawn = []

    def spy(curves, selected, path, title="", start=None, start_label="start"):
        drawn.append((curves, start, start_label))
        return real(curves, selected, path, title, start, start_label)

    real = outputs.plot_series
    monkeypatch.setattr(outputs, "plot_series", spy)
    cache = copy_cache(tmp_path.parent, tmp_path / "cache")
    result = invoke("finetune", "--dataset", NAME, "--cache", cache, "--loss", "role", "--epochs",
                    "1", "--lr", "1e-3", "--bsize", "4", "--quiet", "--workers", "0", "--device",
                    "cpu", "--run-id", "one")
    assert result.exit_code == 0, result.output
    run = cache / NAME / "finetune" / "role" / "one"
    init = json.loads((run / "results.json").read_text())["init"]
    [(curves, start, label)] = drawn
    assert start == (init["val_map"], init["test_map"]) and label == "LinearInit start"
    fig = series_figure(curves, (1, 0.0), start=start, start_label=label)
    assert list(fig.axes[0].lines[0].get_xdata()) == [0, 1]  # a segment from the start
    assert (run / "curves.png").stat().st_size > 0
