"""Reading the files featcache writes with ``torch.save`` (runs' ``best.pt``, checkpoints):
checked, and never unpickled beyond tensors and plain values.

``torch.save`` writes a zip archive whose members each carry a CRC-32 of their bytes, but
``torch.load`` never checks them: a best.pt whose bytes changed on disk loaded as other
weights. :func:`load_checked` checks every member first (as ``unzip -t`` does) and refuses a
damaged file in one line naming it, the part that fails and how to make it again. Files
written without checksums (PyTorch's ``compute_crc32`` off: CRC fields 0) are read unchecked.

A file that is no zip archive (cut short, overwritten) is refused as truncated or corrupt. It
is then loaded with ``weights_only=True``: a file holding other objects (a crafted pickle that
would run code) is refused in one line naming the file, what it holds and why, instead of
PyTorch's paragraph that ends in a URL.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

from featcache.errors import InputError

READ_BLOCK = 1 << 20


def damaged_member(path: str | os.PathLike) -> str | None:
    """The first member of the zip archive ``path`` whose bytes fail their CRC-32 (None when
    every member with a checksum passes). Not a zip archive (a legacy ``torch.save`` file): None,
    and :func:`load_checked` says so."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError):
        return None
    with archive:
        for member in archive.infolist():
            if member.CRC == 0 and member.file_size:  # written without checksums
                continue
            try:
                with archive.open(member) as handle:  # checks the CRC-32 at the end
                    while handle.read(READ_BLOCK):
                        pass
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError):
                return member.filename
    return None


def load_checked(path: str | os.PathLike, remake: str) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU after :func:`damaged_member`; every
    failure is one :class:`InputError` line naming the file (``remake``: how to make it again,
    e.g. "train the run again: `featcache train-linear ... --overwrite`")."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} does not exist; {remake}")
    if not zipfile.is_zipfile(path):  # torch.save writes zip archives; a file cut short is none
        raise InputError(f"{path} could not be loaded (truncated or corrupt?): it is not the zip "
                         f"archive torch.save writes; {remake}")
    member = damaged_member(path)
    if member is not None:
        raise InputError(f"{path} is damaged: its part {member} fails its checksum (its bytes "
                         "changed after it was written: a failing disk or an incomplete copy); "
                         f"{remake}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(exc))))
        named = f" ({', '.join(found)})" if found else ""
        raise InputError(f"{path} was refused: it holds objects other than tensors and plain "
                         f"values{named}, which featcache never unpickles; use a file written by "
                         f"featcache ({remake})") from None
    except Exception as exc:  # torch raises several types for corrupt files
        raise InputError(f"{path} could not be loaded (truncated or corrupt?): "
                         f"{_first_line(exc)}; {remake}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
