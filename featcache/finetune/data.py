"""The images and labels of the train / val / test splits, and the loaders that feed training.

Images are decoded as the reference does (PIL, ``convert("RGB")``) and resized to s x s in
DataLoader workers (:class:`~featcache.backbones.inputs.ImageRows`, as stage one does), sent as
uint8 and normalised on the device (:class:`~featcache.backbones.Uint8Normalize`): the same
values as the protocol's ``Resize, [flip,] ToTensor, Normalize`` with a quarter of the bytes.

Reproducibility: the order of epoch e is a permutation drawn from a generator seeded by
(seed, batch size, e), and whether a training image is flipped in epoch e is drawn from one
seeded by (seed, e) and indexed by the row. Both are computed in the main process by the
batch sampler, which hands (row, flip) pairs to the workers, so a resumed run, or a run with
another worker count, sees exactly the same batches. The last partial training batch is
dropped (as the reference's training loader does); evaluation uses every example.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from featcache.backbones.inputs import ImageRows, loader_prefetch, uint8_batch_bytes, worker_init
from featcache.backbones.preprocess import PROTOCOL, Preprocess
from featcache.data.images import image_problem, image_root
from featcache.data.labelfile import LabelSet, load_labels
from featcache.data.negatives import observed_with_negatives
from featcache.data.pseudofile import PseudoLabels, load_pseudo_labels, pseudo_labels_path
from featcache.errors import InputError, OptionError, plural
from featcache.losses import DataFacts
from featcache.protocol.loss_choice import training_facts
from featcache.protocol.seeds import derive_seed


@dataclass
class ImageSplit:
    """One protocol split: rows into the labels file's image list and their labels (CPU)."""

    name: str
    rows: np.ndarray  # global rows: official train rows, then n_train + official test rows
    images: np.ndarray  # paths relative to the image root
    observed: Tensor  # (n, L) float32: 1 observed positive, 0 unobserved, -1 observed negative
    clean: Tensor | None  # (n, L) float32 0/1, or None
    pseudo: Tensor | None = None  # (n, L) float32 pseudo-labels 1 / 0 / -1, for losses that need them

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class FinetuneData:
    """Everything stage three reads from a labels file, plus the folder of its images."""

    dataset: str
    classes: list[str]
    labels: LabelSet
    root: Path
    relpaths: np.ndarray  # every image of the labels file: official train, then test
    train: ImageSplit
    val: ImageSplit
    test: ImageSplit
    notes: list[str] = field(default_factory=list)
    pseudo_choice: str | None = None  # --pseudo-labels NAME
    pseudo_labels: PseudoLabels | None = None  # the set attached to train.pseudo

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def k(self) -> float | None:
        return self.labels.k

    @property
    def train_rows(self) -> np.ndarray:
        """Rows of the official train split used for training (what phi's rows follow)."""
        return self.labels.train_index

    @property
    def facts(self) -> DataFacts:
        """What a loss may ask of the training split (full labels, negatives, k)."""
        # every trunk offers its spatial feature map (``feature_map``): BoostLU's heads use it
        return training_facts(self.labels, self.train.observed.numpy(), self.train.clean is not None,
                              self.pseudo_choice, spatial=True)

    def with_observed_negatives(self, num_neg: int) -> FinetuneData:
        """A copy whose training observations hold ``num_neg`` negatives per row (for ``iu``)."""
        drawn, note = observed_with_negatives(self.labels, self.labels.train_index,
                                              self.train.observed.numpy(), num_neg)
        observed = torch.as_tensor(drawn, dtype=torch.float32)
        return replace(self, train=replace(self.train, observed=observed), notes=self.notes + [note])

    def with_pseudo_labels(self, name: str) -> FinetuneData:
        """A copy whose training rows carry pseudo-label set ``name`` (``train.pseudo``)."""
        if self.pseudo_labels is not None and self.pseudo_labels.name == name:
            return self
        if self.labels.path is None:
            raise InputError("pseudo-labels are read beside a labels file; these labels have none")
        found = load_pseudo_labels(pseudo_labels_path(self.labels.path, name), self.labels)
        pseudo = torch.as_tensor(found.matrix[self.train_rows], dtype=torch.float32)
        note = f"pseudo-labels {name!r} ({found.attrs.get('rule')} rule) from {found.path}"
        return replace(self, train=replace(self.train, pseudo=pseudo), pseudo_labels=found,
                       notes=self.notes + [note])

    def split(self, name: str) -> ImageSplit:
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def load_finetune_data(labels_path: str | os.PathLike,
                       images_root: str | os.PathLike | None = None,
                       pseudo_choice: str | None = None) -> FinetuneData:
    """Load a labels file and find its images' folder; every image must exist (checked here).
    ``pseudo_choice`` names the pseudo-label set for the losses that need one."""
    labels = load_labels(labels_path)
    root = image_root(labels, images_root)
    n_train = len(labels.train)
    splits = {}
    for name in ("train", "val", "test"):
        part = labels.split(name)
        rows = (labels.train_index if name == "train" else labels.val_index if name == "val"
                else n_train + np.arange(len(labels.test)))
        splits[name] = ImageSplit(
            name=name, rows=np.asarray(rows, dtype=np.int64), images=np.asarray(part.images),
            observed=torch.as_tensor(part.observed, dtype=torch.float32),
            clean=None if part.clean is None else torch.as_tensor(part.clean, dtype=torch.float32),
        )
    data = FinetuneData(
        dataset=labels.dataset, classes=list(labels.classes), labels=labels, root=root,
        relpaths=np.concatenate([labels.train.images, labels.test.images]),
        train=splits["train"], val=splits["val"], test=splits["test"], pseudo_choice=pseudo_choice,
    )
    check_images_present(data)
    return data


