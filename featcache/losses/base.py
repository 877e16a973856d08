"""The loss interface shared by linear training (stage two) and fine-tuning (stage three).

A loss works on a stack of H independent heads at once: logits have shape (H, B, L) (H heads,
a batch of B examples, L classes) and the loss returns one scalar per head, shape (H,). Stage
two trains a whole grid of configurations as stacked heads; stage three uses H = 1. Summing
the H losses and back-propagating gives every head exactly its own gradient.

Conventions (``shared/PROTOCOL.md`` section 3): probabilities f = sigmoid(g);
``neglog(x) = -log(x + 1e-5)``; a loss matrix (H, B, L) is divided by B * L and summed; a
regularizer is added afterwards, not divided. Losses defined on logits (the LL-* family, ZLPR,
OPML) say so in their docstrings.

Each loss class declares, in one place, everything the stages ask of it:

- ``needs``: what the training data must offer (:data:`FULL_LABELS`, :data:`OBSERVED_NEGATIVES`,
  :func:`pseudo_labels` of a rule), each a :class:`Need` that says in words why given data falls
  short;
- ``params``: its parameters, each a :class:`Param` with its default, its valid range and, for
  a parameter the data decides (EPR's and ROLE's ``k``), how to read it from :class:`DataFacts`;
  ``dataset_defaults`` overrides defaults per protocol dataset (the reference code's values);
- ``learned_state``: per-example state the optimizer trains beside the head, with the parameter
  that holds its learning-rate multiplier (ROLE: phi at ``lr_mult`` times the head's rate);
- ``handoff_state``: the state a linear run hands to fine-tuning (ROLE's phi).

:meth:`SPMLLoss.resolve` turns what a user gave into every parameter's value (defaults
included), which is what runs record. Per-example state (ROLE's label estimates, APL's
pseudo-labels, LL-Cp's corrected labels, OPML-SP's corrections) lives in a dict of tensors of
shape (H, N, L) that the loss creates in :meth:`SPMLLoss.init_state`; rows are indexed by
``Targets.index`` (rows of the training split).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar

import torch
from torch import Tensor

from featcache.data.kestimate import EstimateRequest, estimate_k
from featcache.errors import LossNeedError, LossStateError, OptionError, did_you_mean, plural

LOG_EPSILON = 1e-5

#: a parameter's value: a number, several (a grid axis), or a request to estimate it from the
#: data (``estimate:M``, :class:`~featcache.data.kestimate.EstimateRequest`)
ParamValue = float | EstimateRequest | Sequence[float | EstimateRequest]


_CONSTANTS: dict[tuple, Tensor] = {}


def device_constant(values: Sequence[float], device: torch.device | str | None,
                    dtype: torch.dtype) -> Tensor:
    """``values`` as a 1-D tensor on ``device``, built once per values, device and dtype.

    Losses call this at every step: ``torch.tensor(values, device=cuda)`` would copy from the
    host each time and make the host wait for the device. Treat the result as read-only.
    """
    key = (tuple(values), torch.device(device or "cpu"), dtype)
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = _CONSTANTS[key] = torch.tensor(list(values), dtype=dtype, device=key[1])
    return tensor


def unit_gradient(like: Tensor, count: int, sign: float = 1.0) -> Tensor:
    """``sign / count`` as autograd's backward of ``total / count`` computes it (``1 / count``
    on ``like``'s dtype and device; negation is exact), as a 0-d tensor built once per count,
    sign, device and dtype: the seed of a hand-written gradient. Treat it as read-only."""
    key = ("unit", count, sign, like.device, like.dtype)
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = _CONSTANTS[key] = sign * (torch.ones((), dtype=like.dtype, device=like.device)
                                           / count)
    return tensor


def neglog(x: Tensor) -> Tensor:
    """``-log(x + 1e-5)``, the reference code's guarded log on probabilities."""
    return -torch.log(x + LOG_EPSILON)


