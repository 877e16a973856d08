"""Images that cannot be read: refused early (missing files) or at the first bad batch, or,
with ``--skip-bad``, flagged with NaN features and a reason recorded in the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from featcache.data.images import image_problem
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError, plural
from featcache.features.options import ExtractOptions


class BadImages:
    """The bad-image handling of an :class:`~featcache.features.extraction.Extraction`."""

    options: ExtractOptions
    labels: LabelSet
    images: np.ndarray
    num_train: int

    def stop_on_bad(self, batch_rows: torch.Tensor, ok: torch.Tensor, root: Path) -> None:
        if self.options.skip_bad or bool(ok.all()):
            return
        row = int(batch_rows[~ok][0])
        raise InputError(f"{self.bad_reason(root, row)['message']}. Fix or replace the file, "
                         "or pass --skip-bad to flag it (NaN features) and carry on")

    def bad_reason(self, root: Path, row: int) -> dict:
        split, index = self.split_row(row)
        path = root / str(self.images[row])
        reason = image_problem(path) or "the device JPEG decoder could not decode it"
        if reason == "file does not exist" and self.labels.provenance.get("labels_only"):
            reason += (f" ({self.labels.path} was prepared with labels_only: its images were never "
                       "checked; point --images-root at the folder that holds them)")
        return {"split": split, "row": index, "image": str(self.images[row]), "reason": reason,
                "message": f"cannot read image {path} ({split} row {index} of {self.labels.path}): {reason}"}

    def check_present(self, root: Path, rows: list[int]) -> None:
        """Fail early, before hours of work, when images are missing (unless ``skip_bad``)."""
        if self.options.skip_bad:
            return
        missing = [row for row in rows if not (root / str(self.images[row])).is_file()]
        if missing:
            first = self.bad_reason(root, missing[0])["message"]
            raise InputError(f"{len(missing)} of {plural(len(rows), 'image')} are missing; first: {first}. "
                             "Check --images-root, or pass --skip-bad to flag them and carry on")

    def bad_entries(self, reasons: dict[int, str]) -> list[dict]:
        """The ``bad_images`` entries of a chunk's bad rows (global row -> reason)."""
        out = []
        for row, reason in sorted(reasons.items()):
            split, index = self.split_row(row)
            out.append({"split": split, "row": index, "image": str(self.images[row]),
                        "reason": reason})
        return out

    def split_row(self, row: int) -> tuple[str, int]:
        return ("train", row) if row < self.num_train else ("test", row - self.num_train)
