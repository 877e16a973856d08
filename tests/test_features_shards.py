"""The chunk store behind resuming: atomic shards, manifests, damage, and the run lock."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from featcache.errors import LockedError
from featcache.features.shards import ChunkStore, parts_dir


def make_store(tmp_path, **identity) -> ChunkStore:
    final = tmp_path / "ds" / "features-x.h5"
    final.parent.mkdir(exist_ok=True)
    return ChunkStore(final, {"labels_sha256": "abc", **identity}, num_rows=10, chunk_rows=4, dim=3)


def test_layout_and_round_trip(tmp_path):
    store = make_store(tmp_path)
    store.open(print)
    assert store.dir == tmp_path / "ds" / ".features-x.parts" == parts_dir(store.final)
    assert store.num_chunks == 3 and store.rows(2) == range(8, 10)
    features = np.arange(6, dtype=np.float32).reshape(2, 3)
    features[1] = np.nan
    store.write(2, features, np.array([False, True]), {9: "file is empty (0 bytes)"})
    shard = store.read(2, "float32")
    assert shard.start == 8 and shard.bad.tolist() == [False, True]
    assert np.array_equal(shard.features, features, equal_nan=True)
    assert shard.reasons == {9: "file is empty (0 bytes)"}
    assert store.missing(range(3), "float32", accept_bad=True) == [0, 1]
    assert store.missing(range(3), "float32", accept_bad=False) == [0, 1, 2]  # recompute to name it
    assert not list(store.dir.glob(".*tmp*"))
    store.remove()
    assert not store.dir.exists()


def test_damaged_or_foreign_shards_are_dropped(tmp_path):
    store = make_store(tmp_path)
    store.open(print)
    store.write(0, np.ones((4, 3), np.float32), np.zeros(4, bool), {})
    assert store.read(0, "float16") is None  # wrong dtype for this run: recompute
    store.write(0, np.ones((4, 3), np.float32), np.zeros(4, bool), {})
    store.path(0).write_bytes(store.path(0).read_bytes()[:100])
    assert store.read(0, "float32") is None and not store.path(0).exists()
    store.write(1, np.full((4, 3), np.nan, np.float32), np.zeros(4, bool), {})
    assert store.read(1, "float32") is None  # NaN in a row not flagged bad
    store.close()


def test_other_settings_start_fresh_and_say_why(tmp_path):
    old = make_store(tmp_path, precision="bf16")
    old.open(print)
    old.write(0, np.ones((4, 3), np.float32), np.zeros(4, bool), {})
    old.close()
    messages = []
    new = make_store(tmp_path, precision="fp32")
    new.open(messages.append)
    assert "precision: bf16 -> fp32" in messages[0] and "starting fresh" in messages[0]
    assert not list(new.dir.glob("chunk-*"))
    same = make_store(tmp_path, precision="fp32")
    new.close()
    same.open(messages.append)
    assert len(messages) == 1
    same.close()


def test_a_second_run_on_the_same_file_is_refused(tmp_path):
    store = make_store(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from featcache.features.shards import ChunkStore
        store = ChunkStore(Path({str(store.final)!r}), {{"labels_sha256": "abc"}}, 10, 4, 3)
        store.open(print)
        print("locked", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError, match=f"being written by another featcache process "
                                              f"\\(pid {holder.pid} on "):
            store.open(print)
    finally:
        holder.kill()
        holder.wait()
    store.open(print)  # the lock dies with its process
    store.close()
