"""Run folders of stages two and three: ``<cache>/<dataset>/{runs,finetune}/<loss>/<run-id>/``.

A run folder is written by one process at a time (its lock, ``.<run-id>.lock`` beside it,
:mod:`featcache.locks`, is held while the run trains). It holds ``run.json`` (the run's settings
and their fingerprint, written when it starts) and, once finished, ``results.json`` (written last, atomically: a folder without it is
an unfinished run). One fingerprint, the sha256 of the settings as canonical JSON, decides
"same settings": a finished stage-two run with the same fingerprint is reused (when it was made
under this featcache's numerics version, :mod:`featcache.protocol.numerics`), an unfinished
stage-three run with the same fingerprint is resumed, and anything else is refused with the
settings that differ.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

from featcache.errors import InputError, OutputExistsError
from featcache.fileio import write_json_atomic
from featcache.locks import OutputLock
from featcache.protocol.documents import read_results, read_run_record
from featcache.protocol.numerics import (
    NUMERICS_VERSION,
    describe_version,
    is_current,
    recorded_version,
)
from featcache.schema import MapOf, read_document

RESULTS = "results.json"
RUN_FILE = "run.json"


def new_run_id() -> str:
    """A run id from the current UTC time, e.g. ``20261122-113501``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")


def fingerprint(settings: dict) -> str:
    """sha256 of ``settings`` as canonical JSON: equal exactly when the settings are."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def describe_differences(old: dict, new: dict) -> str:
    """``key: old -> new`` for every key whose value differs (for messages); where both values
    are mappings, their differing keys (``transform.resize: 448 -> 224``), so that values
    shortened for the message never hide the difference."""
    return "; ".join(_differences(old, new)) or "no differences"


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    parts = []
    for key in sorted(set(old) | set(new), key=str):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):
            parts += _differences(before, after, f"{prefix}{key}.")
        else:
            parts.append(f"{prefix}{key}: {_short(before)} -> {_short(after)}")
    return parts


def _short(value) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def rerun_advice(run_dir: Path) -> str:
    """How to train the run in ``run_dir`` again: its recorded command line with its run id
    and ``--overwrite`` when it was a ``featcache train-linear`` or ``finetune`` command, else
    in words."""
    run_dir = Path(run_dir)
    try:
        recorded = (read_json(run_dir / RESULTS) or {}).get("command")
    except (InputError, AttributeError):  # damaged: its command cannot be trusted either
        recorded = None
    argv = (list(recorded) if isinstance(recorded, list)
            and all(isinstance(word, str) for word in recorded) else [])
    if (len(argv) > 1 and Path(argv[0]).name in ("featcache", "__main__.py", "cli.py")
            and argv[1] in ("train-linear", "finetune")):
        words = ["featcache", *(a for a in argv[1:] if a not in ("--resume", "--overwrite"))]
        if "--loss" in words[:-1] and "," in words[words.index("--loss") + 1]:
            words[words.index("--loss") + 1] = run_dir.parent.name  # this run's loss alone
        if "--run-id" not in words:
            words += ["--run-id", run_dir.name]
        return f"train the run again: `{shlex.join([*words, '--overwrite'])}`"
    return (f"train the run again with the command that made it, with --run-id {run_dir.name} "
            "--overwrite")


def read_json(path: Path, advice: str = "") -> dict | None:
    """A JSON object's content, None when the file does not exist; an InputError when it is
    damaged or not an object (the schema of each of featcache's own documents is checked by
    :mod:`featcache.protocol.documents`)."""
    return read_document(path, MapOf(), "JSON object file", advice.removeprefix("; "))


class RunFolder:
    """One run's folder and the settings it was started with."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def finished(self) -> bool:
        return (self.path / RESULTS).is_file()

    def results(self) -> dict:
        """The finished run's results.json, checked; the error says when the run is not
        finished, or what is wrong with the file."""
        document = read_results(self.path / RESULTS, lambda: rerun_advice(self.path))
        if document is None:
            raise InputError(f"{self.path} is not a finished run (no {RESULTS})")
        return document

    def settings(self) -> dict | None:
        """The settings the run was started with (None when it records none)."""
        record = read_run_record(self.path / RUN_FILE)
        return None if record is None else record["settings"]

    def same_settings(self, settings: dict) -> bool:
        record = read_run_record(self.path / RUN_FILE) or {}
        return record.get("fingerprint") == fingerprint(settings)

    def differences(self, settings: dict) -> str:
        stored = self.settings()
        if stored is None:
            return "it records no settings (made by an older featcache?)"
        return describe_differences(stored, settings)

    def lock(self, advice: str = "wait for it to finish, or choose another --run-id") -> OutputLock:
        """The lock of this folder (:mod:`featcache.locks`; not yet acquired)."""
        return OutputLock(self.path, advice)

    def start(self, settings: dict, fresh: bool = False) -> RunFolder:
        """Create the folder (emptied first when ``fresh``) and record ``settings`` in run.json."""
        if fresh and self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path / RUN_FILE,
                          {"settings": settings, "fingerprint": fingerprint(settings)})
        return self

    def require_same(self, settings: dict, action: str) -> None:
        """Refuse to ``action`` (resume, reuse) a run started with other settings."""
        if not self.same_settings(settings):
            raise OutputExistsError(
                f"cannot {action} {self.path}: it was started with other settings "
                f"({self.differences(settings)}); use the same options, --overwrite to replace it, "
                "or another --run-id")


