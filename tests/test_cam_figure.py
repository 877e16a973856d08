"""The CAM figure: maps scaled by their class probability, a colour bar, perceptual colours."""

from __future__ import annotations

import numpy as np

from featcache.api.cam import ClassMap, RunMaps, maps_figure


def _row(probabilities):
    ramp = np.linspace(-3.0, 5.0, 48 * 64, dtype=np.float32).reshape(48, 64)
    image = np.full((48, 64, 3), 128, dtype=np.uint8)
    maps = [ClassMap(f"class{i}", p, float(np.log(p / (1 - p))) if 0 < p < 1 else 0.0, ramp)
            for i, p in enumerate(probabilities)]
    return RunMaps("an, linear", image, {m.name: m.probability for m in maps}, maps)


def test_each_map_is_scaled_by_its_probability_with_a_colour_bar_and_titles():
    fig = maps_figure([_row([0.9, 0.0])], title="img.jpg")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["input", "class0  p = 0.90", "class1  p = 0.00"]
    shown = [ax.images[-1] for ax in panels[1:]]
    assert shown[0].get_cmap().name == "magma"
    assert np.asarray(shown[0].get_array()).max() == np.float32(0.9)
    assert np.asarray(shown[1].get_array()).max() == 0.0  # p = 0: no spot at all
    colorbars = [ax for ax in fig.axes if ax not in panels and ax.get_ylabel()]
    assert len(colorbars) == 1 and "probability" in colorbars[0].get_ylabel()


def test_the_figure_is_saved(tmp_path):
    from featcache.api.cam import draw_maps

    out = draw_maps([_row([0.7, 0.2]), _row([0.4, 0.1])], tmp_path / "cam.png", title="x")
    assert out.is_file() and out.stat().st_size > 0
