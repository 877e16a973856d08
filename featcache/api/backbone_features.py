"""``BackboneFeatures``: a scikit-learn transformer from images to stage one's pooled features.

>>> pipe = make_pipeline(BackboneFeatures("resnet50"), SPMLClassifier(loss="an-ls"))  # doctest: +SKIP
>>> pipe.fit(["train/a.jpg", "train/b.jpg", ...], ["dog", "cat", ...])             # doctest: +SKIP

Images (paths, or PIL images already open) go through stage one's own steps: decoding as the
reference does (``PIL.Image.open(p).convert("RGB")``), the backbone's resize (and crop) on the
CPU to uint8, normalisation on the device, the same layout, precision and batching, and the
backbone built from the same weights (``featcache.backbones.create_backbone``). Given a features
file's images in its order and with its batch size, the rows are bit for bit the file's; in
other batches the CPU's convolution kernels may round the last bits differently.

``cache=DIR`` keeps every image's features on disk, keyed like stage one's files: one folder per
backbone identity (backbone, weights and their sha256 or random seed, image size, transform,
precision, dtype: what makes stage one call a features file up to date), described by its
``identity.json``, and in it one ``.npy`` per image named by the sha256 of the image's bytes
(a PIL image's mode, size and pixels), written atomically. A changed image or another network
never meets a stale row.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from numbers import Integral
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from featcache.api.constraints import RegisteredNames
from featcache.api.images import run_on_images
from featcache.backbones import (
    PROTOCOL,
    Trunk,
    backbone_names,
    backbone_spec,
    create_backbone,
    resolve_preprocess,
    transform_description,
)
from featcache.backbones.inputs import ImageRows
from featcache.backbones.preprocess import PREPROCESS_MODES
from featcache.backbones.weights import describe_weights, locate_weights
from featcache.data.images import to_rgb
from featcache.errors import InputError
from featcache.fileio import write_bytes_atomic, write_json_atomic
from featcache.paths import feature_tag
from featcache.runtime import PRECISIONS, pick_device, resolve_precision

#: what ``transform`` takes, for messages
TAKES = ("BackboneFeatures takes images: image paths or PIL images, as a list, a 1-D array or "
         "one column of a 2-D array or DataFrame")
#: the identity fields that key the on-disk cache (stage one's up-to-date test, less the labels)
IDENTITY_KEYS = ("backbone", "weights", "weights_sha256", "weights_seed", "image_size",
                 "transform", "precision", "dtype")


class ImageItems(ImageRows):
    """Stage one's :class:`ImageRows` over a list that may hold PIL images besides paths: an
    image already open is converted (``to_rgb``) and resized exactly as a decoded file is."""

    def __getitem__(self, index: int):
        item = self.relpaths[int(self.rows[index])]
        if isinstance(item, Image.Image):
            return self.resize(to_rgb(item)), int(self.rows[index]), True
        return super().__getitem__(index)


class BackboneFeatures(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Pooled backbone features (n, D) of images, as ``featcache features`` computes them.

    Parameters
    ----------
    backbone : str
        A registered backbone (``featcache backbones``), e.g. ``"resnet50"``.
    weights : str or None
        As ``featcache features --weights``: None for the backbone's default, ``"random"``, a
        torchvision name or hub tag, or a checkpoint path.
    image_size : int or None
        Input side in pixels (None: the backbone's default, 448 for ResNets).
    preprocess : {"native", "protocol"}
        The backbone's own transform, or the protocol's squash + ImageNet normalisation.
    batch_size : int or None
        Images per forward pass (None: stage one's default for the device).
    device : str
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
    precision : {"auto", "fp32", "bf16", "fp16"}
        ``auto``: bf16 (or fp16) autocast on GPUs, fp32 on the CPU, as stage one.
    workers : int
        DataLoader workers decoding and resizing the images (0: in this process).
    seed : int
        The seed of ``weights="random"``.
    cache : str, path or None
        A folder keeping every image's features (see the module docstring).
    progress : bool
        Show a progress bar while computing features.

    Attributes
    ----------
    trunk_ : Trunk
        The backbone, in eval mode on the CPU.
    identity_ : dict
        What a features file records of its network: backbone, weights, weights_sha256
        (and weights_seed for random weights), image_size, transform, precision, dtype.
    cache_dir_ : pathlib.Path or None
        This network's folder in ``cache``.
    """

    _parameter_constraints: dict = {
        "backbone": [RegisteredNames(backbone_names, lambda: backbone_names(testing=False))],
        "weights": [str, os.PathLike, None],
        "image_size": [Interval(Integral, 32, None, closed="left"), None],
        "preprocess": [StrOptions(set(PREPROCESS_MODES))],
        "batch_size": [Interval(Integral, 1, None, closed="left"), None],
        "device": [str],
        "precision": [StrOptions(set(PRECISIONS))],
        "workers": [Interval(Integral, 0, None, closed="left")],
        "seed": [Interval(Integral, 0, None, closed="left")],
        "cache": [str, os.PathLike, None],
        "progress": ["boolean"],
    }

    def __init__(self, backbone="resnet50", weights=None, image_size=None, preprocess="native",
                 batch_size=None, device="cpu", precision="auto", workers=0, seed=0, cache=None,
                 progress=True):
        self.backbone = backbone
        self.weights = weights
        self.image_size = image_size
        self.preprocess = preprocess
        self.batch_size = batch_size
        self.device = device
        self.precision = precision
        self.workers = workers
        self.seed = seed
        self.cache = cache
        self.progress = progress

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.one_d_array = True  # a list of images
        tags.input_tags.two_d_array = True  # one column of them (ColumnTransformer)
        tags.input_tags.string = True
        tags.requires_fit = True
        return tags

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Build the backbone (its weights located, and downloaded when allowed, as stage one
        does); ``X`` is checked to be images but not read."""
        image_items(X)
        spec = backbone_spec(self.backbone)
        source = describe_weights(spec, None if self.weights is None else str(self.weights),
                                  int(self.seed))
        if source.kind != "random":
            source = locate_weights(source)
        size = int(self.image_size or spec.default_image_size)
        return self._set_trunk(create_backbone(spec.name, source, seed=source.seed,
                                               image_size=size), tag=source.tag)

    def _set_trunk(self, trunk: Trunk, tag: str | None) -> BackboneFeatures:
        """Take ``trunk`` (built for this estimator's parameters) as the fitted network."""
        spec = backbone_spec(self.backbone)
        size = int(self.image_size or spec.default_image_size)
        self.trunk_ = trunk.eval()
        self.identity_ = {
            **{k: v for k, v in trunk.weights_identity.items() if k in IDENTITY_KEYS},
            "backbone": self.backbone, "image_size": size,
            "transform": transform_description(size, self.backbone, "pil", self.preprocess),
            "precision": resolve_precision(self.precision, self._device()), "dtype": "float32",
        }
        self._n_features_out = int(spec.dim)
        self.cache_dir_ = None
        if self.cache is not None:
            key = hashlib.sha256(json.dumps(self.identity_, sort_keys=True).encode()).hexdigest()
            protocol = self.preprocess == "protocol" and spec.preprocess != PROTOCOL
            tag = feature_tag(spec.name, tag or self.identity_.get("weights"), protocol)
            self.cache_dir_ = Path(self.cache) / f"images-{tag}-{key[:12]}"
        return self

    def transform(self, X) -> np.ndarray:
        """Pooled features (n, D), float32, one row per image in order."""
        check_is_fitted(self)
        items = image_items(X)
        cache = self.cache_dir_
        keys = [image_key(item, row) for row, item in enumerate(items)] if cache else []
        out = np.empty((len(items), self._n_features_out), dtype=np.float32)
        todo = list(range(len(items)))
        if cache is not None:
            todo = [row for row in todo if not self._cached(cache, keys[row], out, row)]
        if todo:
            features = self._compute([items[row] for row in todo])
            out[todo] = features
            if cache is not None:
                self._store(cache, [keys[row] for row in todo], features)
        return out

    def _compute(self, items: list) -> np.ndarray:
        device = self._device()
        spec = backbone_spec(self.backbone)
        layout = torch.channels_last if spec.channels_last else torch.contiguous_format
        preprocess = resolve_preprocess(self.backbone, self.preprocess)
        size = self.identity_["image_size"]
        names = [item if not isinstance(item, Image.Image) else f"PIL image {i}"
                 for i, item in enumerate(items)]
        trunk = self.trunk_.to(device).to(memory_format=layout)
        try:
            _, features = run_on_images(
                names, trunk, size, self.backbone, device, batch_size=self.batch_size,
                workers=int(self.workers), precision=self.precision, progress=self.progress,
                desc=f"features {self.backbone}", preprocess=preprocess,
                dataset=ImageItems(Path("."), items, size, preprocess=preprocess),
                fix_hint="fix or remove it (BackboneFeatures gives one row per image)")
        finally:
            self.trunk_.to("cpu")
        return features

    def _cached(self, cache: Path, key: str, out: np.ndarray, row: int) -> bool:
        path = cache / key[:2] / f"{key}.npy"
        if not path.is_file():
            return False
        try:
            value = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError):
            return False  # a damaged entry is computed (and written) again
        if value.shape != out[row].shape:
            return False
        out[row] = value
        return True

    def _store(self, cache: Path, keys: list[str], features: np.ndarray) -> None:
        identity = cache / "identity.json"
        if not identity.is_file():
            write_json_atomic(identity, self.identity_)
        for key, row in zip(keys, features, strict=True):
            buffer = io.BytesIO()
            np.save(buffer, row, allow_pickle=False)
            write_bytes_atomic(cache / key[:2] / f"{key}.npy", buffer.getbuffer())

    def _device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return pick_device(self.device)


