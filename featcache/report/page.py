"""The report page: one self-contained HTML file for a dataset's runs.

Inline CSS, inline SVG figures, CAM figures as base64 PNG, a few lines of inline JavaScript to
sort the tables; no URL, so it opens from disk without a server or a network. Every number
links to the section of the run that made it, where the command, the settings and their
fingerprint from its ``results.json`` are shown.
"""

from __future__ import annotations

import base64
import datetime as _dt
import statistics
from collections.abc import Sequence
from pathlib import Path

from featcache import __version__
from featcache.errors import plural
from featcache.published import SOURCES
from featcache.report import uncertainty as ci
from featcache.report.groups import TableGroup, table_groups
from featcache.report.heatmap import heatmap_html
from featcache.report.html import STAGE_TITLES, command_text, esc, number
from featcache.report.label_sets import label_sets_section
from featcache.report.runcards import curves_section, run_series
from featcache.report.runs import CamFigure, Run
from featcache.report.svg import curves_svg

#: what a run of each stage is, one and several (the page's header counts them)
STAGE_RUNS = {"linear": ("linear head on cached features", "linear heads on cached features"),
              "finetune": ("network fine-tuned end to end", "networks fine-tuned end to end")}

#: the page's ``<meta name="generator">``: how ``featcache report`` knows a page it wrote
GENERATOR = "featcache report"


def _stage_count(count: int, stage: str) -> str:
    """``1 network fine-tuned end to end``, ``31 linear heads on cached features``."""
    one, several = STAGE_RUNS.get(stage, (stage, stage))
    return plural(count, one, several)


def provenance_tip(run: Run) -> str:
    """The tooltip of a number: its run, command and fingerprint."""
    return (f"{run.name}: {command_text(run.document)}; settings fingerprint "
            f"{run.document.get('fingerprint', '?')}")


# ---------------------------------------------------------------------------- loss tables
def loss_table_html(group: TableGroup, index: int, number_text: str = "") -> str:
    """A sortable loss table: mean +- sd over seeds, published and difference, val mAP, each
    seed's selected configuration linked to its run."""
    table = group.table
    dataset = table.datasets[0]
    by_name = {run.name: run for run in group.runs}
    source = SOURCES["linear" if group.stage == "linear" else "finetune"]
    head = ("<tr><th>loss</th><th>test mAP</th><th>sd</th><th>seeds</th>"
            + ci.interval_head(group) + "<th>published</th>"
            "<th>&Delta; published</th><th>val mAP</th><th>selected (per seed)</th>"
            "<th>fingerprint</th></tr>")
    rows = []
    best = max((c.estimate.mean for c in table.cells.values()), default=None)
    for loss in table.losses:
        cell = table.cells.get((loss, dataset))
        if cell is None:
            continue
        value = cell.estimate
        runs = [by_name[name] for name in dict.fromkeys(s.run for s in cell.seeds)]
        vals = [s.val_map for s in cell.seeds if s.val_map is not None]
        val = statistics.fmean(vals) if vals else None
        tip = esc("; ".join(provenance_tip(run) for run in runs))
        chosen = "<br>".join(
            f'<a href="#{by_name[s.run].anchor}">seed {s.seed}: {esc(s.describe())}</a>'
            + (f" ({esc(', '.join(f'{k}={v:g}' for k, v in s.params.items()))})"
               if s.params else "") for s in cell.seeds)
        fingerprints = "<br>".join(
            f'<code title="{esc(run.document.get("fingerprint", ""))}">'
            f'{esc(str(run.document.get("fingerprint", ""))[:12])}</code>' for run in runs)
        bold = ' class="best"' if value.mean == best else ""
        rows.append(
            f'<tr><td data-v="{esc(loss)}"><a href="#loss-{esc(loss)}">{esc(loss)}</a></td>'
            f'<td data-v="{value.mean!r}" title="{tip}"{bold}>{value.text()}</td>'
            f'<td data-v="{value.sd!r}">{number(value.sd) if value.n > 1 else ""}</td>'
            f'<td data-v="{value.n}">{value.n}</td>{ci.interval_cells(group, loss)}'
            f'<td data-v="{"" if cell.published is None else repr(cell.published)}">'
            f'{number(cell.published, 1)}</td>'
            f'<td data-v="{"" if cell.delta is None else repr(cell.delta)}"'
            f'{_delta_class(cell.delta)}>{"" if cell.delta is None else f"{cell.delta:+.2f}"}</td>'
            f'<td data-v="{"" if val is None else repr(val)}">{number(val)}</td>'
            f"<td>{chosen}</td><td>{fingerprints}</td></tr>")
    notes = "".join(f"<li>{esc(note)}</li>" for note in table.notes() + ci.interval_notes(group))
    published_note = ("" if table.published_datasets() else
                      f"<li>no published number for {esc(dataset)} ({esc(source)} covers "
                      "VOC, COCO, NUS-WIDE and CUB)</li>")
    return (f'<h3 id="table-{index}">{esc(STAGE_TITLES.get(group.stage, group.stage))}'
            f"{number_text}</h3>"
            f'<p class="caption">{esc(table.caption())} {esc(ci.interval_caption(group))} Click '
            "a column to sort; a number's tooltip names its run, command and fingerprint.</p>"
            f'<table class="sortable"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
            f"</table><ul class=\"notes\">{notes}{published_note}</ul>")


