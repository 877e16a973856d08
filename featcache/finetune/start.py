"""Where fine-tuning starts: a linear run's head and label estimates (LinearInit), or a fresh head.

``--init best`` takes the finished linear run of the loss with the best validation mAP built
on the same labels file and on a features file that has not changed since; when there is none,
the linear phase is trained first with LinearInit's fixed hyperparameters (PROTOCOL.md
section 2) into a normal stage-two run directory. ``--init PATH`` takes a given run directory
(or its ``best.pt``). ``--init none`` starts from ``--weights`` and a fresh, seeded head.

A linear run is refused, with the reason, when it does not fit: another dataset or labels
file, another class list, another backbone, other weights (sha256), another image size or
transform, a features file that changed since, or (for ROLE's phi) other training rows.
A run of another loss is accepted with a warning: its head is a linear classifier like any
other, but hand-off state (ROLE's label estimates) is used only by the loss that made it.

Stage three does not train linear heads itself: when the linear phase must run first it asks
stage two through the ``linear_phase`` callable it is given (the command passes
:func:`featcache.linear.run.train_linear_phase`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from featcache.backbones import (
    backbone_spec,
    create_backbone,
    described_image_size,
    preprocess_mode,
    recorded_decoder,
    transform_description,
)
from featcache.backbones.rebuild import trunk_for_features
from featcache.backbones.weights import describe_weights, locate_weights
from featcache.data.featurefile import read_feature_attrs
from featcache.errors import InputError, OptionError, plural
from featcache.fileio import sha256_file
from featcache.finetune.data import FinetuneData
from featcache.finetune.options import FinetuneOptions
from featcache.losses import loss_class
from featcache.paths import runs_dir
from featcache.protocol.feature_source import DEFAULT_BACKBONE
from featcache.protocol.grid import linearinit_hparams
from featcache.protocol.handoff import HEAD_FILE, LinearPhase, LinearPhaseRequest, load_head
from featcache.protocol.linear_phase_source import linear_phase_source
from featcache.protocol.loss_choice import needs_spatial
from featcache.protocol.runs import RunFolder, best_run
from featcache.protocol.search_modes import recorded_search_mode
from featcache.runtime import Ranks, on_main


@dataclass
class StartPoint:
    """The backbone (pristine, shared by every configuration), the head and the hand-over state."""

    mode: str  # "linear" or "none"
    backbone: str
    trunk: nn.Module
    image_size: int
    preprocess: str = "native"  # the --preprocess mode of the features (see featcache features)
    head_weight: Tensor | None = None  # (L, D)
    head_bias: Tensor | None = None  # (L,)
    handoff: dict[str, Tensor] = field(default_factory=dict)  # ROLE's phi (N_train, L), logits
    params: dict[str, float] = field(default_factory=dict)  # the linear run's loss parameters
    run_dir: Path | None = None
    record: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def weights_identity(self) -> dict:
        return dict(cast(dict, self.trunk.weights_identity))  # set by create_backbone

    def initial_state(self) -> dict[str, Tensor] | None:
        """What ``loss.init_state(initial=...)`` receives (ROLE's phi from LinearInit)."""
        return dict(self.handoff) or None


def resolve_start(options: FinetuneOptions, data: FinetuneData, job: Ranks | None = None,
                  linear_phase: LinearPhase | None = None,
                  val_variant: str | None = None) -> StartPoint:
    """The start point for ``options.init``. With ``best`` and no fitting run, the linear phase
    is trained first by ``linear_phase`` (on rank 0 under torchrun; the others wait for it),
    selecting by ``val_variant`` (resolved on the data; default: the options' as given)."""
    if options.init == "none":
        return fresh_start(options)
    if options.init == "best":
        run_dir = on_main(job, lambda: best_linear_run(options, data))
        ran = run_dir is None
        if run_dir is None:
            lr, batch_size = linearinit_hparams(options.loss, data.dataset, options.linear_lr,
                                                options.linear_batch_size)
            if linear_phase is None:
                raise OptionError(f"no finished linear {options.loss!r} run fits; train one with "
                                  f"`featcache train-linear --dataset {options.dataset} --loss "
                                  f"{options.loss}`, or use --init none")
            request = LinearPhaseRequest(
                dataset=options.dataset, loss=options.loss, features=linear_features(options),
                lr=lr, batch_size=batch_size, params=dict(options.params), seed=options.seed,
                val_variant=val_variant or options.val_variant,
                device=str(job.device) if job is not None else "cpu", cache=options.cache,
                progress=options.progress, pseudo_labels=options.pseudo_labels)
            run_dir = on_main(job, lambda: linear_phase(request))
        start = linear_start(Path(run_dir), options, data)
        start.record["ran_linear_phase"] = ran
        return start
    path = Path(options.init).expanduser()
    if path.is_file():
        path = path.parent
    if not path.is_dir():
        raise OptionError(f"--init {options.init!r}: not 'best', 'none', nor an existing linear run "
                          "directory or its best.pt")
    return linear_start(path, options, data)


# ---------------------------------------------------------------------------- fresh head
def fresh_start(options: FinetuneOptions) -> StartPoint:
    """``--init none``: ``--weights`` (default: the backbone's, v1 for ResNets) and a fresh head
    (drawn per configuration), at ``--image-size`` (default: the backbone's)."""
    backbone = options.backbone or DEFAULT_BACKBONE
    spec = backbone_spec(backbone)
    image_size = options.image_size or spec.default_image_size
    source = describe_weights(spec, options.weights)
    trunk = create_backbone(backbone, locate_weights(source), seed=source.seed,
                            image_size=image_size)
    record = {"mode": "none", "weights": trunk.weights_identity}
    return StartPoint("none", backbone, trunk, image_size, preprocess=options.preprocess,
                      record=record)


# ---------------------------------------------------------------------------- linear runs
def best_linear_run(options: FinetuneOptions, data: FinetuneData) -> Path | None:
    """The best finished linear run that fits (None when there is none)."""
    checked: dict[str, bool] = {}

    def fits(document: dict) -> bool:
        try:  # e.g. a probe run's head scores L2-normalised features, not the trunk's output
            if not recorded_search_mode(document).linear_init:
                return False
        except InputError:  # a mode this featcache does not know
            return False
        features = document.get("features", {})
        path = Path(str(features.get("path", "")))
        if not path.is_file():
            return options.weights is None and options.image_size is None
        key = str(path)
        if key not in checked:
            attrs = read_feature_attrs(path)
            checked[key] = (sha256_file(path) == features.get("sha256")
                            and _weights_match(attrs, options) and
                            (options.image_size is None or attrs.get("image_size") == options.image_size))
        return checked[key]

    try:
        return best_run(runs_dir(options.dataset, options.loss, options.cache),
                        data.labels.sha256, accept=fits)
    except InputError:
        return None


def _weights_match(attrs: dict, options: FinetuneOptions) -> bool:
    if options.weights is None:
        return True
    spec = backbone_spec(attrs.get("backbone", DEFAULT_BACKBONE))
    wanted = describe_weights(spec, options.weights)
    if wanted.kind == "file":
        return attrs.get("weights_sha256") == wanted.sha256
    return attrs.get("weights") == wanted.name


def linear_features(options: FinetuneOptions) -> Path:
    """The features file the linear phase trains on (the spatial one, ``spatial-<tag>.h5``, for
    a BoostLU loss; :func:`~featcache.protocol.linear_phase_source.linear_phase_source`); the error
    says which command makes one."""
    source = linear_phase_source(options.dataset, options.loss, options.backbone,
                                 options.weights, options.image_size, options.cache)
    return source.file(needs_spatial(options.loss))


def linear_start(run_dir: Path, options: FinetuneOptions, data: FinetuneData) -> StartPoint:
    """LinearInit from ``run_dir``, after every compatibility check."""
    head = load_head(run_dir)
    where = f"linear run {run_dir}"
    refusal = recorded_search_mode(RunFolder(run_dir).results(), where).linear_init_refusal(where)
    if refusal is not None:
        raise InputError(refusal)
    check_run_data(head, where, data)
    notes: list[str] = []
    backbone = str(head.get("backbone"))
    if options.backbone is not None and options.backbone != backbone:
        raise InputError(f"{where} was trained on {backbone} features; --backbone {options.backbone} "
                         "would put its head on another network. Drop --backbone, or train a linear "
                         f"run on {options.backbone} features")
    image_size, preprocess = check_transform(head, where, options.image_size, backbone)
    decoded = decoder_note(head, where)
    if decoded is not None:
        warnings.warn(decoded, stacklevel=2)
        notes.append(decoded)
    check_features_unchanged(head, where)
    trunk = trunk_for_run(head, where, options, image_size)
    same_loss = head.get("loss") == options.loss
    carried = head.get("handoff") or {}
    if not same_loss:
        message = (f"{where} was trained with loss {head.get('loss')!r}; fine-tuning with "
                   f"{options.loss!r} starts from its head"
                   + (f" (its {', '.join(carried)} is not used)" if carried else ""))
        warnings.warn(message, stacklevel=2)
        notes.append(message)
    handoff = {}
    for name in loss_class(options.loss).handoff_state:
        if same_loss and carried.get(name) is not None:
            handoff[name] = check_handoff(carried[name], name, head, where, data)
        else:
            notes.append(f"{where} carries no {name}: it starts from the loss's initialisation")
    record = {
        "mode": "linear", "run_dir": str(run_dir),
        "best_pt_sha256": sha256_file(run_dir / HEAD_FILE),
        "loss": head.get("loss"), "params": head.get("params"), "lr": head.get("lr"),
        "batch_size": head.get("batch_size"), "epoch": head.get("epoch"),
        "val_map": head.get("val_map"), "test_map": head.get("test_map"),
        "labels_sha256": head.get("labels_sha256"), "features_sha256": head.get("features_sha256"),
        "features_path": head.get("features_path"), "handoff": sorted(handoff),
        "weights": trunk.weights_identity,
    }
    return StartPoint(
        "linear", backbone, trunk, image_size, preprocess=preprocess,
        head_weight=head["weight"].float(),
        head_bias=head["bias"].float(), handoff=handoff,
        params=dict(head.get("params") or {}) if same_loss else {},
        run_dir=run_dir, record=record, notes=notes,
    )


def check_run_data(head: dict, where: str, data: FinetuneData) -> None:
    """Refuse a run of another dataset, labels file or class list."""
    if head.get("dataset") != data.dataset:
        raise InputError(f"{where} was trained on dataset {head.get('dataset')!r}, not "
                         f"{data.dataset!r}; give a run of this dataset")
    if head.get("labels_sha256") != data.labels.sha256:
        raise InputError(
            f"{where} was trained with another labels file (sha256 {str(head.get('labels_sha256'))[:12]}…) "
            f"than {data.labels.path} (sha256 {str(data.labels.sha256)[:12]}…): the labels were "
            f"prepared again since. Train a new linear run (`featcache train-linear --dataset "
            f"{data.dataset} --loss LOSS`) or use --init none"
        )
    if list(head.get("classes", [])) != list(data.classes):
        raise InputError(f"{where} has classes {head.get('classes')} but {data.labels.path} has "
                         f"{data.classes}")


def check_transform(head: dict, where: str, image_size: int | None, backbone: str) -> tuple[int, str]:
    """The run's image size and preprocessing mode (``native`` or ``protocol``); refuse another
    ``--image-size`` or an evaluation transform fine-tuning cannot reproduce."""
    transform = head.get("transform") or {}
    run_size = described_image_size(transform)
    if run_size is None:
        raise InputError(f"{where} records no image transform (its features file predates it); "
                         "train a new linear run")
    if image_size is not None and image_size != run_size:
        raise InputError(f"{where} was trained on features of {run_size}x{run_size} images; "
                         f"fine-tuning at --image-size {image_size} would start from a head that "
                         f"never saw such features. Drop --image-size (it defaults to {run_size}), "
                         "or extract features at that size and train a linear run on them")
    mode = preprocess_mode(transform, backbone, int(run_size))
    if mode is not None and recorded_decoder(transform) in ("pil", "device"):
        return int(run_size), mode  # device-decoded features: accepted with a note (decoder_note)
    expected = transform_description(int(run_size), backbone)
    differ = sorted(k for k in set(expected) | set(transform) if expected.get(k) != transform.get(k))
    if differ:
        details = "; ".join(f"{k}: run {transform.get(k)!r}, fine-tuning {expected.get(k)!r}"
                            for k in differ)
        raise InputError(f"{where} was trained on features made with another image transform "
                         f"({details}); extract features with the protocol's transform (PIL, "
                         "without --jpeg-draft) and train a linear run on them")
    return int(run_size), "native"


def decoder_note(head: dict, where: str) -> str | None:
    """The note for a run on features whose JPEGs were decoded on the GPU (the default on CUDA):
    fine-tuning decodes with PIL, so its start is close to the linear head, not equal."""
    if recorded_decoder(head.get("transform") or {}) != "device":
        return None
    return (f"{where} was trained on features whose JPEGs were decoded on the GPU (close to "
            "PIL's, not identical); fine-tuning decodes with PIL, the protocol's decoder, so its "
            "first evaluation differs slightly from the linear head's. For the protocol's "
            "LinearInit, extract the features with --pil-decode and train the linear run on them")


def check_features_unchanged(head: dict, where: str) -> None:
    """Refuse a run whose features file was replaced since (its head fits the old features)."""
    path = Path(str(head.get("features_path", "")))
    if path.is_file() and sha256_file(path) != head.get("features_sha256"):
        raise InputError(f"{where} was trained on features with sha256 "
                         f"{str(head.get('features_sha256'))[:12]}…, but {path} has changed since "
                         "(extracted again?); train a new linear run on the current features")


def trunk_for_run(head: dict, where: str, options: FinetuneOptions,
                  image_size: int | None = None) -> nn.Module:
    """The backbone with the run's weights (or ``--weights``, which must be the same weights),
    built for ``image_size`` inputs."""
    return trunk_for_features(head, where, options.weights, image_size=image_size)


def check_handoff(value: Tensor, name: str, head: dict, where: str, data: FinetuneData) -> Tensor:
    """Hand-off state (N, L), refused when its rows are not the current training split's."""
    value = torch.as_tensor(value).float()
    rows = torch.as_tensor(head.get("train_rows", [])).long().numpy()
    expected = data.train_rows
    if len(rows) != len(expected) or (rows != expected).any():
        raise InputError(
            f"{where}'s {name} covers {plural(len(rows), 'training row')}, but fine-tuning trains on the "
            f"{plural(len(expected), 'row')} of the training split of {data.labels.path} (images skipped "
            "as unreadable when the features were extracted?); fix the images, extract the "
            "features again and train a new linear run, or use --init none"
        )
    if tuple(value.shape) != (len(expected), data.num_classes):
        raise InputError(f"{where}: {name} has shape {tuple(value.shape)}, expected "
                         f"({len(expected)}, {data.num_classes})")
    return value
