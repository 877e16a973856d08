"""The file stage two hands to stage three: a linear run's ``best.pt``.

It holds the selected head (``weight`` L x D in ``nn.Linear`` layout, ``bias``), every loss
parameter of the selected configuration (``params``, defaults included), the loss's hand-off
state (``handoff``: ROLE's label estimates phi, one row per training row listed in
``train_rows``), and the identity of its inputs (labels and features sha256, backbone, weights,
transform) so that fine-tuning can refuse a head that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from featcache.errors import InputError, plural
from featcache.fileio import save_torch_atomic
from featcache.protocol.runs import RunFolder, rerun_advice
from featcache.schema import (
    Integer,
    ListOf,
    MapOf,
    Mismatch,
    Number,
    Record,
    Schema,
    Text,
    nullable,
)
from featcache.torchfile import load_checked

HEAD_FILE = "best.pt"
HEAD_FORMAT = "featcache-linear-head"
#: 2: ``params`` holds every parameter (defaults included) and ``handoff`` the hand-off state
HEAD_FORMAT_VERSION = 2


def save_head(path: Path, payload: dict) -> None:
    """Write a head file atomically."""
    save_torch_atomic(path, {"format": HEAD_FORMAT, "format_version": HEAD_FORMAT_VERSION, **payload})


def load_saved(path: Path, expected_format: str, what: str) -> dict:
    """A dict saved with ``torch.save`` by featcache, checked to be of ``expected_format``
    (a run's ``best.pt`` of either stage); the errors name the file and what is wrong."""
    payload = load_checked(path, rerun_advice(path.parent))
    if not isinstance(payload, dict) or payload.get("format") != expected_format:
        raise InputError(f"{path} is not a featcache {what}")
    return payload


class TensorOf(Schema):
    """A tensor of ``ndim`` dimensions (any, when None) of floating point or whole numbers."""

    def __init__(self, ndim: int | None = None, kind: str = "float"):
        self.ndim, self.kind = ndim, kind
        self.expected = (f"a {ndim}-dimensional tensor" if ndim is not None else "a tensor")

    def accepts(self, value) -> bool:
        import torch

        if not isinstance(value, torch.Tensor) or (self.ndim is not None
                                                    and value.ndim != self.ndim):
            return False
        return value.is_floating_point() if self.kind == "float" else not value.is_complex()


#: what featcache's readers use of a head file (stage two's best.pt); its other keys are
#: compared, not used
HEAD_SCHEMA = Record(
    required={"weight": TensorOf(2), "bias": TensorOf(1)},
    optional={"dataset": Text(), "loss": Text(), "classes": ListOf(Text()),
              "handoff": nullable(MapOf(TensorOf())), "params": nullable(MapOf(nullable(Number()))),
              "train_rows": TensorOf(1, kind="integer"), "seed": Integer(),
              "transform": nullable(MapOf()), "head": nullable(MapOf())})


def load_head(run_dir: Path) -> dict:
    """A finished linear run's head file, checked (the errors say what is wrong)."""
    run_dir = Path(run_dir)
    RunFolder(run_dir).results()  # refuses an unfinished run
    path = run_dir / HEAD_FILE
    if not path.is_file():
        raise InputError(f"{run_dir} has no {HEAD_FILE}; it is not a finished linear run")
    head = load_saved(path, HEAD_FORMAT, "linear head")
    if head.get("format_version") == 1:  # version 1: ROLE's phi under its own key, "bsize"
        phi = head.pop("phi", None)
        head["handoff"] = {} if phi is None else {"phi": phi}
        head["batch_size"] = head.pop("bsize", None)
    elif head.get("format_version") != HEAD_FORMAT_VERSION:
        raise InputError(f"{path} has head format {head.get('format_version')}; this featcache "
                         f"reads {HEAD_FORMAT_VERSION} and 1: train the linear run again")
    try:
        HEAD_SCHEMA.check(head)
        if head["weight"].shape[0] != head["bias"].shape[0]:
            raise Mismatch("bias", f"holds {plural(head['bias'].shape[0], 'value')}, but "
                                   f"weight has {plural(head['weight'].shape[0], 'row')} (one "
                                   "per class)")
    except Mismatch as exc:
        raise InputError(f"{path} is not a valid featcache linear head: {exc}; "
                         f"{rerun_advice(run_dir)}") from None
    return head


@dataclass
class LinearPhaseRequest:
    """LinearInit's linear phase, asked of stage two by stage three when no linear run fits:
    one configuration (``lr``, ``batch_size``) for LINEAR_EPOCHS, written as a normal
    stage-two run folder whose path is returned."""

    dataset: str
    loss: str
    features: Path
    lr: float
    batch_size: int
    params: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    val_variant: str = "clean"
    device: str = "cpu"
    cache: str | None = None
    progress: bool = True
    pseudo_labels: str | None = None


#: what stage three calls to train the linear phase (``featcache.linear.run.train_linear_phase``)
LinearPhase = Callable[[LinearPhaseRequest], Path]
