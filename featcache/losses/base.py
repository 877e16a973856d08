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
- ``handoff_state``: the state a linear run hands to fine-tuning (ROLE's phi);
- ``head``: the kind of head its logits come from (:class:`~featcache.heads.HeadKind`).

What a loss needs of a trainer beyond the logits is a capability it declares by its base
class, with real methods the trainers call (and the type checker checks):
:class:`MaskedPassLoss` (IGNORE) asks for a second forward pass on the input masked to the
single positive's class activation map.

:meth:`SPMLLoss.resolve` turns what a user gave into every parameter's value (defaults
included), which is what runs record; an instance holds them per head in
:attr:`SPMLLoss.param_values` (the class's ``params`` are the declarations). Per-example state (ROLE's label estimates, APL's
pseudo-labels, LL-Cp's corrected labels, OPML-SP's corrections) lives in a dict of tensors of
shape (H, N, L) that the loss creates in :meth:`SPMLLoss.init_state`; rows are indexed by
``Targets.index`` (rows of the training split).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import ClassVar

import torch
from torch import Tensor

from featcache.data.kestimate import EstimateRequest
from featcache.errors import LossNeedError, LossStateError, OptionError, did_you_mean, plural
from featcache.heads import HeadKind
from featcache.losses.needs import D, DataFacts, Need
from featcache.losses.params import Param, ParamValue, ResolvedParams
from featcache.losses.targets import Targets
from featcache.losses.terms import device_constant


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
    #: the kind of head whose logits the loss receives (:class:`~featcache.heads.HeadKind`:
    #: linear on pooled features, or a head on spatial maps: BoostLU's, or a CAM head; a loss
    #: whose head reads maps declares the spatial-features need too)
    head: ClassVar[HeadKind] = HeadKind.LINEAR
    #: whether a training step of this loss can be captured as a CUDA graph: none of its
    #: operators reads a value on the host (``.item()``, ``nonzero``, boolean indexing, a
    #: linear-algebra routine that checks its result on the host). A loss that cannot
    #: (OPML-SP's singular values) trains on CUDA in stacked groups of its own, step by step
    #: (``tests/test_step_capture.py`` checks every shipped loss's declaration)
    capturable: ClassVar[bool] = True
    #: whether a training step's operators or scalar arguments change from one epoch to the
    #: next (a schedule read from the epoch: GR's K and V, the large-loss rejection rates):
    #: its CUDA graph is captured again every epoch, so on CUDA it trains in stacked groups of
    #: its own, apart from the losses whose graph serves every epoch
    scheduled: ClassVar[bool] = False

    def __init__(self, num_classes: int, num_heads: int = 1,
                 params: Mapping[str, ParamValue] | None = None,
                 dataset: str | None = None, facts: DataFacts | None = None):
        self.num_classes = int(num_classes)
        self.num_heads = int(num_heads)
        resolved = self.resolve(params or {}, facts=facts, dataset=dataset)
        #: each parameter's value for every head (resolved: defaults included); the class's
        #: ``params`` declares them
        self.param_values: dict[str, list[float]] = {}
        for key, values in resolved.values.items():
            if len(values) == 1:
                values = values * self.num_heads
            if len(values) != self.num_heads:
                raise OptionError(f"loss {self.name!r} parameter {key!r} has {plural(len(values), 'value')} "
                                  f"for {plural(self.num_heads, 'head')}")
            self.param_values[key] = values

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
                    and param.decided_by(facts) is None):
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
            value: ParamValue
            if key in given:
                value, source = given[key], "given"
            elif key in by_dataset:
                value, source = by_dataset[key], "dataset"
            elif (decided := param.decided_by(facts)) is not None:
                value, source = decided, "data"
            elif param.default is not None:
                value, source = param.default, "default"
            else:
                raise OptionError(f"loss {cls.name!r} needs parameter {key!r} ({param.help}); "
                                  + (param.missing or f"pass --param {key}=VALUE"))
            items: list[float | EstimateRequest] = (
                [value] if isinstance(value, (int, float, EstimateRequest)) else list(value))
            if not items:
                raise OptionError(f"loss {cls.name!r} parameter {key!r} has no value")
            values: list[float] = []
            records: list[dict | None] = []
            for item in items:
                if isinstance(item, EstimateRequest):
                    record = cls._estimate(key, param, item, facts)
                    records.append(record)
                    values.append(float(record["value"]))
                else:
                    records.append(None)
                    values.append(float(item))
            if any(record is not None for record in records):
                resolved.estimates[key] = records
                source = "estimate"
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
        values = self.param_values[name]
        if all(v == values[0] for v in values):
            return values[0]
        device = like.device if like is not None else None
        dtype = like.dtype if like is not None else torch.float32
        return device_constant(values, device, dtype).view(-1, 1, 1)

    def head_params(self, head: int) -> dict[str, float]:
        """The parameter values of one head."""
        return {key: values[head] for key, values in self.param_values.items()}

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
        return {name: list(self.param_values[param]) for name, param in self.learned_state.items()}

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
                  state: dict[str, Tensor]) -> dict[str, float | Sequence[float]]:
        """Once per epoch, after its training steps: update per-example state.

        ``probs()`` returns the current predictions on the whole training split, shape
        (H, N, L) (computed only when called). Returns numbers worth logging: one for every
        head, or a sequence of one per head.
        """
        return {}

    def __repr__(self) -> str:
        shown = {k: (v[0] if len(set(v)) == 1 else v) for k, v in self.param_values.items()}
        return f"{type(self).__name__}(name={self.name!r}, params={shown})"


class MaskedPassLoss(SPMLLoss, abc.ABC):
    """A loss that compares the logits with those of a second forward pass on the input masked
    to the single positive's class activation map (IGNORE, Song et al. 2024).

    Its head is one that gives class activation maps (a kind whose heads read spatial maps).
    The trainers compute the maps, ask the loss for the mask (:meth:`position_mask` on cached
    feature maps in stage two, :meth:`image_mask` on images in stage three), run the masked
    pass and hand its logits to the loss as ``Targets.masked``; stage three also gives it a
    strongly augmented view (``Targets.strong``). Its statistics are over a whole batch, so a
    configuration trains in one process.
    """

    head = HeadKind.CAM

    @abc.abstractmethod
    def position_mask(self, cam: Tensor, observed: Tensor) -> Tensor:
        """Stage two's mask of feature-map positions (H, B, P), 1 kept and 0 zeroed, from the
        class activation maps ``cam`` (H, B, P, L) and the observed labels (B, L)."""

    @abc.abstractmethod
    def image_mask(self, cam: Tensor, observed: Tensor, size: tuple[int, int]) -> Tensor:
        """Stage three's mask (B, 1, H, W) that multiplies the normalised images of ``size``,
        from the class activation maps ``cam`` (B, L, h, w) of one head."""
