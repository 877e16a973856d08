"""Class-prompt text embeddings for vision-language backbones (``featcache features --text``).

Each class name is put into every prompt template (``"a photo of a {}."``, AEVLP's, by
default); the text tower embeds each prompt, the embeddings are L2-normalised, averaged over
the templates and normalised again (CLIP's prompt ensembling; one template gives its
normalised embedding). Class names are the labels file's with ``_`` read as a space (as AEVLP
does), or the lines of a ``--class-names`` file. ``--text-embeddings FILE.npy`` stores given
embeddings (L x E, classes in the labels file's order: VLPL ships such files) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from featcache.data.formats.npz import load_numpy
from featcache.errors import InputError, OptionError, plural
from featcache.fileio import sha256_file

DEFAULT_TEMPLATES = ("a photo of a {}.",)


def check_templates(templates: Sequence[str]) -> tuple[str, ...]:
    """Templates with exactly one ``{}`` each; the error names the bad one."""
    templates = tuple(templates) or DEFAULT_TEMPLATES
    for template in templates:
        if template.count("{}") != 1:
            raise OptionError(f"--prompt {template!r} must contain the class name placeholder {{}} "
                              "exactly once, e.g. 'a photo of a {}.'")
    return templates


def prompt_class_names(classes: Sequence[str], names_file: str | Path | None = None) -> list[str]:
    """The names put in the prompts: the file's lines (one per class), else ``_`` -> space."""
    if names_file is None:
        return [str(c).replace("_", " ") for c in classes]
    path = Path(names_file)
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise InputError(f"cannot read --class-names file {path}: {exc}") from exc
    lines = [line for line in lines if line]
    if len(lines) != len(classes):
        raise InputError(f"--class-names file {path} has {plural(len(lines), 'name')} but the labels file "
                         f"has {plural(len(classes), 'class', 'classes')}; give one name per line, in the labels "
                         f"file's order ({', '.join(map(str, classes[:3]))}, ...)")
    return lines


def encode_classes(tower, names: Sequence[str], templates: Sequence[str],
                   device: torch.device) -> np.ndarray:
    """(L, E) float32: per class, the normalised mean of its normalised prompt embeddings."""
    tower = tower.to(device)
    rows = []
    for name in names:
        embedded = tower([template.format(name) for template in templates])
        embedded = torch.nn.functional.normalize(embedded.float(), dim=-1).mean(dim=0)
        rows.append(torch.nn.functional.normalize(embedded, dim=0))
    return torch.stack(rows).cpu().numpy().astype(np.float32)


def load_given_embeddings(path: str | Path, num_classes: int, dim: int) -> tuple[np.ndarray, str]:
    """An (L, E) ``.npy`` of class embeddings, checked and normalised; returns it and its sha256."""
    path = Path(path)
    array = load_numpy(path, "--text-embeddings array (an .npy of L x E floats)")
    if not isinstance(array, np.ndarray):
        raise InputError(f"--text-embeddings {path} is a .npz archive; give an .npy of L x E floats")
    if array.ndim != 2 or array.shape != (num_classes, dim):
        raise InputError(f"--text-embeddings {path} has shape {array.shape}; expected "
                         f"({num_classes}, {dim}): one row per class of the labels file, as wide "
                         "as the backbone's image embedding")
    array = array.astype(np.float64)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if not np.isfinite(array).all() or (norms == 0).any():
        raise InputError(f"--text-embeddings {path} holds NaN, Inf or all-zero rows")
    return (array / norms).astype(np.float32), sha256_file(path)
