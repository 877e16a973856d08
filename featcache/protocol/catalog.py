"""What ``featcache losses``, ``featcache backbones`` and ``featcache table`` read about the
losses and backbones, without importing torch.

The losses declare their metadata (reference, parameters, per-dataset defaults, needs) on
classes that live beside their torch code, and the backbones are specs built next to
torchvision, timm and open_clip: importing them costs seconds (torch alone about 2 s on 2
cores, timm and open_clip more), only to print a list. A snapshot of that metadata, stamped
with a fingerprint of the sources it came from (every file under ``featcache/losses`` and
``featcache/backbones``, Python files without their comment lines and blank lines), answers
instead. :func:`catalog` reads ``catalog.json`` beside this module when its fingerprint matches
the sources installed; otherwise (a new or edited loss, a new backbone) the snapshot built from
the classes the last time these sources were seen, kept in the user's cache folder
(``$XDG_CACHE_HOME/featcache``, else ``~/.cache/featcache``); otherwise it builds the data from
the classes (as slowly as importing them) and keeps it there for the next call. A listing is
never stale, and a new loss module needs no other file. :func:`loss_names` reads the registry
itself when the losses are already imported (a loss registered at run time included).

``python -m featcache.protocol.catalog`` (``make catalog``) rewrites the shipped snapshot (a
fresh clone then lists without importing torch even once); a test checks that every entry it
holds is what the classes declare.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from featcache.errors import OptionError, unknown_name
from featcache.fileio import write_text_atomic

SNAPSHOT = Path(__file__).with_name("catalog.json")
PACKAGE = Path(__file__).resolve().parents[1]
#: the sources the metadata comes from, relative to the featcache package
SOURCES = ("losses", "backbones")


@dataclass(frozen=True)
class ParamInfo:
    """One loss parameter as listed: default (None: the data supplies it), range, meaning."""

    default: float | None
    range: str
    help: str


@dataclass(frozen=True)
class LossInfo:
    """One registered loss as ``featcache losses`` shows it (the class attributes of the same
    names; ``doc`` is the first paragraph of its docstring, ``needs`` the needs' descriptions)."""

    name: str
    reference: str
    year: int | None
    paper: str
    summary: str
    doc: str
    params: dict[str, ParamInfo]
    dataset_defaults: dict[str, dict[str, float | None]]
    needs: list[str]
    handoff_state: list[str]

    @classmethod
    def from_dict(cls, data: dict) -> LossInfo:
        params = {key: ParamInfo(**value) for key, value in data["params"].items()}
        return cls(**{**data, "params": params})


@dataclass(frozen=True)
class BackboneInfo:
    """One registered backbone as ``featcache backbones`` shows it (the spec's fields of the
    same names; ``preprocess`` holds the Preprocess fields). ``weights_file`` locates the
    default weights in their cache: ``{"torch_hub": file name}``, ``{"hub_repo": repo,
    "hub_files": [...]}``, or empty (random weights, or the library was missing when the
    snapshot was made)."""

    name: str
    library: str
    model: str
    default_weights: str
    dim: int
    default_image_size: int
    preprocess: dict
    pooling: str
    has_text: bool
    summary: str
    testing: bool
    weights_file: dict = field(default_factory=dict)

    def library_installed(self) -> bool:
        """Whether the backbone's library can be imported here (looked up, not imported)."""
        from featcache.backbones.hub import library_installed

        return library_installed(self.library)

    def weights_cached(self) -> bool | None:
        """Whether the default weights are in their cache (never downloaded); None when that is
        unknown (random weights, or no location recorded)."""
        if "torch_hub" in self.weights_file:
            from featcache.backbones.hub import torch_hub_dir

            return (torch_hub_dir() / "checkpoints" / self.weights_file["torch_hub"]).is_file()
        if "hub_repo" in self.weights_file:
            from featcache.backbones.hub import cached_file

            return cached_file(self.weights_file["hub_repo"],
                               tuple(self.weights_file["hub_files"])) is not None
        return None


@dataclass(frozen=True)
class Catalog:
    """Every loss (in registration order: the order of ``--loss all``) and every backbone."""

    losses: list[LossInfo]
    backbones: list[BackboneInfo]

    def loss_names(self) -> list[str]:
        return [info.name for info in self.losses]

    def loss(self, name: str) -> LossInfo:
        """The loss ``name``; the same error as ``featcache.losses.loss_class`` otherwise."""
        for info in self.losses:
            if info.name == name:
                return info
        raise OptionError(unknown_name("loss", name, self.loss_names(), plural="losses",
                                       listing="`featcache losses` describes each"))

    def backbone_list(self, testing: bool = True) -> list[BackboneInfo]:
        """The backbones sorted by name (without the tiny test networks unless ``testing``)."""
        return sorted((info for info in self.backbones if testing or not info.testing),
                      key=lambda info: info.name)

    def to_json(self, fingerprint: str) -> dict:
        return {"fingerprint": fingerprint, "losses": [asdict(info) for info in self.losses],
                "backbones": [asdict(info) for info in self.backbones]}

    @classmethod
    def from_json(cls, data: dict) -> Catalog:
        return cls([LossInfo.from_dict(item) for item in data["losses"]],
                   [BackboneInfo(**item) for item in data["backbones"]])


def source_fingerprint(package: Path = PACKAGE) -> str:
    """sha256 over the path and content of every file the metadata comes from; a Python file's
    comment lines, blank lines and trailing spaces do not count."""
    digest = hashlib.sha256()
    for source in SOURCES:
        root = package / source
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(package)).encode() + b"\0")
            digest.update(_declared_content(path) + b"\0")
    return digest.hexdigest()


