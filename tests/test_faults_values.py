"""Values that make no sense are refused before any work (issue 45, class 3): an infinite learning
rate, a loss list naming no loss, 10**20 epochs, a 30-digit seed, one --param key given twice,
every environment variable featcache reads set to what it does not take, class names equal
once put in one Unicode form, and (the Python API) label columns named None or by a tuple.
Each command runs for real in its own process (:func:`faults.run_many`) and ends in one line
naming the option or variable; nothing is written."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest
from dataset_fixtures import write_images
from faults import one_error_line, run_many
from linear_fixtures import synthetic_dataset

from featcache.environment import VARIABLES

LINEAR = ["train-linear", "--dataset", "toy", "--epochs", "1", "--bsize", "8", "--quiet",
          "--no-plots", "--device", "cpu", "--run-id", "x"]
#: a value each variable does not take (the paths take any text but NUL, which no
#: environment can hold: they are checked as paths, tests/test_faults_paths.py)
BAD_VALUES = {"FEATCACHE_FSYNC": "maybe", "FEATCACHE_OFFLINE": "perhaps",
              "FEATCACHE_CUDA_GRAPHS": "2", "FEATCACHE_GRAPH_STEPS": "0",
              "FEATCACHE_CUDA_GROUPS": "many", "FEATCACHE_TRACEBACK": "loud",
              "FEATCACHE_PROGRESS": "loud", "FEATCACHE_PROGRESS_INTERVAL": "-5",
              "OMP_NUM_THREADS": "abc", "WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "-1",
              "RANK": "first", "LOCAL_RANK": "1.5"}
PATHS = {"FEATCACHE_CACHE", "FEATCACHE_STATE_DIR", "FEATCACHE_TENSORBOARD"}
CAFE_NFC, CAFE_NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def test_every_variable_featcache_reads_is_checked_by_a_case_here():
    assert {v.name for v in VARIABLES} == set(BAD_VALUES) | PATHS


def test_values_that_make_no_sense_are_refused_before_any_work(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="toy", classes=4, n_train=40, n_test=20)
    write_images(tmp_path / "images", ["a.jpg", "b.jpg", "c.jpg", "t.jpg"])
    (tmp_path / "train.csv").write_text(f"image,{CAFE_NFC},{CAFE_NFD},tea\na.jpg,1,0,0\n"
                                        "b.jpg,0,1,0\nc.jpg,0,0,1\n", encoding="utf-8")
    (tmp_path / "test.csv").write_text(f"image,{CAFE_NFC},{CAFE_NFD},tea\nt.jpg,1,1,1\n",
                                       encoding="utf-8")
    env = {"FEATCACHE_CACHE": str(cache)}
    cases = [  # (the command, what its line says)
        ([*LINEAR, "--loss", "an", "--lr", "inf"],
         "Invalid value for --lr: 'inf' is not a finite number"),
        ([*LINEAR, "--lr", "1e-2", "--loss", ","],
         "Invalid value for --loss: ',' names no loss: give a loss, a comma-separated list or "
         "'all'"),
        ([a for a in LINEAR if a not in ("--epochs", "1")] + ["--epochs", "1" + "0" * 20,
                                                                "--loss", "an"],
         "Invalid value for '--epochs': 100000000000000000000 is not in the range 1<=x<=100000."),
        ([*LINEAR, "--loss", "an", "--seeds", "1" * 30],
         "Invalid value for --seeds: 111111111111111111111... is outside "
         "-9223372036854775808 to 9223372036854775807"),
        ([*LINEAR, "--loss", "an-ls", "--param", "eps_pos=0.1", "--param", "eps_pos=0.2"],
         "--param eps_pos is given twice (eps_pos=0.1, then eps_pos=0.2): give it once, or both "
         "values in one for a grid axis: --param eps_pos=0.1,0.2"),
        (["prepare", "shapes", "--seed", "-1"],
         "Invalid value for '--seed': -1 is not in the range 0<=x<=4294967295."),
        (["pseudo-label", "--dataset", "toy", "--rule", "vlpl", "--threshold", "nan"],
         "Invalid value for '--threshold': 'nan' is not a finite number"),
        (["prepare", "csv", "--train", "train.csv", "--test", "test.csv", "--name", "cafe",
          "--images", "images"],
         f"train.csv, test.csv: class names {CAFE_NFC!r} (U+0063 U+0061 U+0066 U+00E9) and {CAFE_NFD!r} "
         "(U+0063 U+0061 U+0066 U+0065 U+0301) are the same text in two Unicode spellings"),
    ]
    for name, value in BAD_VALUES.items():
        cases.append(((["losses"], {name: value}),
                      f"${name} is {value!r}: it takes "))
    cases.append(((["losses"], {"RANK": "3", "WORLD_SIZE": "2"}),
                  "$RANK is 3 but $WORLD_SIZE is 2: a rank is below the world size"))
    before = sorted(p for p in tmp_path.rglob("*"))
    results = run_many([args for args, _ in cases], tmp_path, env=env, prelude="import torch")
    for result, (_, says) in zip(results, cases, strict=True):
        assert says in one_error_line(result), (result.args, result.stderr)
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, nothing made


class Frame:
    """What the estimator reads of a pandas DataFrame (pandas is not a dependency)."""

    def __init__(self, data, columns):
        self.data, self.columns = np.asarray(data), list(columns)

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def __len__(self):
        return len(self.data)

    @property
    def shape(self):
        return self.data.shape


@pytest.mark.parametrize("columns, message", [
    (["a", None, "c"], r"y's column 1 is None: a class name is a string or a number"),
    ([("a", 1), ("b", 2), ("c", 3)], r"y's column 0 is \('a', 1\): a class name is a string"),
    ([CAFE_NFC, CAFE_NFD, "tea"], re.escape(
        f"y's columns {CAFE_NFC!r} (U+0063 U+0061 U+0066 U+00E9) and {CAFE_NFD!r} (U+0063 "
        "U+0061 U+0066 U+0065 U+0301) are the same text in two Unicode spellings")),
    ([1, "1", "b"], r"y's columns name the class '1' twice \(as text\)"),
])
def test_label_columns_that_name_no_class_are_refused_by_the_api(columns, message):
    from featcache import SPMLClassifier

    rng = np.random.default_rng(0)
    features = rng.standard_normal((30, 4)).astype(np.float32)
    labels = np.zeros((30, 3), np.int8)
    labels[np.arange(30), np.arange(30) % 3] = 1
    with pytest.raises(ValueError, match=message):
        SPMLClassifier(epochs=1).fit(features, Frame(labels, columns))
