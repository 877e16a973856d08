"""Paper tables rebuilt from ``results.json`` files: losses as rows, datasets as columns.

Every cell is the test mAP of one loss on one dataset: the mean and standard deviation over
the seeds of every run found for it (``--seeds 0,1,2`` in one run, or one run per seed), with
the configuration each seed selected kept beside it, so that the table, the configurations and
the console always tell the same story. Where the protocol has a published number
(:mod:`featcache.published`) it sits beside ours with the difference. The caption says what
the numbers are: stage, datasets, backbone and weights, the protocol's grid and epochs, the
validation labels that selected, the seeds. Classes without a test positive (AP 0 by the
protocol) are named in the notes.

``featcache table`` and the pipeline reports both build their tables here; the renderers are
:class:`featcache.tables.Table`'s (Markdown, CSV, LaTeX) and :meth:`ResultsTable.to_json`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featcache.errors import InputError, plural
from featcache.protocol.catalog import loss_names
from featcache.protocol.coverage import name_list
from featcache.protocol.numerics import outdated_note
from featcache.protocol.runs import RESULTS, describe_differences, load_results
from featcache.protocol.table_cells import Cell, seed_choices
from featcache.published import SOURCES, published
from featcache.tables import Estimate, Table

STAGES = {"linear": "linear heads on cached features (stage two)",
          "finetune": "networks fine-tuned end to end (stage three)"}


# ------------------------------------------------------------------------------ reading runs
def find_results(paths: Iterable[str | Path]) -> list[Path]:
    """The ``results.json`` files named by ``paths``: run folders, results files, or folders
    searched recursively (``cache/voc/runs``). A path with none is refused, naming it."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file() and path.name == RESULTS:
            hits = [path]
        elif path.is_dir():
            hits = [path / RESULTS] if (path / RESULTS).is_file() else sorted(path.rglob(RESULTS))
        else:
            raise InputError(f"{path} is neither a run folder nor a folder of runs (it does not "
                             "exist or is not a directory)")
        if not hits:
            raise InputError(f"{path} holds no finished run (no {RESULTS} in it or below it)")
        seen = {p.resolve() for p in found}
        found += [hit for hit in hits if hit.resolve() not in seen]
    return found


def _latest_runs(documents: list[tuple[dict, Path, bool]], chosen: list[str]
                 ) -> list[tuple[dict, Path, bool]]:
    """Of the runs found by searching a folder, the latest of each stage, loss and dataset
    (runs named one by one are all kept); ``chosen`` gets a line for each choice made."""
    groups: dict[tuple[str, str, str] | int, list[tuple[dict, Path, bool]]] = {}
    for entry in documents:
        document, _, named = entry
        key = ((document.get("stage", "linear"), document["loss"], document["dataset"])
               if not named else id(entry))
        groups.setdefault(key, []).append(entry)
    kept = []
    for runs in groups.values():
        latest = max(runs, key=lambda e: (str(e[0].get("created", "")), e[1].stat().st_mtime))
        kept.append(latest)
        if len(runs) > 1:  # runs found by searching: one loss on one dataset
            others = ", ".join(sorted(e[1].parent.name for e in runs if e is not latest))
            chosen.append(f"{latest[0]['loss']} on {latest[0]['dataset']}: the latest of {plural(len(runs), 'run')}, "
                          f"{latest[1].parent.name} (not {others}; --run-id ID takes another, "
                          "--all-runs pools them)")
    return kept


def _comparable(settings: dict) -> dict:
    """Settings that must agree for runs to share a cell (seeds may differ)."""
    return {k: v for k, v in settings.items() if k not in ("seeds", "seed")}