def image_items(X) -> list:
    """The images of ``X`` as a list of paths (str) and PIL images; anything else is refused
    naming what was given."""
    if isinstance(X, (str, os.PathLike, Image.Image)):
        raise InputError(f"{TAKES}; got one {type(X).__name__}: wrap it in a list")
    if hasattr(X, "columns") or hasattr(X, "iloc"):  # a pandas DataFrame or Series
        X = X.to_numpy()
    if isinstance(X, np.ndarray):
        if X.dtype.kind not in "OUS":
            raise InputError(f"{TAKES}; got a numeric array of shape {X.shape}")
        if X.ndim == 2 and X.shape[1] == 1:
            X = X[:, 0]
        if X.ndim != 1:
            raise InputError(f"{TAKES}; got an array of shape {X.shape}")
        X = X.tolist()
    try:
        items = list(X)
    except TypeError:
        raise InputError(f"{TAKES}; got {type(X).__name__}") from None
    if not items:
        raise InputError(f"{TAKES}; got none (0 images)")
    for row, item in enumerate(items):
        if isinstance(item, os.PathLike):
            items[row] = os.fspath(item)
        elif not isinstance(item, (str, Image.Image)):
            raise InputError(f"{TAKES}; item {row} is {type(item).__name__} {str(item)[:40]!r}")
        elif isinstance(item, str) and not Path(item).is_file():
            raise InputError(f"image {item} (item {row}) does not exist")
    return items


def image_key(item, row: int) -> str:
    """The cache key of one image: sha256 of a file's bytes, or of a PIL image's mode, size
    and pixels."""
    digest = hashlib.sha256()
    if isinstance(item, Image.Image):
        digest.update(f"PIL {item.mode} {item.size};".encode())
        digest.update(item.tobytes())
        return digest.hexdigest()
    try:
        with open(item, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise InputError(f"cannot read image {item} (item {row}): {exc.strerror}") from None
    return digest.hexdigest()
