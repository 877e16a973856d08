"""Shared fixtures and the ``shared_data`` marker.

Tests marked ``shared_data`` read the real data in ``../shared/data`` (or
``$FEATCACHE_SHARED_DATA``); they are skipped, with the reason, where it is absent.

No test reaches the Hugging Face hub: ``HF_HUB_OFFLINE`` is set before anything imports
``huggingface_hub`` (which reads it once), so a missing cached file fails at once.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
# The CPU-fallback notice (said once per machine) is taken as said: no command's output
# depends on which test ran first (tests/test_runtime.py checks the notice itself).
os.environ["FEATCACHE_STATE_DIR"] = tempfile.mkdtemp(prefix="featcache-state-")
# Under pytest-xdist (`make test` runs one worker per core) each worker computes on one thread,
# so the workers share the cores instead of oversubscribing them; the tests that are about
# thread counts set theirs explicitly.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tests' outputs live in temporary folders: they test what a crash, kill or full disk
# leaves, never a power cut, so finished files are not flushed to the disk (the fine-tuning
# tests write many checkpoints of a ResNet-50, 282 MB each).
# tests/test_fileio_durability.py checks the default, which flushes.
os.environ.setdefault("FEATCACHE_FSYNC", "0")

import pytest  # noqa: E402

from featcache.notices import cpu_fallback_marker  # noqa: E402

cpu_fallback_marker().touch()

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FEATCACHE_SHARED_DATA", REPO.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items):
    if SHARED_DATA.is_dir():
        return
    skip = pytest.mark.skip(
        reason=f"real data not found at {SHARED_DATA} (set FEATCACHE_SHARED_DATA to its path)"
    )
    for item in items:
        if "shared_data" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real multi-label data (``../shared/data``)."""
    return SHARED_DATA


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh cache root, also exported as $FEATCACHE_CACHE for CLI calls."""
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("FEATCACHE_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def random_resnet50():
    """One seeded random ResNet-50 per test module (building it takes a second)."""
    from featcache.backbones.registry import create_backbone

    return create_backbone("resnet50", "random")


@pytest.fixture
def reuse_model(monkeypatch, random_resnet50):
    """Stage one gets a copy of ``random_resnet50`` whenever it builds that model (the stage-one
    test modules use it for every test: ``pytestmark = pytest.mark.usefixtures(...)``)."""
    import copy

    from featcache.features import extraction as extraction_module

    real = extraction_module.create_backbone

    def cached(name, weights, seed=0, image_size=None):
        if name == "resnet50" and getattr(weights, "kind", None) == "random" and seed == 0:
            return copy.deepcopy(random_resnet50)
        return real(name, weights, seed=seed, image_size=image_size)

    monkeypatch.setattr(extraction_module, "create_backbone", cached)