@dataclass
class ResultsTable:
    """Cells of losses x datasets of one stage, built from results documents."""

    stage: str
    losses: list[str]
    datasets: list[str]
    cells: dict[tuple[str, str], Cell]
    #: which run was taken where a searched folder held several of one loss (see from_paths)
    chosen: list[str] = field(default_factory=list)

    @classmethod
    def from_documents(cls, documents: Sequence[tuple[str, dict]],
                       datasets: Sequence[str] | None = None,
                       losses: Sequence[str] | None = None) -> ResultsTable:
        """Group (run name, results document) pairs into cells; runs of one loss and dataset
        pool their seeds (their settings must otherwise agree, and no seed may repeat)."""
        if not documents:
            raise InputError("no finished runs to tabulate")
        stages = sorted({d.get("stage", "linear") for _, d in documents})
        if len(stages) > 1:
            raise InputError("these runs mix stages (" + ", ".join(stages) + "): tabulate linear "
                             "and fine-tuned runs separately")
        stage = stages[0]
        cells: dict[tuple[str, str], Cell] = {}
        first_run: dict[tuple[str, str], tuple[str, dict]] = {}
        for run, document in documents:
            key = (document["loss"], document["dataset"])
            choices = seed_choices(document, run)
            if key not in cells:
                setting = "linear" if stage == "linear" else document.get("published", {}).get(
                    "setting", "finetune")
                cells[key] = Cell(key[0], key[1], [], published(setting, *key))
                first_run[key] = (run, _comparable(document.get("settings", {})))
            cell = cells[key]
            other_run, other = first_run[key]
            mine = _comparable(document.get("settings", {}))
            if mine != other:
                raise InputError(f"runs {other_run} and {run} ({key[0]} on {key[1]}) were made "
                                 f"with different settings ({describe_differences(other, mine)}); "
                                 "a table cell pools seeds of the same configuration only: name "
                                 "one of them")
            repeated = {c.seed for c in choices} & {c.seed for c in cell.seeds}
            if repeated:
                raise InputError(f"seed {min(repeated)} of {key[0]} on {key[1]} appears in both "
                                 f"{other_run} and {run}; name one of them")
            cell.seeds += choices
            cell.documents.append(document)
        order = {"zero-shot": -1, **{name: i for i, name in enumerate(loss_names())}}
        found_losses = sorted({k[0] for k in cells}, key=lambda n: (order.get(n, len(order)), n))
        found_datasets = sorted({k[1] for k in cells})
        return cls(stage, list(losses or found_losses), list(datasets or found_datasets), cells)

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path], run_id: str | None = None,
                   all_runs: bool = False) -> ResultsTable:
        """The finished runs under ``paths`` (see :func:`find_results`).

        Run folders named in ``paths`` are all taken. Where a searched folder (``cache/voc/runs``)
        holds several runs of one loss and dataset, the latest (by its results' ``created``
        time) is taken and :attr:`chosen` says so; ``run_id`` takes only the runs of that id,
        ``all_runs`` every run (their seeds pooled, as for runs named one by one).
        """
        documents: list[tuple[dict, Path, bool]] = []
        paths = list(paths)
        for raw in paths:
            for path in find_results([raw]):
                if path.resolve() in (p.resolve() for _, p, _ in documents):
                    continue
                document = load_results(path.parent)
                named = Path(raw).resolve() in (path.parent.resolve(), path.resolve())
                documents.append((document, path, named))
        if run_id is not None:
            documents = _of_run_id(documents, paths, run_id)
        chosen: list[str] = []
        if run_id is None and not all_runs:
            documents = _latest_runs(documents, chosen)
        table = cls.from_documents([(str(p.parent), d) for d, p, _ in documents])
        table.chosen = chosen
        return table

    # ------------------------------------------------------------------ the main table
    def published_datasets(self) -> list[str]:
        """Datasets where at least one loss has a published number."""
        return [d for d in self.datasets
                if any(c.published is not None for (_, ds), c in self.cells.items() if ds == d)]

    def table(self) -> Table:
        """The display table (Markdown, LaTeX): mean +- sd, published and difference, the best
        mean per dataset in bold, the caption and notes."""
        values = {key: (cell.estimate, cell.published, cell.delta)
                  for key, cell in self.cells.items()}
        return display_table(self.losses, self.datasets, values, self.caption(), self.notes())

    def best_cells(self, columns: Sequence[str]) -> set[tuple[int, int]]:
        """(row, column) of the best mean of each dataset, its column found in ``columns``."""
        means = {key: cell.estimate.mean for key, cell in self.cells.items()}
        return best_cells(self.losses, self.datasets, means, columns)

    def flat_table(self) -> Table:
        """The same numbers as plain columns (CSV): mean, sd, seeds, published, delta."""
        columns = ["loss"]
        for dataset in self.datasets:
            columns += [dataset, f"{dataset} sd", f"{dataset} seeds", f"{dataset} published",
                        f"{dataset} delta"]
        table = Table(columns)
        for loss in self.losses:
            row: list = [loss]
            for dataset in self.datasets:
                cell = self.cells.get((loss, dataset))
                if cell is None:
                    row += [None] * 5
                else:
                    value = cell.estimate
                    row += [value.mean, value.sd, value.n, cell.published, cell.delta]
            table.add(*row)
        return table

    def configurations(self, runs: bool = True) -> Table:
        """Each seed's selected configuration and numbers (what every cell averages), with the
        run folder each came from unless ``runs`` is False (LaTeX: too wide for a page)."""
        columns = ["loss", "dataset", "seed", "lr", "batch", "epoch", "params", "val mAP",
                   "test mAP"] + (["run"] if runs else [])
        table = Table(columns, title="Selected configuration of each seed",
                      latex_columns={"params": "p{5.5cm}"})
        for loss in self.losses:
            for dataset in self.datasets:
                cell = self.cells.get((loss, dataset))
                for choice in [] if cell is None else cell.seeds:
                    params = ", ".join(f"{k}={v:g}" for k, v in choice.params.items()) or "-"
                    lr = "-" if choice.lr is None else f"{choice.lr:g}"  # None: zero-shot
                    table.add(loss, dataset, choice.seed, lr, choice.batch_size,
                              choice.epoch, params, choice.val_map, choice.test_map,
                              *([choice.run] if runs else []))
        return table

    def per_class(self, dataset: str) -> Table:
        """Per-class test AP of every loss on ``dataset``: classes as rows, losses as columns,
        the best loss per class in bold."""
        losses = [loss for loss in self.losses if (loss, dataset) in self.cells]
        values = {loss: self.cells[(loss, dataset)].per_class() for loss in losses}
        classes = next((list(v[0]) for v in values.values() if v[0]), [])
        missing = set().union(*(self.cells[(loss, dataset)].classes_without_positives
                                for loss in losses)) if losses else set()
        notes = [f"{loss}: per-class AP of the best seed only (its run predates per-seed "
                 "per-class records)" for loss, (_, complete) in values.items() if not complete]
        if missing:
            notes.append("classes marked * have no positive in the test split: AP 0 by the "
                         "protocol's convention")
        table = Table(["class", *losses], caption=self.caption(
            f"Per-class test AP (%) of {STAGES.get(self.stage, self.stage)} on {dataset}",
            "best loss per class in bold"), notes=notes)
        for row, name in enumerate(classes):
            cells = [values[loss][0].get(name) for loss in losses]
            table.add(name + (" *" if name in missing else ""), *cells)
            present = [c.mean for c in cells if c is not None]
            if present:
                table.bold |= {(row, 1 + i) for i, c in enumerate(cells)
                               if c is not None and c.mean == max(present)}
        return table

    def per_class_flat(self) -> Table:
        """Per-class test AP as plain columns (CSV): dataset, class, loss, mean, sd, seeds."""
        table = Table(["dataset", "class", "loss", "mean", "sd", "seeds", "test positives"])
        for dataset in self.datasets:
            for loss in self.losses:
                cell = self.cells.get((loss, dataset))
                if cell is None:
                    continue
                missing = cell.classes_without_positives
                for name, value in cell.per_class()[0].items():
                    table.add(dataset, name, loss, value.mean, value.sd, value.n,
                              name not in missing)
        return table

    # ------------------------------------------------------------------ what it says
    def caption(self, what: str | None = None, bold: str = "best mean per dataset in bold") -> str:
        """What the numbers are: stage, data, backbone, weights, protocol, validation, seeds."""
        documents = [d for c in self.cells.values() for d in c.documents]
        seeds = sorted({s.seed for c in self.cells.values() for s in c.seeds})
        counts = sorted({c.estimate.n for c in self.cells.values()})
        parts = [what or (f"Test mAP (%) of {STAGES.get(self.stage, self.stage)} on "
                          f"{', '.join(self.datasets)}")]
        inputs = _distinct(_input_text(d) for d in documents)
        parts.append("inputs: " + "; ".join(inputs))
        protocols = _distinct(_protocol_text(d) for d in documents)
        parts.append("protocol: " + "; ".join(protocols))
        if max(counts) > 1:
            parts.append(f"mean ± sd over seeds {', '.join(map(str, seeds))} "
                         f"({'/'.join(map(str, counts))} per cell)")
        else:
            parts.append(f"one seed ({', '.join(map(str, seeds))})")
        with_published = self.published_datasets()
        if with_published:
            source = SOURCES["linear" if self.stage == "linear" else "finetune"]
            parts.append(f"published: {source}; delta = ours - published")
        parts.append(bold)
        return ". ".join(part[:1].upper() + part[1:] for part in parts) + "."

    def notes(self) -> list[str]:
        """Footnotes: classes scored AP 0 for lack of test positives, runs made under another
        numerics version than this featcache's."""
        notes = []
        outdated = outdated_note(
            (f"{loss} on {dataset}", document)
            for (loss, dataset), cell in sorted(self.cells.items()) for document in cell.documents)
        if outdated:
            notes.append(outdated)
        for dataset in self.datasets:
            found: dict[str, None] = {}  # ordered, and a constant-time test (100,000 classes)
            for (_, ds), cell in self.cells.items():
                if ds == dataset:
                    found.update(dict.fromkeys(cell.classes_without_positives))
            missing = list(found)
            if missing:
                many = len(missing) > 1
                notes.append(f"{dataset}: {len(missing)} class{'es have' if many else ' has'} no "
                             f"positive in the test split ({name_list(missing)}); "
                             f"{'they count' if many else 'it counts'} as AP 0 in every number, "
                             "as in the reference code")
        return notes

    def to_json(self, per_class: bool = False) -> dict:
        """Everything in the table, with each seed's selection (``--format json``)."""
        rows = []
        for loss in self.losses:
            row: dict = {"loss": loss}
            for dataset in self.datasets:
                cell = self.cells.get((loss, dataset))
                row[dataset] = None if cell is None else cell.to_json()
            rows.append(row)
        out: dict[str, object] = {
            "caption": self.caption(), "stage": self.stage, "datasets": self.datasets,
            "losses": self.losses, "notes": self.notes(), "rows": rows}
        if per_class:
            out["per_class"] = {dataset: self.per_class(dataset).records()
                                for dataset in self.datasets}
        return out