def check_images_present(data: FinetuneData) -> None:
    """One InputError naming the first missing image (and how many are missing), before any work."""
    for split in (data.train, data.val, data.test):
        missing = [i for i, rel in enumerate(split.images) if not (data.root / str(rel)).is_file()]
        if missing:
            first = missing[0]
            raise InputError(
                f"{len(missing)} of {plural(len(split), f'{split.name} image')} are missing; first: "
                f"{data.root / str(split.images[first])} ({split.name} row {first} of "
                f"{data.labels.path}). Fine-tuning needs every image: check --images-root (the "
                "folder the labels file's paths are relative to)"
            )


def bad_image_error(data: FinetuneData, split: ImageSplit, position: int) -> InputError:
    """The error for an image that could not be decoded while training or evaluating."""
    path = data.root / str(split.images[position])
    reason = image_problem(path) or "it could not be decoded in a DataLoader worker"
    return InputError(f"cannot read image {path} ({split.name} row {position} of "
                      f"{data.labels.path}): {reason}. Fix or replace the file, or prepare the "
                      "dataset without it")


# ---------------------------------------------------------------------------- order and flips
def epoch_order(num_rows: int, batch_size: int, seed: int, epoch: int) -> Tensor:
    """The training batches of one epoch: (steps, batch_size) positions in the training split."""
    steps = num_rows // batch_size
    if steps == 0:
        raise OptionError(f"batch size {batch_size} is larger than the "
                          f"{plural(num_rows, 'training image')}")
    generator = torch.Generator().manual_seed(derive_seed(seed, "finetune-order", batch_size, epoch))
    return torch.randperm(num_rows, generator=generator)[: steps * batch_size].view(steps, batch_size)


def epoch_flips(num_rows: int, seed: int, epoch: int) -> Tensor:
    """Which training images are flipped horizontally in ``epoch`` (bool, by position)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "finetune-flip", epoch))
    return torch.rand(num_rows, generator=generator) < 0.5


#: IGNORE's strong view (Song et al. 2024, the authors' datasets.py): RandAugment(3, 5)
STRONG_OPS, STRONG_MAGNITUDE = 3, 5


def epoch_strong_seeds(num_rows: int, seed: int, epoch: int) -> Tensor:
    """The seed of each training image's strong view in ``epoch`` (int64, by position)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "finetune-strong", epoch))
    return torch.randint(0, 2**62, (num_rows,), generator=generator)


def strong_view(image: Tensor, seed: int) -> Tensor:
    """The strongly augmented view of a resized uint8 image (3, s, s): torchvision's
    RandAugment(3, 5), then a horizontal flip with probability 1/2 (drawn apart from the plain
    view's, as the authors' separate transform draws it), every draw from ``seed``."""
    from torchvision.transforms import RandAugment

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = RandAugment(STRONG_OPS, STRONG_MAGNITUDE)(image)
        flip = bool(torch.rand(()) < 0.5)
    return out.flip(-1) if flip else out


