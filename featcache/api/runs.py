"""``load_run``: a finished run folder of stage two or three as an object that predicts.

>>> run = featcache.load_run("cache/voc/runs/role/20261122-113501")   # doctest: +SKIP
>>> run.classes, run.config["params"], run.metrics["test_map"]           # doctest: +SKIP
>>> P = run.predict_proba(X)                 # features (n, D) of the run's backbone
>>> P = run.predict_proba_images(["a.jpg"])  # images through the run's own backbone
>>> clf = run.to_estimator()                 # stage two: a fitted SPMLClassifier
>>> S = run.predict_sets(X, level=0.9)      # conformal label sets (n, L) of 0/1

A stage-two run is its selected head (``best.pt``, :mod:`featcache.protocol.handoff`) on top
of the backbone its features came from, rebuilt and checked against the recorded weights
(:func:`featcache.backbones.rebuild.trunk_for_features`). A stage-three run is its fine-tuned
network (``best.pt`` of format ``featcache-finetune-model``: ``trunk.*`` and ``head.*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from featcache.api.head_logits import head_logits, module_logits, probabilities
from featcache.api.images import image_paths, run_on_images
from featcache.api.label_sets import LabelSets
from featcache.api.predict import check_input, read_features_input
from featcache.backbones import Preprocess, Trunk, backbone_spec
from featcache.backbones.rebuild import (
    recorded_image_size,
    recorded_preprocess,
    trunk_for_features,
    trunk_from_state,
)
from featcache.backbones.transforms import preprocess_mode
from featcache.errors import InputError, OptionError
from featcache.finetune.search import BEST, MODEL_FORMAT, MODEL_FORMAT_VERSION
from featcache.heads import HeadKind, map_rows
from featcache.losses import loss_class
from featcache.protocol.handoff import load_head, load_saved
from featcache.protocol.runs import RESULTS, RunFolder
from featcache.protocol.search_modes import SearchMode, recorded_search_mode
from featcache.runtime import pick_device

if TYPE_CHECKING:  # scikit-learn is imported by the methods that build its objects
    from sklearn.pipeline import Pipeline

    from featcache.api.estimator import SPMLClassifier


def load_run(path: str | Path) -> LinearRun | FinetuneRun:
    """The finished run at ``path`` (its folder, or its ``best.pt`` / ``results.json``)."""
    path = Path(path)
    if path.is_file() and path.name in (BEST, RESULTS):
        path = path.parent
    if not path.is_dir():
        raise InputError(f"run {path} does not exist (give a run folder, e.g. "
                         "cache/<dataset>/runs/<loss>/<run-id>)")
    document = RunFolder(path).results()
    stage = document.get("stage")
    if document.get("head", {}).get("kind") == "zero-shot":
        raise InputError(f"{path} is a zero-shot row (no trained head to load); its scores come "
                         "from featcache.ZeroShotClassifier.from_features(FEATURES_FILE)")
    if stage == "linear":
        return LinearRun(path, document)
    if stage == "finetune":
        return FinetuneRun(path, document)
    raise InputError(f"{path / RESULTS} is from stage {stage!r}; load_run reads stage-two "
                     "(linear) and stage-three (finetune) runs")


class TrainedRun(LabelSets):
    """What both kinds of run offer: their description, predictions from features or images,
    and conformal label sets (:class:`~featcache.api.label_sets.LabelSets`)."""

    stage = ""

    def __init__(self, path: Path, document: dict):
        self.path = Path(path)
        self.document = document
        self._trunk: nn.Module | None = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.path)!r}: {self.loss} on {self.dataset}, "
                f"test mAP {self.metrics['test_map']:.2f})")

    # ------------------------------------------------------------------ what it is
    @property
    def loss(self) -> str:
        return self.document["loss"]

    @property
    def dataset(self) -> str:
        return self.document["dataset"]

    @property
    def classes(self) -> list[str]:
        """Class names in output order."""
        return list(self.about["classes"])

    @property
    def config(self) -> dict:
        """The selected configuration: loss, every resolved loss parameter (``params``), lr,
        batch size, epoch, seed, the protocol's options, the backbone and the run's
        ``settings`` (what its fingerprint covers)."""
        selection, protocol = self.document["selection"], self.document["protocol"]
        return {"stage": self.stage, "loss": self.loss, "dataset": self.dataset,
                "params": dict(selection["params"]), "lr": selection["lr"],
                "batch_size": selection["batch_size"], "epoch": selection["epoch"],
                "seed": self.seed, "epochs": protocol["epochs"],
                "val_variant": protocol["val_variant"],
                "early_stop": protocol.get("early_stop", "none"), "backbone": self.backbone,
                "weights": self.weights, "image_size": self.image_size,
                "feature_dim": self.feature_dim, "settings": self.document.get("settings", {})}

    @property
    def metrics(self) -> dict:
        """Validation and test mAP (percent) of the selected configuration, per-class test AP,
        the mAP over classes with positives, and (stage two) mean and std over seeds."""
        selection = self.document["selection"]
        keys = ("val_map", "val_map_observed", "test_map", "train_map", "test_ap_per_class",
                "val_map_classes_with_positives", "test_map_classes_with_positives")
        out = {key: selection.get(key) for key in keys}
        if "summary" in self.document:
            out["summary"] = self.document["summary"]
        out["evaluation"] = self.document.get("evaluation")
        return out

    def map_interval(self, resamples: int = 1000, seed: int = 0, level: float = 0.95):
        """The test mAP's bootstrap interval (:func:`featcache.api.uncertainty.map_interval`)."""
        from featcache.api.uncertainty import map_interval

        return map_interval(self, resamples, seed, level)

    @property
    def seed(self) -> int:
        raise NotImplementedError

    @property
    def search_mode(self) -> SearchMode:
        """The search mode the run recorded (a fine-tuning run records none: the default)."""
        return recorded_search_mode(self.document, str(self.path))

    @property
    def about(self) -> dict:
        """The run's saved model file, as loaded."""
        raise NotImplementedError

    @property
    def backbone(self) -> str:
        return str(self.about.get("backbone"))

    @property
    def weights(self) -> str | None:
        raise NotImplementedError

    @property
    def image_size(self) -> int | None:
        raise NotImplementedError

    @property
    def head(self) -> tuple[Tensor, Tensor]:
        """The linear head: weight (L, D) and bias (L,), float32 on the CPU."""
        raise NotImplementedError

    @property
    def preprocess(self) -> Preprocess:
        """How images become the backbone's input, as the run's features (or network) had it."""
        return recorded_preprocess(self.about)

    @property
    def head_kind(self) -> HeadKind:
        """How the run's head predicts (its loss's kind of head as recorded,
        :attr:`HeadKind.recorded`): a kind that reads maps (BoostLU's) takes rows of (h, w, D)
        maps, the others pooled features."""
        return loss_class(self.loss).head.recorded

    @property
    def head_params(self) -> dict[str, float]:
        """The loss parameters the run's kind of head reads (BoostLU's ``alpha``)."""
        params = self.about.get("params") or {}
        return {key: float(params[key]) for key in self.head_kind.implementation.loss_params}

    @property
    def boostlu_alpha(self) -> float | None:
        """BoostLU's alpha when the run's head is a BoostLU head (a ``+boostlu`` loss), else
        None: its logits are then the boosted mean over the positions of spatial maps."""
        return self.head_params.get("alpha")

    @property
    def feature_dim(self) -> int:
        """The width of an input row: D for a linear head; h w D (a spatial map in (h, w, D)
        order) for a stage-two BoostLU head, D per position for a fine-tuned one."""
        shape = (self.about.get("head") or {}).get("spatial_shape")
        if self.head_kind.spatial and shape:
            return int(np.prod(shape))
        return int(self.head[0].shape[1])

    # ------------------------------------------------------------------ predicting
    def decision_function(self, features) -> np.ndarray:
        """Logits (n, L) of the head on ``features`` (n, D)."""
        return self.logits(self._features(features))

    def predict_proba(self, features) -> np.ndarray:
        """Probabilities (n, L) for ``features``: an (n, D) array or a features file (checked
        against the run, :func:`featcache.api.predict.check_input`). For a stage-two run,
        features of its backbone; for a fine-tuned run, of its own fine-tuned trunk
        (:meth:`embed_images`)."""
        return probabilities(self.decision_function(features))

    def predict(self, features, threshold: float = 0.5) -> np.ndarray:
        """0/1 predictions (n, L): probability at least ``threshold``."""
        return (self.predict_proba(features) >= threshold).astype(np.int64)

    def embed_images(self, paths: Sequence[str | Path], **options) -> np.ndarray:
        """Pooled features (n, D) of images (files, or folders of them) from the run's trunk;
        for a BoostLU run, its feature maps as rows (n, h w D) in (h, w, D) order."""
        return self.run_images(paths, **options)[1]

    def predict_proba_images(self, paths: Sequence[str | Path], **options) -> np.ndarray:
        """Probabilities (n, L) for images through the run's own backbone and preprocessing.

        Options: ``batch_size``, ``device`` (default ``"cpu"``), ``workers``, ``precision``
        (``auto``: bf16 on GPUs, fp32 on the CPU), ``progress``.
        """
        _, features = self.run_images(paths, **options)
        return probabilities(self.logits(features))

    def run_images(self, paths: Sequence[str | Path], batch_size: int | None = None,
                   device: str = "cpu", workers: int = 0, precision: str = "auto",
                   skip_bad: bool = False, progress: bool = True) -> tuple[list[Path], np.ndarray]:
        """(images read, their pooled features): the work behind the image methods."""
        image_size = self.require_images()
        where = pick_device(device)
        layout = (torch.channels_last if backbone_spec(self.backbone).channels_last
                  else torch.contiguous_format)
        trunk = self.trunk().to(where).to(memory_format=layout)
        forward = trunk if not self.head_kind.spatial else (
            lambda x: map_rows(trunk.feature_map(x))[0])
        return run_on_images(image_paths(paths), forward, image_size, self.backbone, where,
                             batch_size=batch_size, workers=workers, precision=precision,
                             skip_bad=skip_bad, progress=progress, desc=f"predict {self.loss}",
                             preprocess=self.preprocess)

    def require_images(self) -> int:
        """The image size the run's backbone reads; InputError when the run's features did not
        come from images (a set imported with ``featcache prepare features``): nothing can put
        an image through its backbone."""
        if self.image_size is None:
            raise InputError(
                f"{self.path} was trained on features that did not come from images (backbone "
                f"{self.backbone!r}, e.g. a set imported from features): it has features but no "
                "images, so it reads no images (no predictions from images, no class activation "
                f"maps); predict from features with `featcache predict --run {self.path} "
                "--features FILE`")
        return self.image_size

    def logits(self, features: np.ndarray) -> np.ndarray:
        weight, bias = self.head
        features = self.search_mode.head_rows(features)  # e.g. a --search probe head's rows
        positions = features.shape[1] // weight.shape[1] if self.head_kind.spatial else 1
        return head_logits(self.head_kind, features, weight.numpy(), bias.numpy(), positions,
                           self.head_params)

    def trunk(self) -> Trunk:
        """The run's backbone trunk (built once, in eval mode): pooled features, and
        ``feature_map`` for class activation maps."""
        if self._trunk is None:
            self._trunk = self._build_trunk()
        return self._trunk

    def _build_trunk(self) -> Trunk:
        raise NotImplementedError

    def _features(self, features) -> np.ndarray:
        if isinstance(features, (str, Path)):
            given = read_features_input(features)
            check_input(self, given)
            return given.features
        array = np.asarray(features.cpu() if isinstance(features, Tensor) else features,
                           dtype=np.float32)
        channels = int(self.head[0].shape[1])
        maps = (self.head_kind.spatial and self.stage == "finetune" and array.ndim == 2
                and array.shape[1] % channels == 0)
        if array.ndim != 2 or (array.shape[1] != self.feature_dim and not maps):
            raise InputError(f"features of shape {array.shape} do not fit {self.path}: it takes "
                             f"(n, {self.feature_dim}) {self.backbone} features")
        return array


