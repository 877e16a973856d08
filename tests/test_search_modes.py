"""Search modes as registered objects: the registry (found by discovery), what a finished run's
settings say about its mode, and each mode's stage-two hooks."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from featcache.discovery import import_modules_of
from featcache.errors import InputError, OptionError
from featcache.protocol.search_modes import (
    check_search,
    default_search_mode,
    recorded_search_mode,
    search_mode,
    search_mode_names,
    search_modes,
)


def test_the_registry_lists_the_default_mode_first_and_refuses_unknown_names():
    assert search_mode_names() == ["protocol", "probe"]
    assert default_search_mode() is search_mode("protocol") is search_mode(None)
    with pytest.raises(OptionError, match=r"--search 'probes': choose one of protocol, probe"):
        search_mode("probes")


def test_weight_decays_belong_to_the_modes_that_search_them():
    assert check_search("probe", [0.0, 0.5]) is search_mode("probe")
    with pytest.raises(OptionError, match=r"--weight-decay belongs to --search probe \(the "
                                          r"protocol's search trains Adam without weight decay\)"):
        check_search("protocol", [0.1])
    with pytest.raises(OptionError, match="finite values >= 0"):
        check_search("probe", [float("nan")])


def test_a_run_says_its_mode_through_its_settings():
    protocol = recorded_search_mode({"settings": {"loss": "an"}})
    probe = recorded_search_mode({"settings": {"loss": "an", "search": "probe"}})
    assert (protocol.name, probe.name) == ("protocol", "probe")
    assert protocol.linear_init and not probe.linear_init
    assert "--search probe run" in probe.linear_init_refusal("linear run R")
    assert "--search protocol" in probe.linear_init_refusal("linear run R")
    assert protocol.estimator_refusal("R") is None and "SPMLClassifier" in probe.estimator_refusal("R")
    rows = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    assert protocol.head_rows(rows) is rows
    np.testing.assert_allclose(probe.head_rows(rows), [[0.6, 0.8], [0.0, 0.0]])
    with pytest.raises(InputError, match="--search 'sgd', which this featcache does not know"):
        recorded_search_mode({"settings": {"search": "sgd"}}, "run R")


def test_every_mode_has_its_stage_two_hooks():
    from featcache.linear.engine.search import SearchSpec
    from featcache.linear.search_modes import linear_search_mode

    for mode in search_modes():
        assert linear_search_mode(mode).mode is mode
    # the default mode's spec records no mode (its runs keep their fingerprints)
    spec = SearchSpec("an-ls")
    assert linear_search_mode(default_search_mode()).spec(spec, None) is spec
    probe = linear_search_mode(search_mode("probe")).spec(spec, [0.0])
    assert probe.settings()["search"] == "probe" and probe.weight_decays == [0.0]


def test_discovery_imports_every_module_of_a_package(tmp_path, monkeypatch):
    package = tmp_path / "found_here"
    package.mkdir()
    (package / "__init__.py").write_text("SEEN = []\n")
    for name in ("b_mode", "a_mode"):
        (package / f"{name}.py").write_text(f"from found_here import SEEN\nSEEN.append({name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import_modules_of("found_here")
        assert sys.modules["found_here"].SEEN == ["a_mode", "b_mode"]
    finally:
        for name in ("found_here", "found_here.a_mode", "found_here.b_mode"):
            sys.modules.pop(name, None)