def matrix_mean(loss_matrix: Tensor) -> Tensor:
    """Sum an (H, B, L) loss matrix over B and L and divide by B * L: shape (H,)."""
    batch, classes = loss_matrix.shape[-2:]
    return loss_matrix.sum(dim=(-2, -1)) / (batch * classes)


def expected_positive_regularizer(probs: Tensor, k: float | Tensor) -> Tensor:
    """``(mean over the batch of sum_i f_ni - k)^2 / L^2`` per head: shape (H,)."""
    classes = probs.shape[-1]
    k = k.reshape(-1) if isinstance(k, Tensor) else k
    return (probs.sum(dim=-1).mean(dim=-1) - k) ** 2 / classes**2


# ------------------------------------------------------------------------------ the data's side
@dataclass(frozen=True)
class DataFacts:
    """What a loss may ask of its training data (built by each stage from its labels file)."""

    dataset: str
    num_classes: int
    source: str = "the labels file"  # named in messages: the labels file's path
    has_clean_train: bool = True
    has_observed_negatives: bool = False
    mean_positives: float | None = None  # k: mean positives per official training image
    #: ((positives per image, images), ...) of the official training set's clean labels (empty
    #: without them): what ``--param k=estimate:M`` draws from
    positives_histogram: tuple[tuple[int, int], ...] = ()
    pseudo_labels: tuple[str, ...] = ()  # names of the pseudo-label sets made for these labels
    pseudo_choice: str | None = None  # the set the user chose (--pseudo-labels), if any
    #: whether the training features are spatial maps (stage two: a spatial features file,
    #: ``featcache features --spatial``; stage three: the trunk's feature map, always)
    spatial_features: bool = False
    backbone: str | None = None  # the features' backbone, named in messages


class TrainingData(Protocol):
    """What a stage's data offers a :class:`Need` (stage two's and stage three's data do)."""

    @property
    def facts(self) -> DataFacts: ...

    def with_observed_negatives(self, num_neg: int) -> TrainingData: ...

    def with_pseudo_labels(self, name: str) -> TrainingData: ...


D = TypeVar("D", bound=TrainingData)


@dataclass(frozen=True)
class Need:
    """Something a loss requires of the training data.

    ``unmet(facts)`` says why data falls short (None when it does not); ``adapt(data)``
    completes data that can be completed (observed negatives drawn from full labels).
    """

    key: str
    description: str
    unmet: Callable[[DataFacts], str | None]
    adapt: Callable[[TrainingData], TrainingData] | None = None


def _needs_full_labels(facts: DataFacts) -> str | None:
    if facts.has_clean_train:
        return None
    return (f"trains on full labels, but {facts.source} holds single positives only "
            "(no clean training labels)")


def _needs_negatives(facts: DataFacts) -> str | None:
    if facts.has_observed_negatives or facts.has_clean_train:
        return None
    return "needs observed negatives; prepare the labels with --num-neg 1"


def _draw_negatives(data: TrainingData) -> TrainingData:
    return data if data.facts.has_observed_negatives else data.with_observed_negatives(num_neg=1)


def pseudo_labels(rule: str) -> Need:
    """Pseudo-labels from ``featcache pseudo-label`` (the set named ``rule`` unless the user
    chose another with ``--pseudo-labels``), attached to the training rows as ``Targets.pseudo``."""

    def unmet(facts: DataFacts) -> str | None:
        name = facts.pseudo_choice or rule
        if name in facts.pseudo_labels:
            return None
        have = f" (made so far: {', '.join(facts.pseudo_labels)})" if facts.pseudo_labels else ""
        return (f"needs pseudo-labels {name!r}{have}; make them from a vision-language features "
                f"file with `featcache pseudo-label --dataset {facts.dataset} --rule {rule}`"
                + (f" --name {name}" if name != rule else ""))

    def adapt(data: TrainingData) -> TrainingData:
        return data.with_pseudo_labels(data.facts.pseudo_choice or rule)

    return Need("pseudo_labels", f"pseudo-labels (`featcache pseudo-label --rule {rule}`)",
                unmet, adapt)