class LinearRun(TrainedRun):
    """A stage-two run: its selected head on the backbone its features came from."""

    stage = "linear"

    def __init__(self, path: Path, document: dict):
        super().__init__(path, document)
        self._head = load_head(path)

    @property
    def about(self) -> dict:
        return self._head

    @property
    def seed(self) -> int:
        return int(self.document["selection"].get("seed", 0))

    @property
    def weights(self) -> str | None:
        return self._head.get("weights")

    @property
    def image_size(self) -> int | None:
        return recorded_image_size(self._head)

    @property
    def head(self) -> tuple[Tensor, Tensor]:
        return self._head["weight"].float(), self._head["bias"].float()

    def _build_trunk(self) -> Trunk:
        return trunk_for_features(self._head, f"linear run {self.path}")

    def to_estimator(self) -> SPMLClassifier:
        """This run's selected head as a fitted :class:`SPMLClassifier` (its parameters are the
        selected configuration, so ``clone(...).fit`` trains it again)."""
        refusal = self.search_mode.estimator_refusal(str(self.path))
        if refusal is not None:
            raise InputError(refusal)
        from featcache.api.estimator import SPMLClassifier  # scikit-learn: only when asked
        from featcache.api.targets import MATRIX

        config = self.config
        clf = SPMLClassifier(loss=self.loss, loss_params=dict(config["params"]),
                             lr=config["lr"], batch_size=config["batch_size"],
                             epochs=config["epochs"], seed=config["seed"],
                             early_stop=config["early_stop"],
                             spatial_shape=(self._head.get("head") or {}).get("spatial_shape"))
        weight, bias = self.head
        clf.coef_, clf.intercept_ = weight.numpy(), bias.numpy()
        clf.classes_ = np.array(self.classes)
        clf.target_form_ = MATRIX  # a run's labels file is a label matrix
        clf.batch_size_ = config["batch_size"]
        clf.n_features_in_ = self.feature_dim
        clf.loss_params_ = dict(config["params"])
        clf.best_epoch_ = config["epoch"]
        variant = config["val_variant"]
        selection = self.document["selection"]
        clf.best_score_ = selection["val_map"] if variant == "clean" else selection["val_map_observed"]
        clf.loss_state_ = {k: v.numpy() for k, v in (self._head.get("handoff") or {}).items()}
        clf.history_ = self._history()
        return clf

    def to_pipeline(self, weights: str | None = None, **options) -> Pipeline:
        """``make_pipeline(BackboneFeatures(...), SPMLClassifier(...))``, fitted: the backbone
        this run's features came from (checked against the recorded weights) and its selected
        head, so that ``predict_proba(image_paths)`` gives :meth:`predict_proba_images`'s
        numbers. ``weights`` names the weights file of a run made with one; ``options`` go to
        :class:`BackboneFeatures` (``batch_size``, ``device``, ``cache``, ``progress`` ...)."""
        if self.head_kind.spatial:
            raise OptionError(f"{self.path} has a BoostLU head on spatial feature maps, not on "
                              "pooled features; use predict_proba_images")
        if self.image_size is None:
            raise InputError(f"{self.path} records no image size (its features did not come "
                             "from images): it predicts from features only")
        trunk = self.trunk() if weights is None else trunk_for_features(
            self._head, f"linear run {self.path}", weights=weights)
        identity = trunk.weights_identity
        mode = preprocess_mode(self.about.get("transform") or {}, self.backbone, self.image_size)
        from sklearn.pipeline import make_pipeline

        from featcache.api.backbone_features import BackboneFeatures

        features = BackboneFeatures(
            backbone=self.backbone, image_size=self.image_size, preprocess=mode or "native",
            weights=weights or identity.get("weights"), seed=int(identity.get("weights_seed", 0)),
            **options)
        return make_pipeline(features._set_trunk(trunk, tag=None), self.to_estimator())

    def _history(self) -> list[dict]:
        selection = self.document["selection"]
        for seed in self.document.get("seeds", []):
            for config in seed["configs"]:
                if (config["seed"], config["lr"], config["batch_size"], config["params"]) == (
                        selection["seed"], selection["lr"], selection["batch_size"],
                        selection["params"]):
                    return [{k: e.get(k) for k in ("epoch", "train_loss", "val_map",
                                                   "val_map_observed", "train_map")}
                            for e in config["epochs"]]
        return []


