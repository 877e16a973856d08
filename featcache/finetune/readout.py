"""The loss shown on stage three's progress bar, read without making the host wait."""

from __future__ import annotations

import torch
from torch import Tensor


class LossReadout:
    """The loss for the progress bar, read without making the host wait for the device.

    On a GPU the value is copied to pinned host memory asynchronously and shown once the copy
    has finished (a later step's bar shows it); on the CPU it is read at once.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.value: float | None = None
        self.host = torch.zeros((), dtype=torch.float32, pin_memory=self.cuda)
        self.pending: torch.cuda.Event | None = None

    def update(self, loss: Tensor) -> float | None:
        """Start reading ``loss``; the latest value that has arrived (None before the first)."""
        if not self.cuda:
            self.value = float(loss)
            return self.value
        if self.pending is not None and self.pending.query():
            self.value, self.pending = float(self.host), None
        if self.pending is None:
            self.host.copy_(loss.detach().float(), non_blocking=True)
            self.pending = torch.cuda.Event()
            self.pending.record()
        return self.value