def _number_in_stage(groups: Sequence[TableGroup], index: int) -> str:
    """`` (2)`` for a stage's second table, nothing for its first."""
    count = sum(g.stage == groups[index].stage for g in groups[:index + 1])
    return "" if count == 1 else f" ({count})"


def _delta_class(delta: float | None) -> str:
    if delta is None:
        return ""
    return ' class="up"' if delta >= 0 else ' class="down"'


# ---------------------------------------------------------------------------- fine-tuning
def finetune_section(runs: Sequence[Run], every_run: Sequence[Run]) -> str:
    """Each fine-tuned run beside the linear run it started from (LinearInit)."""
    by_path = {str(run.path.resolve()): run for run in every_run}
    by_name = {run.name: run for run in every_run}
    shown = {run.name for run in runs}
    rows, figures = [], []
    for run in runs:
        if run.stage != "finetune":
            continue
        init = run.document.get("init", {})
        selection = run.document["selection"]
        if init.get("mode") != "linear":
            start_cells = "<td colspan=3>a fresh head (--init none)</td>"
            linear = None
        else:
            start_dir = Path(init.get("run_dir", ""))
            # the folder it was made from, or the same run in this cache (a moved cache)
            linear = by_path.get(str(start_dir.resolve())) or by_name.get(
                f"runs/{start_dir.parent.name}/{start_dir.name}")
            start = (f'<a href="#{linear.anchor}">{esc(linear.name)}</a>'
                     if linear is not None and linear.name in shown
                     else esc(init.get("run_dir")))
            linear_test = (linear.document["selection"]["test_map"]
                           if linear is not None else init.get("test_map"))
            start_cells = (f"<td>{start} (lr {init.get('lr', 0):g}, batch "
                           f"{init.get('batch_size')}, epoch {init.get('epoch')})</td>"
                           f"<td data-v=\"{init.get('val_map')!r}\">{number(init.get('val_map'))}</td>"
                           f'<td data-v="{linear_test!r}">{number(linear_test)}</td>')
        published = run.document.get("published", {})
        reference = published.get(published.get("setting", "finetune"))
        rows.append(f'<tr><td><a href="#{run.anchor}">{esc(run.name)}</a></td>{start_cells}'
                    f"<td data-v=\"{selection.get('val_map')!r}\">"
                    f"{number(selection.get('val_map'))}</td>"
                    f"<td data-v=\"{selection['test_map']!r}\">{number(selection['test_map'])}"
                    f"</td><td>{number(reference, 1)}</td></tr>")
        pair = []
        if linear is not None:
            pair.append(curves_svg(run_series(linear, only_selected=True),
                                   f"linear start: {linear.name} (each seed's selection)",
                                   width=420, height=260))
        pair.append(curves_svg(run_series(run), f"fine-tuned: {run.name}", width=420,
                               height=260))
        figures.append(f'<div class="pair">{"".join(pair)}</div>')
    if not rows:
        return ""
    return ('<section id="finetune"><h2>Fine-tuning beside its linear start</h2>'
            '<table class="sortable"><thead><tr><th>fine-tuned run</th><th>linear start</th>'
            "<th>start val mAP</th><th>start test mAP</th><th>fine-tuned val mAP</th>"
            "<th>fine-tuned test mAP</th><th>published</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{''.join(figures)}</section>")


# ---------------------------------------------------------------------------- CAM gallery
def cam_section(figures: Sequence[CamFigure], root: Path) -> str:
    """The CAM figures found, embedded as base64 PNG."""
    if not figures:
        return ""
    items = []
    for figure in figures:
        data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
        try:
            where = figure.path.relative_to(root)
        except ValueError:
            where = figure.path
        items.append(f'<figure><img alt="{esc(figure.title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{esc(where)}: {esc(figure.title)}; rows: "
                     f"{esc(figure.rows)}</figcaption></figure>")
    return ('<section id="cam"><h2>Class activation maps</h2><p class="caption">The figures '
            "<code>featcache cam</code> wrote under this dataset's folder.</p>"
            f'<div class="gallery">{"".join(items)}</div></section>')


