"""The catalog of losses and backbones that the listing commands read without importing torch:
the snapshot is up to date, a stale one is never used, and the commands stay off torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.cli import cli
from featcache.errors import OptionError
from featcache.protocol import catalog as catalog_module
from featcache.protocol.catalog import Catalog, build_catalog, source_fingerprint

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "timm", "open_clip", "sklearn", "matplotlib")


def test_every_entry_of_the_snapshot_is_what_the_classes_declare():
    """What the shipped snapshot shows (names, declarations) is what the classes declare; a loss
    or backbone added since is not in it, and is listed from the classes (or the user's cache)
    until ``make catalog`` runs."""
    snapshot = Catalog.from_json(json.loads(catalog_module.SNAPSHOT.read_text()))
    built = build_catalog()
    losses = {info.name: info for info in built.losses}
    backbones = {info.name: info for info in built.backbones}
    stale = [info.name for info in snapshot.losses if losses.get(info.name) != info]
    stale += [info.name for info in snapshot.backbones if backbones.get(info.name) != info]
    assert not stale, (f"featcache/protocol/catalog.json lists {stale} otherwise than the classes "
                       "declare them: run `make catalog` (python -m featcache.protocol.catalog)")
    listed = [name for name in built.loss_names() if name in set(snapshot.loss_names())]
    assert listed == snapshot.loss_names()  # the same order


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    """An empty user cache folder for snapshots built from the classes."""
    folder = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    catalog_module._snapshot_or_build.cache_clear()
    yield folder / "featcache"
    catalog_module._snapshot_or_build.cache_clear()


def test_a_stale_snapshot_is_ignored_and_the_classes_are_read(tmp_path, monkeypatch, user_cache):
    stale = build_catalog().to_json("not the fingerprint")
    stale["losses"] = stale["losses"][:1]  # what an outdated snapshot could hold
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(stale))
    monkeypatch.setattr(catalog_module, "SNAPSHOT", path)
    fresh = catalog_module.catalog()
    from featcache.losses import loss_names

    assert fresh.loss_names() == loss_names()
    # what was built is kept in the user's cache folder, stamped with the sources' fingerprint
    kept = json.loads(catalog_module.user_snapshot(source_fingerprint()).read_text())
    assert Catalog.from_json(kept) == fresh
    catalog_module._snapshot_or_build.cache_clear()
    stale["fingerprint"] = source_fingerprint()  # the same outdated content, stamped as current
    path.write_text(json.dumps(stale))
    assert len(catalog_module.catalog().losses) == 1  # the shipped snapshot is read first


def test_a_snapshot_built_once_serves_the_next_listing_without_torch(tmp_path, monkeypatch,
                                                                     user_cache):
    stale = build_catalog().to_json("not the fingerprint")
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(stale))
    monkeypatch.setattr(catalog_module, "SNAPSHOT", path)
    catalog_module.catalog()  # built from the classes: what a first listing after an edit does
    assert list(user_cache.glob("catalog-*.json"))
    code = (f"import sys\nfrom featcache.protocol import catalog as c\nc.SNAPSHOT = c.Path({str(path)!r})\n"
            "print(len(c.catalog().losses), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == [str(len(stale["losses"])), "False"]


def test_the_fingerprint_follows_declarations_not_comments(tmp_path):
    for source in catalog_module.SOURCES:
        (tmp_path / source).mkdir()
        (tmp_path / source / "a.py").write_text("x = 1\n")
    before = source_fingerprint(tmp_path)
    (tmp_path / "losses" / "a.py").write_text("# a comment\n\nx = 1   \n    # another\n")
    assert source_fingerprint(tmp_path) == before
    (tmp_path / "losses" / "a.py").write_text("x = 2\n")
    edited = source_fingerprint(tmp_path)
    (tmp_path / "backbones" / "new.py").write_text("")
    assert len({before, edited, source_fingerprint(tmp_path)}) == 3


def test_an_unknown_loss_gets_the_registry_s_error():
    from featcache.losses import loss_class

    with pytest.raises(OptionError) as from_registry:
        loss_class("roel")
    with pytest.raises(OptionError) as from_catalog:
        build_catalog().loss("roel")
    assert str(from_catalog.value) == str(from_registry.value)


def test_loss_names_include_a_loss_registered_at_run_time(monkeypatch):
    import featcache.losses.registry as registry
    from featcache.losses import SPMLLoss

    class Extra(SPMLLoss):
        name = "extra-for-test"

    monkeypatch.setitem(registry._REGISTRY, Extra.name, Extra)
    assert catalog_module.loss_names()[-1] == "extra-for-test"


@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "/x/cache"}, {"TORCH_HOME": "~/th"},
                                 {"TORCH_HOME": "/t", "XDG_CACHE_HOME": "/x"}])
def test_torch_hub_dir_is_torch_s_own(env, monkeypatch):
    import torch

    from featcache.backbones.hub import torch_hub_dir

    for key in ("TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert torch_hub_dir() == Path(torch.hub.get_dir())


def test_backbones_says_whether_default_weights_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    resnet = next(info for info in build_catalog().backbones if info.name == "resnet18")
    assert resnet.weights_cached() is False
    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / resnet.weights_file["torch_hub"]).write_bytes(b"weights")
    assert resnet.weights_cached() is True
    result = CliRunner().invoke(cli, ["backbones"])
    assert result.exit_code == 0, result.output
    resnet_lines = result.output.split("resnet18", 1)[1].split("resnet50", 1)[0]
    assert "weights cached" in resnet_lines and "not cached" not in resnet_lines


def _modules_after(args: list[str], cwd: Path, code: int = 0) -> set[str]:
    """The heavy modules a fresh interpreter holds after running ``featcache ARGS`` (which
    exits with ``code``). A listing after the sources changed builds the catalog once (and keeps
    it in the user's cache folder, :func:`featcache.protocol.catalog.catalog`): a first
    ``featcache losses`` runs before, as it would for a user."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(cwd / "xdg")}
    subprocess.run([sys.executable, "-m", "featcache", "losses"], cwd=cwd, env=env,
                   capture_output=True, check=True)
    code = ("import sys\nfrom featcache.cli import cli\n"
            "try:\n    cli.main(sys.argv[1:], prog_name='featcache')\nexcept SystemExit as e:\n"
            f"    assert (e.code or 0) == {code}, e.code\n"
            f"print('MODULES', ' '.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, env=env, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES"))
    return set(line.split()[1:])


def test_listing_commands_do_not_import_torch(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, "toy")
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "1", "--lr",
                    "1e-2", "--bsize", "16", "--quiet", "--no-plots", "--device", "cpu",
                    "--run-id", "r", "--cache", cache)
    assert result.exit_code == 0, result.output
    for args in (["losses"], ["losses", "an", "role"], ["losses", "--markdown"],
                 ["backbones", "--all"], ["--help"], ["info", str(cache / "toy")],
                 ["table", str(cache / "toy" / "runs")]):
        assert _modules_after(args, tmp_path) == set(), args


def test_a_wrong_dataset_name_is_said_before_torch_is_imported(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, "toy")
    args = ["train-linear", "--dataset", "tyo", "--loss", "an", "--cache", str(cache)]
    assert _modules_after(args, tmp_path, code=1) == set()
    result = invoke(*args)
    assert result.exit_code == 1 and "no dataset 'tyo'" in result.output
    assert "did you mean 'toy'?" in result.output
