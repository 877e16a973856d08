"""The training step never makes the host wait for the device.

On a GPU, reading a device value on the host (``.item()``, ``bool(t)``, ``if t.any():``,
``.tolist()``, ``.cpu()``) and copying host data to the device outside pinned, asynchronous
copies (``torch.tensor(..., device=cuda)``, ``t.to(cuda)``) each stall the pipeline. No GPU is
needed to see them: a ``TorchFunctionMode`` counts every such call made during a step on the
CPU, where the code path is the same.
"""

from __future__ import annotations

import pytest
import torch
from helpers_finetune import NAME, base_cache, fresh_setup
from linear_fixtures import pseudo_label_sets
from torch.overrides import TorchFunctionMode

from featcache.finetune import loop
from featcache.finetune.loop import ConfigTrainer
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.readout import LossReadout
from featcache.finetune.run import loss_params
from featcache.losses import MaskedPassLoss, Targets, create_loss, loss_class, loss_names
from featcache.protocol.grid import GridPoint
from featcache.runtime import Ranks

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)

CPU = Ranks(0, 1, 0, 1, torch.device("cpu"))
ACTIVE = {"em-apl": {"warmup": 1.0}, "ll-cp": {"delta_rel": 50.0}, "ll-r": {"delta_rel": 50.0},
          "ll-ct": {"delta_rel": 50.0}, "opml-sp": {"correct_ratio": 0.2}}
#: calls that read a device value on the host (a wait for the device on a GPU)
READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "numpy",
         "nonzero", "any_", "equal"}
#: calls that build a tensor from host data (a blocking host-to-device copy on a GPU)
BUILDS = {"tensor", "as_tensor", "from_numpy"}


class SyncCounter(TorchFunctionMode):
    """Records the calls that would synchronise host and device, and every device move."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self.builds: list[str] = []
        self.moves: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in READS:
            self.reads.append(name)
        elif name in BUILDS:
            self.builds.append(name)
        elif name in ("to", "cuda", "copy_") and _names_a_device(args[1:], kwargs):
            self.moves.append((name, tuple(args[0].shape)))
        return func(*args, **kwargs)


def _names_a_device(args, kwargs) -> bool:
    values = [*args, kwargs.get("device")]
    return any(isinstance(v, (torch.device, str)) and str(v).split(":")[0] in ("cpu", "cuda")
               for v in values)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pseudo_label_sets(base_cache(tmp_path_factory.getbasetemp()) / NAME / "labels.h5")  # vlpl, gpr
    return fresh_setup(tmp_path_factory.getbasetemp())


#: a step through the whole trainer for these; every loss's formula is checked below
STEP_LOSSES = ("an", "role", "ll-cp", "ll-r-abs", "ignore")


@pytest.mark.parametrize("loss", STEP_LOSSES)
def test_a_training_step_never_waits_for_the_device(setup, loss, monkeypatch):
    monkeypatch.setattr(loop, "fused_adam", lambda device: True)  # the optimizer a GPU gets
    data, start = setup
    settings = FinetunePlan(loss=loss, params=loss_params(loss, ACTIVE.get(loss, {}), data), epochs=3,
                        progress=False, eval_batch_size=16)
    trainer = ConfigTrainer(GridPoint(1e-3, 8), settings, start, data, CPU)
    trainer.sampler.set_epoch(2)
    index = trainer.sampler.positions().to(trainer.device)
    batch = next(iter(trainer.train_loader))
    images, positions = batch[0], batch[-2]
    strong = batch[1] if len(batch) == 4 else None  # IGNORE's strong views
    assert torch.equal(positions, index[0])
    # first call: lazily built constants are allowed
    trainer.step(images, index[0], epoch=2, strong=strong)
    counter = SyncCounter()
    with counter:
        trainer.step(images, index[1], epoch=2, strong=strong)
    assert counter.reads == [], f"{loss}: the step reads device values on the host"
    assert counter.builds == [], f"{loss}: the step builds tensors from host data"
    # the only device moves are the batch of images itself (and IGNORE's strong views)
    expected = [("to", tuple(images.shape))] * (1 if strong is None else 2)
    assert counter.moves == expected, counter.moves


@pytest.mark.parametrize("loss", loss_names())
def test_no_loss_formula_waits_for_the_device(setup, loss):
    data, _ = setup
    data = loss_class(loss).fit_data(data)
    params = loss_params(loss, ACTIVE.get(loss, {}), data)
    fn = create_loss(loss, data.num_classes, 1, params=params, dataset=data.dataset)
    state = fn.init_state(data.train.observed, data.train.clean, generator=torch.Generator())
    state = {k: (v.requires_grad_(True) if k in fn.learned_state_lr_mults() else v)
             for k, v in state.items()}
    index = torch.arange(8)
    clean = None if data.train.clean is None else data.train.clean[index]
    pseudo = None if data.train.pseudo is None else data.train.pseudo[index]
    targets = Targets(data.train.observed[index], index, clean, pseudo)
    logits = torch.randn(1, 8, data.num_classes, generator=torch.Generator().manual_seed(0),
                         requires_grad=True)
    if isinstance(fn, MaskedPassLoss):  # IGNORE: the masked pass's logits, and a strong view
        targets.masked = logits.detach() + 1.0
        targets.strong = 2.0 * logits
    fn.begin_epoch(2, 3, state)  # once per epoch, outside the step
    fn.forward(logits, targets, state, 2)  # first call: lazily built constants are allowed
    counter = SyncCounter()
    with counter:
        fn.forward(logits, targets, state, 2).sum().backward()
    assert counter.reads == [] and counter.builds == [] and counter.moves == [], (
        loss, counter.reads, counter.builds, counter.moves)


def test_the_counter_sees_the_calls_that_synchronise():
    counter = SyncCounter()
    flip = torch.zeros(3, dtype=torch.bool)
    with counter:
        if flip.any():  # the old LL-Cp branch
            pass
        torch.tensor([1, 2], device="cpu")
        flip.to("cpu", non_blocking=True)
    assert counter.reads == ["__bool__"] and counter.builds == ["tensor"]
    assert counter.moves == [("to", (3,))]


def test_loss_readout_on_the_cpu_is_immediate():
    readout = LossReadout(torch.device("cpu"))
    assert readout.update(torch.tensor(0.25)) == 0.25