# ---------------------------------------------------------------------------- the page
def render_page(dataset: str, runs: Sequence[Run], every_run: Sequence[Run],
                figures: Sequence[CamFigure], root: Path, title: str | None = None) -> str:
    """The whole HTML document."""
    groups = table_groups(runs)
    title = title or f"featcache report: {dataset}"
    stages = {run.stage for run in runs}
    created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    tables = "".join(loss_table_html(g, i, _number_in_stage(groups, i))
                     for i, g in enumerate(groups))
    heatmaps = "".join(heatmap_html(g, i, _number_in_stage(groups, i))
                       for i, g in enumerate(groups))
    finetune = finetune_section(runs, every_run)
    cams = cam_section(figures, root)
    sets = label_sets_section(groups)
    nav = [("tables", "Loss tables")] + ([("label-sets", "Label sets")] if sets else [])
    nav += [("per-class", "Per-class AP")]
    nav += [("finetune", "Fine-tuning vs linear start")] if finetune else []
    nav += [("curves", "Learning curves and provenance")]
    nav += [("cam", "Class activation maps")] if cams else []
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<meta name=\"generator\" content=\"{GENERATOR} {esc(__version__)}\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><p class=\"muted\">{plural(len(runs), 'run')} of "
        f"{esc(dataset)} ("
        + ", ".join(_stage_count(sum(r.stage == s for r in runs), s) for s in sorted(stages))
        + f"), {plural(len({r.loss for r in runs}), 'loss', 'losses')}; written {created} by "
        "featcache "
        f"{esc(__version__)} from {esc(root)}</p><nav>"
        + " · ".join(f'<a href="#{anchor}">{text}</a>' for anchor, text in nav)
        + "</nav></header>"
        f'<section id="tables"><h2>Loss tables</h2>{tables}</section>{sets}'
        f'<section id="per-class"><h2>Per-class AP</h2>{heatmaps}</section>'
        f"{finetune}"
        f'<section id="curves"><h2>Learning curves and provenance, by loss</h2>'
        f"{curves_section(runs)}</section>{cams}"
        f"<script>{SORT_JS}</script></body></html>\n")


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1200px;padding:0 20px 40px;color:#1b1f24;background:#fff}
h1{font-size:24px;margin:18px 0 4px}h2{border-bottom:2px solid #d0d7de;padding-bottom:4px;
margin-top:36px}h3{margin:22px 0 6px}h4{margin:0 0 4px}
nav a{margin-right:4px}a{color:#0b5cad;text-decoration:none}a:hover{text-decoration:underline}
.muted{color:#57606a}.caption{color:#424a53;font-size:13px;max-width:1100px}
table{border-collapse:collapse;margin:6px 0 8px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7;cursor:pointer;user-select:none;white-space:nowrap}
th[data-order=asc]::after{content:" \\25B2"}th[data-order=desc]::after{content:" \\25BC"}
td[data-v]{text-align:right}td:first-child{text-align:left}
td.best{font-weight:700;background:#e6f4ea}td.up{color:#1a7f37}td.down{color:#cf222e}
table.small{font-size:12px}tr.selected td{background:#fff8c5}
.notes{font-size:12px;color:#57606a;margin:2px 0 10px}
article.run{border:1px solid #d0d7de;border-radius:6px;padding:10px 12px;margin:10px 0}
svg text{font:11px system-ui,sans-serif}.chart-title{font-weight:600}
.tick{fill:#57606a;font-size:10px}.grid{stroke:#eaeef2}.row-label{font-size:11px}
.value{font-size:10px}.mark{font-size:9px}.empty{fill:#f6f8fa}
.legend{font-size:12px;margin:2px 0 6px}.key{margin-right:10px;white-space:nowrap}
.key i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin-right:4px}
.scroll{overflow-x:auto}.pair{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0}
dl.provenance{display:grid;grid-template-columns:120px 1fr;gap:2px 10px;font-size:12px;margin:6px 0}
dl.provenance dt{color:#57606a}dl.provenance dd{margin:0;word-break:break-all}
pre{background:#f6f8fa;padding:8px;font-size:11px;overflow-x:auto}
.gallery{display:flex;flex-wrap:wrap;gap:16px}.gallery img{max-width:100%;border:1px solid #d0d7de}
figure{margin:0;max-width:100%}figcaption{font-size:12px;color:#57606a}
"""

SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, column) {
    th.addEventListener("click", function () {
      var ascending = th.getAttribute("data-order") !== "asc";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("data-order"); });
      th.setAttribute("data-order", ascending ? "asc" : "desc");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var cell = row.cells[column], v = cell.getAttribute("data-v");
        if (v === null) { return cell.textContent.trim(); }
        var n = parseFloat(v);
        return isNaN(n) ? (v === "" ? null : v) : n;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === null || x === "") { return y === null || y === "" ? 0 : 1; }
        if (y === null || y === "") { return -1; }
        var order = (typeof x === "number" && typeof y === "number") ? x - y
          : String(x).localeCompare(String(y));
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""