def _needs_spatial(facts: DataFacts) -> str | None:
    if facts.spatial_features:
        return None
    backbone = f" --backbone {facts.backbone}" if facts.backbone else ""
    return ("trains a BoostLU head on spatial feature maps, but there is no spatial features "
            f"file for {facts.dataset}: run "
            f"`featcache features --dataset {facts.dataset}{backbone} --spatial` first")


#: full (clean) training labels: the oracles bce, bce-ls and iun
FULL_LABELS = Need("full_labels", "full train labels", _needs_full_labels)
#: observed negatives (``--num-neg``), drawn with the protocol's sampler when full labels exist
OBSERVED_NEGATIVES = Need("observed_negatives", "observed negatives", _needs_negatives,
                          adapt=_draw_negatives)
#: spatial feature maps (B, h*w, D) instead of pooled features: BoostLU's heads (Kim et al.
#: 2023) boost the class activation map before pooling. Stage two reads them from the spatial
#: features file, stage three from the trunk's ``feature_map``.
SPATIAL_FEATURES = Need("spatial_features",
                        "spatial feature maps (`featcache features --spatial`)", _needs_spatial)


# ------------------------------------------------------------------------------------ parameters
@dataclass(frozen=True)
class Param:
    """One loss parameter: its default, its valid range, and (``from_data``) how the data sets it.

    A ``None`` default with ``from_data`` means the data decides (EPR's ``k``: the labels
    file's mean positives per image). ``integer`` parameters take whole numbers (epochs,
    0/1 switches).
    """

    default: float | None
    help: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    from_data: Callable[[DataFacts], float | None] | None = None
    missing: str = ""  # what to do when neither the data nor the user gives a value
    #: how ``--param NAME=estimate:M`` estimates the value from M fully labelled training
    #: images: (facts, request) -> the record kept in results.json, its ``value`` the estimate
    estimate: Callable[[DataFacts, EstimateRequest], dict] | None = None

    def range_text(self) -> str:
        """The valid range in interval notation, e.g. ``[0, 1]`` or ``(0, inf)``."""
        def bound(value: float) -> str:
            return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:g}"

        if self.integer and (self.low, self.high) == (0.0, 1.0):
            return "0 or 1"
        kind = "whole numbers in " if self.integer else ""
        return (f"{kind}{'(' if self.low_open or self.low == -math.inf else '['}{bound(self.low)}, "
                f"{bound(self.high)}{')' if self.high_open or self.high == math.inf else ']'}")

    def accepts(self, value: float) -> bool:
        if not math.isfinite(value) or (self.integer and not float(value).is_integer()):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


def _mean_positives(facts: DataFacts) -> float | None:
    return facts.mean_positives


def _estimate_k(facts: DataFacts, request: EstimateRequest) -> dict:
    if not facts.positives_histogram:
        raise OptionError(f"k=estimate:{request.labeled} draws fully labelled images from the "
                          f"training set, but {facts.source} has no clean training labels; pass "
                          "--param k=VALUE")
    return estimate_k(facts.positives_histogram, request)


#: EPR's and ROLE's k: expected positives per image, from the labels file unless given
K_PARAM = Param(
    None, "expected positives per image (default: the labels file's mean over the training set; "
          "estimate:M estimates it from M fully labelled training images)",
    low=0.0, low_open=True, from_data=_mean_positives,
    missing="the labels file has no clean training labels to compute it: pass --param k=VALUE",
    estimate=_estimate_k,
)


def unit_interval(default: float, help: str) -> Param:
    """A parameter in [0, 1] (smoothing, fractions)."""
    return Param(default, help, low=0.0, high=1.0)


def non_negative(default: float, help: str) -> Param:
    """A parameter in [0, inf) (weights, exponents)."""
    return Param(default, help, low=0.0)


def positive(default: float, help: str) -> Param:
    """A parameter in (0, inf) (multipliers, constants inside logs)."""
    return Param(default, help, low=0.0, low_open=True)


def switch(default: float, help: str) -> Param:
    """A 0/1 switch."""
    return Param(default, help, low=0.0, high=1.0, integer=True)