#: a cell of the display table: the estimate over seeds, the published number, the difference
CellValues = tuple[Estimate, float | None, float | None]


def display_table(losses: Sequence[str], datasets: Sequence[str],
                  values: Mapping[tuple[str, str], CellValues], caption: str,
                  notes: Sequence[str]) -> Table:
    """Losses as rows, datasets as columns (with published and delta columns where a dataset
    has a published number), the best mean per dataset in bold."""
    with_published = [d for d in datasets
                      if any(v[1] is not None for (_, ds), v in values.items() if ds == d)]
    columns = ["loss"]
    for dataset in datasets:
        columns.append(dataset)
        if dataset in with_published:
            columns += [f"{dataset} published", f"{dataset} delta"]
    table = Table(columns, caption=caption, notes=list(notes))
    for loss in losses:
        row: list = [loss]
        for dataset in datasets:
            found = values.get((loss, dataset))
            row.append(None if found is None else found[0])
            if dataset in with_published:
                row += [None, None] if found is None else [found[1], found[2]]
        table.add(*row)
    means = {key: found[0].mean for key, found in values.items()}
    table.bold = best_cells(losses, datasets, means, columns)
    return table


def best_cells(losses: Sequence[str], datasets: Sequence[str],
               means: Mapping[tuple[str, str], float], columns: Sequence[str]
               ) -> set[tuple[int, int]]:
    """(row, column) of the best mean of each dataset, its column found in ``columns``."""
    bold = set()
    for dataset in datasets:
        column = list(columns).index(dataset)
        found = [(means[(loss, dataset)], i) for i, loss in enumerate(losses)
                 if (loss, dataset) in means]
        if found:
            best = max(m for m, _ in found)
            bold |= {(i, column) for m, i in found if m == best}
    return bold


