"""Issue 36, item 12: class names are one line of text, and a terminal that cannot show them
is one clear line."""

from __future__ import annotations

import numpy as np
import pytest
from dataset_fixtures import invoke
from faults import run

from featcache.data.classnames import check_class_names
from featcache.errors import FeatcacheWarning, InputError
from featcache.tables import Table


def feature_set(path, names):
    rng = np.random.RandomState(0)

    def labels(n):
        y = (rng.rand(n, len(names)) < 0.4).astype(np.uint8)
        y[np.arange(n), rng.randint(0, len(names), n)] = 1
        return y

    np.savez(path, X_train=rng.rand(40, 4).astype(np.float32),
             X_test=rng.rand(20, 4).astype(np.float32), Y_train=labels(40), Y_test=labels(20),
             label_names=np.array(names))
    return path


def test_a_newline_in_a_class_name_is_refused(tmp_path, cache_dir):
    npz = feature_set(tmp_path / "n.npz", ["a\nb", "c", "d"])
    result = invoke("prepare", "features", "--npz", npz, "--name", "n")
    assert result.exit_code == 1
    assert result.output == (f"Error: {npz}: class 1 ('a\\nb') holds the control character "
                             "'\\n': a class name is one line of text; rename it\n")
    assert not (cache_dir / "n").exists()


@pytest.mark.parametrize("names, message", [
    (["a", " "], "class 2 has an empty name"),
    (["a", "b\tc"], "class 2 ('b\\tc') holds the control character '\\t'"),
])
def test_empty_names_and_controls_are_refused(names, message):
    with pytest.raises(InputError) as caught:
        check_class_names(names, "x")
    assert str(caught.value).startswith(f"x: {message}")


def test_names_alike_but_for_case_or_spaces_are_warned():
    with pytest.warns(FeatcacheWarning, match=r"x: 2 sets of class names differ only in case or "
                      r"spaces \('cat' and 'Cat'; 'big dog' and 'big  dog'\)"):
        check_class_names(["cat", "Cat", "big dog", "big  dog", "ant"], "x")


def test_a_markdown_row_stays_one_line():
    table = Table(["class", "an"])
    table.add("a\nb|c", 1.0)
    lines = table.markdown().splitlines()
    assert len(lines) == 3 and lines[2].startswith("| a b\\|c |")


def test_a_terminal_that_cannot_show_a_class_name_is_one_line(tmp_path, cache_dir):
    npz = feature_set(tmp_path / "u.npz", ["猫", "café", "dog"])
    assert invoke("prepare", "features", "--npz", npz, "--name", "u").exit_code == 0
    trained = invoke("train-linear", "--dataset", "u", "--loss", "an", "--epochs", "1", "--lr",
                     "1e-2", "--bsize", "16", "--quiet", "--no-plots", "--device", "cpu",
                     "--run-id", "r")
    assert trained.exit_code == 0, trained.output
    args = ["table", str(cache_dir / "u" / "runs" / "an" / "r"), "--per-class"]
    latin = run(args, cwd=tmp_path, env={"PYTHONIOENCODING": "latin-1"})
    assert latin.returncode == 1 and latin.stdout == ""
    assert latin.stderr == ("Error: the output encoding latin-1 (PYTHONIOENCODING or the locale) "
                            "cannot write '\\u732b', part of what this command prints: run it "
                            "again with PYTHONIOENCODING=utf-8 (or a UTF-8 locale, e.g. "
                            "LC_ALL=C.UTF-8)\n")
    advised = run(args, cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8"})
    assert advised.returncode == 0 and "| 猫 " in advised.stdout and "| café " in advised.stdout