def epoch_count(default: float, help: str) -> Param:
    """A number of epochs (a whole number >= 0)."""
    return Param(default, help, low=0.0, integer=True)


@dataclass
class ResolvedParams:
    """Every parameter of a loss: its values (several for a grid axis), where each came from
    (``given``, ``estimate``, ``dataset``, ``data`` or ``default``) and, for estimated values,
    how they were estimated (one record per value, ``--param k=estimate:M``)."""

    values: dict[str, list[float]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    estimates: dict[str, list[dict | None]] = field(default_factory=dict)

    def chosen(self) -> list[str]:
        """Parameters set by the user or the data (not defaults): they name a configuration."""
        return sorted(k for k, source in self.sources.items()
                      if source in ("given", "estimate", "data"))

    def single(self) -> dict[str, float]:
        """One value per parameter (refuses grid axes)."""
        several = sorted(k for k, v in self.values.items() if len(v) != 1)
        if several:
            raise OptionError(f"parameter {', '.join(several)} has several values; one is "
                              "needed here")
        return {k: v[0] for k, v in self.values.items()}


@dataclass
class Targets:
    """What a loss sees of one batch besides the logits.

    ``observed``: (B, L) float, 1 observed positive, 0 unobserved, -1 observed negative.
    ``index``: (B,) int64, the rows of the training split (to index per-example state).
    ``clean``: (B, L) float 0/1 full labels, or None when the data has none.
    ``pseudo``: (B, L) float pseudo-labels (1 positive, -1 negative, 0 none), for the losses
    that declare the :func:`pseudo_labels` need; None otherwise.
    """

    observed: Tensor
    index: Tensor
    clean: Tensor | None = None
    pseudo: Tensor | None = None


class SPMLLoss:
    """Base class of every loss in the registry.

    Subclasses set the class attributes and implement :meth:`forward`; those with per-example
    state also implement :meth:`init_state` (and :meth:`end_epoch` when the state changes once
    per epoch); those whose terms follow a schedule over the run read its length in
    :meth:`begin_epoch`.
    """

    #: registry name, e.g. ``"an-ls"``
    name: ClassVar[str] = ""
    #: one line for ``featcache losses``
    summary: ClassVar[str] = ""
    #: where the loss comes from, e.g. ``"Cole et al. CVPR 2021"``
    reference: ClassVar[str] = ""
    #: the paper's title (and arXiv id where it has one)
    paper: ClassVar[str] = ""
    #: the year of that paper
    year: ClassVar[int | None] = None
    #: the parameters, with defaults, ranges and (``from_data``) what the data decides
    params: ClassVar[Mapping[str, Param]] = {}
    #: per-dataset overrides of the defaults, keyed by protocol dataset (voc, coco, nuswide, cub)
    dataset_defaults: ClassVar[Mapping[str, Mapping[str, float]]] = {}
    #: what the training data must offer
    needs: ClassVar[tuple[Need, ...]] = ()
    #: state tensors trained by the optimizer beside the head -> the parameter holding their
    #: learning-rate multiplier (ROLE: ``{"phi": "lr_mult"}``)
    learned_state: ClassVar[Mapping[str, str]] = {}
    #: state a linear run hands to fine-tuning (ROLE's label estimates ``phi``)
    handoff_state: ClassVar[tuple[str, ...]] = ()
    #: the head whose logits the loss receives: ``"linear"`` (on pooled features) or
    #: ``"boostlu"`` (Kim et al. 2023: a 1x1 convolution over the spatial map, positive entries
    #: of the class activation map multiplied by the parameter ``alpha`` before pooling; such
    #: losses also declare the :data:`SPATIAL_FEATURES` need)
    head: ClassVar[str] = "linear"

    def __init__(self, num_classes: int, num_heads: int = 1,
                 params: Mapping[str, ParamValue] | None = None,
                 dataset: str | None = None, facts: DataFacts | None = None):
        self.num_classes = int(num_classes)
        self.num_heads = int(num_heads)
        resolved = self.resolve(params or {}, facts=facts, dataset=dataset)
        self.params: dict[str, list[float]] = {}
        for key, values in resolved.values.items():
            if len(values) == 1:
                values = values * self.num_heads
            if len(values) != self.num_heads:
                raise OptionError(f"loss {self.name!r} parameter {key!r} has {plural(len(values), 'value')} "
                                  f"for {plural(self.num_heads, 'head')}")
            self.params[key] = values

    # ----------------------------------------------------------------- needs
    @classmethod
    def unmet_need(cls, facts: DataFacts, given: Collection[str] = ()) -> str | None:
        """Why data with these facts cannot train this loss (None when it can): a declared
        need, or a parameter that only the data or the user can set (``given`` names the
        parameters the user set)."""
        for need in cls.needs:
            reason = need.unmet(facts)
            if reason is not None:
                return reason
        for key, param in cls.params.items():
            if (param.default is None and key not in given
                    and key not in cls.dataset_defaults.get(facts.dataset, {})
                    and (param.from_data is None or param.from_data(facts) is None)):
                return f"needs {key} ({param.help}); " + (param.missing or f"pass --param {key}=VALUE")
        return None

    @classmethod
    def fit_data(cls, data: D) -> D:
        """``data`` made ready for this loss (observed negatives drawn for ``iu``), or a
        :class:`~featcache.errors.LossNeedError` saying what the data lacks."""
        reason = cls.unmet_need(data.facts, given=cls.params)
        if reason is not None:
            raise LossNeedError(f"loss {cls.name!r} {reason}")
        for need in cls.needs:
            if need.adapt is not None:
                data = need.adapt(data)
        return data

    # ----------------------------------------------------------------- parameters
    @classmethod
    def default_values(cls, dataset: str | None = None) -> dict[str, float | None]:
        """Each parameter's default on ``dataset`` (None: the data decides)."""
        values = {key: param.default for key, param in cls.params.items()}
        values.update(cls.dataset_defaults.get(dataset or "", {}))
        return values

    @classmethod
    def resolve(cls, given: Mapping[str, ParamValue], facts: DataFacts | None = None,
                dataset: str | None = None) -> ResolvedParams:
        """Every parameter's values: ``given`` (several values: a grid axis), else the dataset's
        default, else what the data says (``from_data``), else the default; each checked
        against its range. Errors name the parameter, the range and the fix."""
        unknown = sorted(set(given) - set(cls.params))
        if unknown:
            valid = ", ".join(sorted(cls.params)) or "none"
            hint = did_you_mean(unknown[0], cls.params)
            raise OptionError(f"loss {cls.name!r} has no parameter "
                              f"{', '.join(map(repr, unknown))}{hint}; its parameters are: {valid}")
        dataset = dataset or (facts.dataset if facts is not None else None)
        by_dataset = cls.dataset_defaults.get(dataset or "", {})
        resolved = ResolvedParams()
        for key, param in cls.params.items():
            if key in given:
                value, source = given[key], "given"
            elif key in by_dataset:
                value, source = by_dataset[key], "dataset"
            elif param.from_data is not None and facts is not None and param.from_data(facts) is not None:
                value, source = param.from_data(facts), "data"
            elif param.default is not None:
                value, source = param.default, "default"
            else:
                raise OptionError(f"loss {cls.name!r} needs parameter {key!r} ({param.help}); "
                                  + (param.missing or f"pass --param {key}=VALUE"))
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            if not items:
                raise OptionError(f"loss {cls.name!r} parameter {key!r} has no value")
            if any(isinstance(item, EstimateRequest) for item in items):
                records = [cls._estimate(key, param, item, facts) if
                           isinstance(item, EstimateRequest) else None for item in items]
                items = [record["value"] if record else item
                         for record, item in zip(records, items, strict=True)]
                resolved.estimates[key] = records
                source = "estimate"
            values = [float(v) for v in items]
            for number in values:
                if not param.accepts(number):
                    raise OptionError(
                        f"loss {cls.name!r} parameter {key}={number:g} is out of range: {key} "
                        f"takes {param.range_text()} ({param.help})")
            resolved.values[key] = values
            resolved.sources[key] = source
        return resolved

    @classmethod
    def _estimate(cls, key: str, param: Param, request: EstimateRequest,
                  facts: DataFacts | None) -> dict:
        """The record of ``key=estimate:M`` (its ``value`` the estimate)."""
        if param.estimate is None:
            estimable = sorted(k for k, p in cls.params.items() if p.estimate is not None)
            raise OptionError(f"loss {cls.name!r} parameter {key!r} cannot be estimated from the "
                              f"data ({request}); "
                              + (f"only {', '.join(estimable)} can" if estimable else
                                 "give a number"))
        if facts is None:
            raise OptionError(f"{key}={request} needs the training data to estimate from")
        return param.estimate(facts, request)

    def value(self, name: str, like: Tensor | None = None) -> float | Tensor:
        """Parameter ``name``: a float when all heads share it, else an (H, 1, 1) tensor."""
        values = self.params[name]
        if all(v == values[0] for v in values):
            return values[0]
        device = like.device if like is not None else None
        dtype = like.dtype if like is not None else torch.float32
        return device_constant(values, device, dtype).view(-1, 1, 1)

    def head_params(self, head: int) -> dict[str, float]:
        """The parameter values of one head."""
        return {key: values[head] for key, values in self.params.items()}

    # ----------------------------------------------------------------- state
    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Per-example state for N training rows, tensors of shape (H, N, L); none by default.

        ``observed`` is the (N, L) observed-label matrix of the training split, ``clean`` its
        full labels when known. ``initial`` hands over state from an earlier run (LinearInit
        passes ROLE's phi, shape (N, L) or (H, N, L)).
        """
        return {}

    def learned_state_lr_mults(self) -> dict[str, list[float]]:
        """State tensors the optimizer trains beside the head, with each head's lr multiplier."""
        return {name: list(self.params[param]) for name, param in self.learned_state.items()}

    def state_tensor(self, state: Mapping[str, Tensor], key: str) -> Tensor:
        """``state[key]``, or a clear error when the caller did not pass :meth:`init_state`'s dict."""
        if key not in state:
            raise LossStateError(f"loss {self.name!r} keeps per-example state {key!r}: pass the dict "
                                 "returned by init_state() to every call")
        return state[key]

    # ----------------------------------------------------------------- computing
    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        """Loss per head, shape (H,), for logits (H, B, L) in epoch ``epoch`` (0-based)."""
        raise NotImplementedError

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        """The loss per head (H,) and the gradient of their sum with respect to ``logits``
        (H, B, L), written out by hand: bit for bit what autograd gives through
        :meth:`forward`, without its bookkeeping (most of a training step's cost on small
        batches). None, the default: the trainer runs autograd through :meth:`forward`.
        A loss that trains state beside the head (:attr:`learned_state`) keeps autograd."""
        return None

    def __call__(self, logits: Tensor, targets: Targets, state: dict[str, Tensor] | None = None,
                 epoch: int = 0) -> Tensor:
        if logits.dim() == 2:
            return self.forward(logits.unsqueeze(0), targets, state or {}, epoch)[0]
        return self.forward(logits, targets, state or {}, epoch)

    def begin_epoch(self, epoch: int, num_epochs: int, state: dict[str, Tensor]) -> None:
        """Once per epoch, before its first training step (nothing by default).

        Both training stages call it with the 0-based ``epoch`` and the run's ``num_epochs``;
        losses whose terms move over the epochs (GR's K/V schedules) read the run's length here.
        """

    def end_epoch(self, epoch: int, num_epochs: int, probs: Callable[[], Tensor],
                  state: dict[str, Tensor]) -> dict[str, float]:
        """Once per epoch, after its training steps: update per-example state.

        ``probs()`` returns the current predictions on the whole training split, shape
        (H, N, L) (computed only when called). Returns numbers worth logging.
        """
        return {}

    def __repr__(self) -> str:
        shown = {k: (v[0] if len(set(v)) == 1 else v) for k, v in self.params.items()}
        return f"{type(self).__name__}(name={self.name!r}, params={shown})"