def table_from_json(document: Mapping) -> Table:
    """The display table of :meth:`ResultsTable.table` rebuilt from :meth:`ResultsTable.to_json`
    (a pipeline's results.json): the same Markdown, without the runs."""
    values: dict[tuple[str, str], CellValues] = {}
    for row in document["rows"]:
        for dataset in document["datasets"]:
            cell = row.get(dataset)
            if cell is not None:
                values[(row["loss"], dataset)] = (
                    Estimate(cell["mean"], cell["sd"], cell["seeds"]), cell.get("published"),
                    cell.get("delta"))
    return display_table(document["losses"], document["datasets"], values,
                         document["caption"], document.get("notes", []))


def _distinct(texts: Iterable[str]) -> list[str]:
    out: list[str] = []
    for text in texts:
        if text and text not in out:
            out.append(text)
    return out


def _input_text(document: dict) -> str:
    """``scene: resnet50 features, random weights, 224 px`` for one run."""
    dataset = document.get("dataset", "?")
    if document.get("stage") == "finetune":
        backbone = document.get("backbone", {})
        return (f"{dataset}: {backbone.get('name')} ({backbone.get('weights')} weights, "
                f"{backbone.get('image_size')} px)")
    features = document.get("features", {})
    weights = features.get("weights")
    return (f"{dataset}: {features_text(features)}"
            + (f" ({weights} weights)" if weights and weights != "none" else ""))