def _declared_content(path: Path) -> bytes:
    """A source file's bytes, for a Python file without comment lines, blank lines and
    trailing spaces."""
    data = path.read_bytes()
    if path.suffix != ".py":
        return data
    lines = (line.rstrip() for line in data.split(b"\n"))
    return b"\n".join(line for line in lines if line and not line.lstrip().startswith(b"#"))


def user_cache_dir() -> Path:
    """Where snapshots built from the classes are kept: ``$XDG_CACHE_HOME/featcache``, else
    ``~/.cache/featcache``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root).expanduser() / "featcache"


def user_snapshot(fingerprint: str) -> Path:
    return user_cache_dir() / f"catalog-{fingerprint[:32]}.json"


#: snapshots kept in the user's cache folder (other checkouts and versions may share it)
KEPT_SNAPSHOTS = 8


def catalog() -> Catalog:
    """The losses and backbones: a snapshot matching the sources (shipped, or kept in the
    user's cache folder), else built from the classes (imported now) and kept there."""
    return _snapshot_or_build()


@functools.lru_cache(maxsize=1)
def _snapshot_or_build() -> Catalog:
    fingerprint = source_fingerprint()
    for path in (SNAPSHOT, user_snapshot(fingerprint)):
        data = _read_json(path)
        if data.get("fingerprint") == fingerprint:
            return Catalog.from_json(data)
    built = build_catalog()
    _keep_in_user_cache(built, fingerprint)
    return built


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _keep_in_user_cache(built: Catalog, fingerprint: str) -> None:
    """Write ``built`` to the user's cache folder (best effort: a read-only home only costs
    the next listing the same import), keeping the newest :data:`KEPT_SNAPSHOTS`."""
    target = user_snapshot(fingerprint)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, json.dumps(built.to_json(fingerprint), indent=1) + "\n")
        kept = sorted(target.parent.glob("catalog-*.json"), key=lambda p: p.stat().st_mtime,
                      reverse=True)
        for old in kept[KEPT_SNAPSHOTS:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def loss_names() -> list[str]:
    """Every loss name in registration order, without importing torch when the snapshot is fresh."""
    if "featcache.losses" in sys.modules:
        from featcache.losses import loss_names as registered

        return registered()
    return _snapshot_or_build().loss_names()


# ------------------------------------------------------------------ built from the classes
def build_catalog() -> Catalog:
    """The catalog read from the registered classes (imports torch and the backbones)."""
    from featcache.backbones import backbone_names, backbone_spec
    from featcache.losses import loss_class
    from featcache.losses import loss_names as registered

    return Catalog([loss_info(loss_class(name)) for name in registered()],
                   [backbone_info(backbone_spec(name)) for name in backbone_names(testing=True)])


def loss_info(cls) -> LossInfo:
    """The listed metadata of one loss class."""
    doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("``", "")
    return LossInfo(
        name=cls.name, reference=cls.reference, year=cls.year, paper=cls.paper,
        summary=cls.summary, doc=doc,
        params={key: ParamInfo(param.default, param.range_text(), param.help)
                for key, param in cls.params.items()},
        dataset_defaults={dataset: dict(values) for dataset, values in cls.dataset_defaults.items()},
        needs=[need.description for need in cls.needs], handoff_state=list(cls.handoff_state))


def backbone_info(spec) -> BackboneInfo:
    """The listed metadata of one backbone spec, with where its default weights are cached."""
    pre = spec.preprocess
    return BackboneInfo(
        name=spec.name, library=spec.library, model=spec.model or spec.name,
        default_weights=spec.default_weights, dim=spec.dim,
        default_image_size=spec.default_image_size,
        preprocess={"resize": pre.resize, "crop_pct": pre.crop_pct,
                    "interpolation": pre.interpolation, "mean": list(pre.mean),
                    "std": list(pre.std)},
        pooling=spec.pooling, has_text=spec.has_text, summary=spec.summary, testing=spec.testing,
        weights_file=_default_weights_file(spec))


def _default_weights_file(spec) -> dict:
    from featcache.backbones.weights import describe_weights
    from featcache.errors import FeatcacheError

    if spec.default_weights == "random":
        return {}
    try:
        source = describe_weights(spec)
    except FeatcacheError:  # the library is not installed: nothing to look up either
        return {}
    return spec.family.cache_entry(source)


def write_snapshot(path: Path = SNAPSHOT) -> Path:
    """Rewrite the snapshot from the classes (``make catalog``)."""
    document = build_catalog().to_json(source_fingerprint())
    return write_text_atomic(path, json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    written = write_snapshot(Path(sys.argv[1]) if len(sys.argv) > 1 else SNAPSHOT)
    print(f"wrote {os.path.relpath(written)}")
