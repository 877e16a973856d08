"""Finished files are flushed to the disk before they take their name, unless
``FEATCACHE_FSYNC=0`` says the disk is scratch (the test suite runs so: see conftest.py)."""

from __future__ import annotations

import pytest

from featcache import fileio
from featcache.fileio import atomic_output, write_bytes_atomic


@pytest.fixture
def flushed(monkeypatch) -> list[int]:
    """The descriptors ``os.fsync`` is called on (it still runs)."""
    calls: list[int] = []
    real = fileio.os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(fileio.os, "fsync", counted)
    return calls


def test_by_default_the_file_and_its_folder_are_flushed(tmp_path, monkeypatch, flushed):
    monkeypatch.delenv("FEATCACHE_FSYNC", raising=False)
    assert fileio.fsync_wanted()
    with atomic_output(tmp_path / "out.bin") as tmp:
        tmp.write_bytes(b"data")
    assert len(flushed) == 2, "the complete temporary file, then the folder holding the rename"
    write_bytes_atomic(tmp_path / "other.bin", b"more")
    assert len(flushed) == 4


@pytest.mark.parametrize("value", ["0", "false", "no", " NO "])
def test_fsync_0_skips_the_flush_and_the_write_stays_atomic(tmp_path, monkeypatch, flushed,
                                                            value):
    monkeypatch.setenv("FEATCACHE_FSYNC", value)
    assert not fileio.fsync_wanted()
    with atomic_output(tmp_path / "out.bin") as tmp:
        tmp.write_bytes(b"data")
        assert not (tmp_path / "out.bin").exists(), "no final name before the file is complete"
    with pytest.raises(RuntimeError), atomic_output(tmp_path / "failed.bin") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer fails")
    assert flushed == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    assert (tmp_path / "out.bin").read_bytes() == b"data"


@pytest.mark.parametrize("value", ["1", "yes", ""])
def test_any_other_value_flushes(monkeypatch, value):
    monkeypatch.setenv("FEATCACHE_FSYNC", value)
    assert fileio.fsync_wanted()