def features_text(features: dict) -> str:
    """``2048-d resnet50 features``, or for a spatial file's maps ``3x3x2048 resnet50 feature
    maps`` (their rows are 18432 numbers, but not 18432-d features)."""
    shape = features.get("spatial_shape")
    if features.get("layout") == "spatial" and shape:
        return f"{'x'.join(map(str, shape))} {features.get('backbone')} feature maps"
    return f"{features.get('dim')}-d {features.get('backbone')} features"


def _protocol_text(document: dict) -> str:
    """The grid, epochs and selection of one run."""
    protocol = document.get("protocol", {})
    if protocol.get("training") == "none":
        return "zero-shot: cosine between image and class-prompt embeddings, no training"
    grid = document.get("grid", {})
    lrs = ", ".join(f"{x:g}" for x in grid.get("lr", []))
    batches = ", ".join(map(str, grid.get("batch_size", [])))
    variant = protocol.get("val_variant", "clean")
    epochs = protocol.get("epochs")
    text = (f"Adam, lr {{{lrs}}} x batch {{{batches}}}, {epochs} epoch{'s' if epochs != 1 else ''}"
            f", best epoch and configuration by {variant} validation mAP")
    if document.get("stage") == "finetune":
        start = "LinearInit" if document.get("init", {}).get("mode") == "linear" else "a fresh head"
        text += f", from {start}, head lr x{protocol.get('head_lr_mult', 1):g}"
    if protocol.get("early_stop", "none") != "none":
        text += f", early stopping '{protocol['early_stop']}'"
    return text


def _of_run_id(documents: list[tuple[dict, Path, bool]], paths: list[str | Path],
               run_id: str) -> list[tuple[dict, Path, bool]]:
    """The runs of ``run_id``; every folder searched must hold one (a folder without it would
    leave its column out silently), else one error naming the folder and its run ids."""
    def under(raw: str | Path, path: Path) -> bool:
        root = Path(raw).resolve()
        return path.resolve() == root or root in path.resolve().parents

    for raw in paths:
        found = sorted({p.parent.name for _, p, _ in documents if under(raw, p)})
        if run_id not in found:
            there = f"run ids there: {', '.join(found)}" if found else "no finished run there"
            others = "" if len(paths) == 1 else "; leave the folder out or finish that run"
            raise InputError(f"no run with id {run_id!r} under {raw} ({there}){others}")
    return [entry for entry in documents if entry[1].parent.name == run_id]
