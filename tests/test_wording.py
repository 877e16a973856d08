"""Messages count in good English: one helper (featcache.errors.plural) for every count."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from featcache.errors import InputError, plural

PACKAGE = Path(__file__).resolve().parents[1] / "featcache"
NOUNS = ("rows|fields|entries|losses|datasets|files|images|classes|columns|values|names|labels|"
         "keys|seeds|epochs|GPUs|ranks|heads|runs|cells|blocks|tiles|configurations|examples|"
         "positives|weights|steps|workers|splits|tokens|batches")
#: a count written straight before a plural noun, e.g. f"{len(rows)} rows", also with one
#: word between (f"{n} training rows": "cannot split 1 training rows"), but not a verb or
#: preposition ("{name} holds values", "{n} of images")
COUNTED = re.compile(r"\{(len\([^{}]*\)|[\w.]+\.size|[\w.]+|\w+\[[^{}]*\]|[\w.]+\.shape\[\d\])\} "
                     r"(?:\{[^{}]*\} |(?!(?:of|with|has|holds|indexes|names)\b)[a-z-]+ )?"
                     rf"({NOUNS})\b")
#: f-strings where the braces hold no count (a name or a size in pixels)
NOT_COUNTS = ("{dataset} seeds", "{run_size}x{run_size} images", "{kind} files",
              "{backbone['image_size']}x{backbone['image_size']} images", "{grid}x{grid} tiles",
              "{rows} x {width} rows", "{spec.model} weights", "{source.name} weights",
              "{where} names", "{official} labels", "{split} images", "{split.name} batches",
              "{weights} weights", "{len(self.alpha)} alpha values", "f'{name} row", "f'{split.name} image",
              "{dataset.name} rows")


def test_plural():
    assert plural(1, "row") == "1 row" and plural(0, "row") == "0 rows"
    assert plural(2, "entry is", "entries are") == "2 entries are"
    assert plural(1, "entry is", "entries are") == "1 entry is"


def test_no_message_writes_a_count_before_a_plural_noun_by_hand():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for match in COUNTED.finditer(line):
                if not any(allowed in line for allowed in NOT_COUNTS):
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {match.group(0)}")
    assert not found, "use featcache.errors.plural:\n" + "\n".join(found)


def test_did_you_mean_ends_the_sentence_once(cache_dir):
    from featcache.paths import existing_labels

    (cache_dir / "scene").mkdir()
    (cache_dir / "scene" / "labels.h5").write_bytes(b"")
    with pytest.raises(InputError) as caught:
        existing_labels("scen")
    message = str(caught.value)
    assert "did you mean 'scene'?" in message and "?." not in message


def test_one_bad_entry_and_one_broken_row_are_singular(tmp_path):
    from featcache.data.formats.npz import _check_labels, check_feature_matrix

    with pytest.raises(InputError, match=r"\(1 entry is not\)"):
        _check_labels(tmp_path / "x.npz", "train", np.array([[0, 2], [1, 0]]), 2, 2)
    x = np.ones((3, 2), dtype=np.float32)
    x[0, 1] = np.nan
    with pytest.raises(InputError, match=r"in 1 row \(row 0\)"):
        check_feature_matrix(tmp_path / "x.npz", "X_train", x)


def test_one_training_row_is_singular():
    """Issue 36, item 15: "cannot split 1 training rows"."""
    from featcache.data.sampling import split_train_val

    with pytest.raises(InputError, match="^cannot split 1 training row into train and validation"):
        split_train_val(1)