class FinetuneRun(TrainedRun):
    """A stage-three run: its fine-tuned network (trunk and head) at the selected epoch."""

    stage = "finetune"

    def __init__(self, path: Path, document: dict):
        super().__init__(path, document)
        file = path / BEST
        if not file.is_file():
            raise InputError(f"{path} has no {BEST}; it is not a finished fine-tuning run")
        saved = load_saved(file, MODEL_FORMAT, "fine-tuned model")
        if saved.get("format_version") != MODEL_FORMAT_VERSION:
            raise InputError(f"{file} has model format {saved.get('format_version')}; this "
                             f"featcache reads {MODEL_FORMAT_VERSION}")
        self._saved = saved

    @property
    def about(self) -> dict:
        return self._saved

    @property
    def seed(self) -> int:
        return int(self.document["protocol"].get("seed", 0))

    @property
    def weights(self) -> str | None:
        return (self._saved.get("weights") or {}).get("weights")

    @property
    def image_size(self) -> int | None:
        return int(self._saved["image_size"])

    @property
    def head(self) -> tuple[Tensor, Tensor]:
        model = self._saved["model"]
        return model["head.weight"].float(), model["head.bias"].float()

    def _build_trunk(self) -> Trunk:
        return trunk_from_state(self.backbone, self._saved["model"], f"fine-tuned run {self.path}",
                                image_size=self.image_size)

    def logits(self, features: np.ndarray) -> np.ndarray:
        """The fine-tuned head as the network applies it (:class:`~featcache.heads.HeadModule`
        in float32; BoostLU's on feature-map rows)."""
        weight, bias = self.head
        positions = features.shape[1] // weight.shape[1] if self.head_kind.spatial else 1
        return module_logits(self.head_kind, features, weight, bias, positions, self.head_params)

    def to_estimator(self) -> SPMLClassifier:
        raise OptionError(f"{self.path} is a fine-tuned run: its head sits on its own fine-tuned "
                          "network, not on fixed features, so it is no SPMLClassifier; use "
                          "predict_proba_images (or embed_images, then predict_proba)")