class EpochBatches(Sampler):
    """Batch sampler of (position, flip) pairs: this rank's share of each global batch.

    A global batch of ``batch_size`` examples is cut into ``world`` consecutive parts; rank r
    takes part r, so the ranks together see exactly the batches of a single-process run. With
    ``strong`` (IGNORE), each item also carries the seed of the image's strong view
    (:func:`strong_view`), so a resumed run draws the same augmentations.
    """

    def __init__(self, num_rows: int, batch_size: int, seed: int, flip: bool = True,
                 rank: int = 0, world: int = 1, strong: bool = False):
        if batch_size % world:
            raise OptionError(f"batch size {batch_size} must be divisible by the number of ranks "
                              f"({world}): each rank takes an equal part of every batch")
        self.num_rows, self.batch_size, self.seed, self.flip = num_rows, batch_size, seed, flip
        self.rank, self.world, self.strong = rank, world, strong
        self.epoch = 0
        epoch_order(num_rows, batch_size, seed, 0)  # refuses a batch larger than the split

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_rows // self.batch_size

    def positions(self) -> Tensor:
        """This rank's positions of every batch of the current epoch: (steps, batch_size / world).

        The training step indexes labels and per-example state with a row of this table moved
        to the device once per epoch, so no step copies positions from the host.
        """
        order = epoch_order(self.num_rows, self.batch_size, self.seed, self.epoch)
        part = self.batch_size // self.world
        return order[:, self.rank * part:(self.rank + 1) * part]

    def __iter__(self) -> Iterator[list[tuple[int, bool] | tuple[int, bool, int]]]:
        flips = (epoch_flips(self.num_rows, self.seed, self.epoch) if self.flip
                 else torch.zeros(self.num_rows, dtype=torch.bool))
        if self.strong:
            seeds = epoch_strong_seeds(self.num_rows, self.seed, self.epoch).tolist()
            for batch in self.positions().tolist():
                yield [(position, bool(flips[position]), seeds[position]) for position in batch]
            return
        for batch in self.positions().tolist():
            yield [(position, bool(flips[position])) for position in batch]


def shard_range(num_rows: int, rank: int, world: int) -> range:
    """Contiguous positions of ``rank`` when ``num_rows`` are shared among ``world`` ranks."""
    per = -(-num_rows // world)
    return range(min(rank * per, num_rows), min((rank + 1) * per, num_rows))


class SplitImages(ImageRows):
    """Images of one split; an item is a position, or (position, flip) for training, or
    (position, flip, strong seed) for IGNORE's training.

    Yields ``(uint8 image (3, s, s), position, ok)``; the flip is applied after the resize (and
    crop), as the protocol's transform does (Resize, then RandomHorizontalFlip). With a strong
    seed: ``(image, strong view, position, ok)``, the strong view made from the resized image
    before the plain view's flip (:func:`strong_view`; the authors apply RandAugment before
    their resize).
    """

    def __init__(self, data: FinetuneData, split: ImageSplit, image_size: int,
                 preprocess: Preprocess = PROTOCOL):
        super().__init__(data.root, data.relpaths, image_size, rows=split.rows,
                         preprocess=preprocess)

    def __getitem__(self, item: int | tuple[int, bool] | tuple[int, bool, int]
                    ) -> tuple[Tensor, int, bool] | tuple[Tensor, Tensor, int, bool]:
        position, flip, *strong = item if isinstance(item, tuple) else (item, False)
        image, _, ok = super().__getitem__(position)
        plain = image.flip(-1) if flip else image
        if strong:
            return plain, strong_view(image, strong[0]), position, ok
        return plain, position, ok


def make_loader(data: FinetuneData, split: ImageSplit, image_size: int,
                batch_sampler: Iterable[list],
                workers: int, device: torch.device, batch_size: int, persistent: bool = False,
                ranks_here: int = 1, preprocess: Preprocess = PROTOCOL,
                prefetch: int = 4) -> DataLoader:
    """A DataLoader over ``split`` driven by ``batch_sampler`` (lists of at most ``batch_size``
    items): ``prefetch`` batches in flight per worker, fewer when ``/dev/shm`` is small."""
    views = 2 if getattr(batch_sampler, "strong", False) else 1  # IGNORE's strong views
    loaded = loader_prefetch(views * uint8_batch_bytes(batch_size, image_size), workers, prefetch,
                               ranks_here, what=f"{split.name} batches of {plural(batch_size, 'image')} at "
                                                f"{image_size} px")
    return DataLoader(
        SplitImages(data, split, image_size, preprocess), batch_sampler=batch_sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda", worker_init_fn=worker_init,
        persistent_workers=persistent and workers > 0, prefetch_factor=loaded,
    )


def eval_batches(num_rows: int, batch_size: int, rank: int = 0, world: int = 1) -> list[list[int]]:
    """Consecutive batches over this rank's shard of a split (every example, none dropped)."""
    mine = shard_range(num_rows, rank, world)
    return [list(mine[i:i + batch_size]) for i in range(0, len(mine), batch_size)]