def open_finished_or_new(path: Path, settings: dict, overwrite: bool,
                         say: Callable[[str], None] | None = None) -> tuple[RunFolder, bool]:
    """Stage two's rule: (the folder, True) to reuse a finished run with the same settings made
    under this featcache's numerics version; (the folder, False) to train it (new, unfinished,
    ``overwrite``, or finished under another numerics version: ``say`` is told); else refused."""
    folder = RunFolder(path)
    if folder.finished and not overwrite:
        folder.require_same(settings, "reuse")
        document = folder.results()
        if is_current(document):
            return folder, True
        if say is not None:
            say(f"{folder.path}: finished with {describe_version(recorded_version(document))}, not "
                f"this featcache's ({NUMERICS_VERSION}); training it again")
        return folder.start(settings, fresh=True), False
    return folder.start(settings, fresh=overwrite), False


def load_results(run_dir: Path) -> dict:
    """A finished run's results.json (the error says when the run is not finished)."""
    return RunFolder(run_dir).results()


def finished_runs(root: Path) -> list[Path]:
    """Finished run folders directly under ``root``, oldest name first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / RESULTS).is_file())


def latest_unfinished(root: Path, kind: str = "fine-tuning") -> Path:
    """The newest ``kind`` run folder under ``root`` that was started but not finished."""
    candidates = sorted(p for p in root.glob("*") if p.is_dir() and (p / RUN_FILE).is_file()
                        and not (p / RESULTS).is_file()) if root.is_dir() else []
    if not candidates:
        raise InputError(f"no unfinished {kind} run to resume in {root}; start one without "
                         "--resume")
    return max(candidates, key=lambda p: (p / RUN_FILE).stat().st_mtime)


def best_run(root: Path, labels_sha256: str | None = None,
             accept: Callable[[dict], bool] | None = None) -> Path:
    """The finished run with the highest selected validation mAP (newest on ties).

    With ``labels_sha256``, runs built on other labels are passed over; so are runs whose
    results document ``accept`` (when given) returns False for.
    """
    candidates = []
    for run_dir in finished_runs(root):
        document = RunFolder(run_dir).results()
        if labels_sha256 and document.get("labels", {}).get("sha256") != labels_sha256:
            continue
        if accept is not None and not accept(document):
            continue
        selection = document["selection"]
        score = selection.get("val_map")
        if score is None:
            score = selection.get("val_map_observed", float("-inf"))
        candidates.append((score, document.get("created", ""), run_dir))
    if not candidates:
        raise InputError(f"no finished linear run in {root}")
    return max(candidates)[2]
