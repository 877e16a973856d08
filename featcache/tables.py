"""Result and summary tables: one set of rows, rendered as Markdown, CSV, LaTeX or records.

>>> table = Table(["loss", "test mAP"])
>>> table.add("an", 84.213)
>>> table.add("role", 86.5)
>>> print(table.markdown())
| loss | test mAP |
|------|---------:|
| an   |    84.21 |
| role |    86.50 |
"""

from __future__ import annotations

import csv
import io
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from featcache.errors import plural


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` values (seeds) and its standard deviation: ``72.62 ± 0.31``."""

    mean: float
    sd: float = 0.0
    n: int = 1

    def text(self, float_format: str = "{:.2f}", plus_minus: str = " ± ") -> str:
        mean = float_format.format(self.mean)
        return mean if self.n < 2 else mean + plus_minus + float_format.format(self.sd)

    def __str__(self) -> str:
        return self.text()


@dataclass
class Table:
    """Rows of cells under named columns.

    Markdown and LaTeX format floats with ``float_format`` (or a column's entry in
    ``formats``), :class:`Estimate` cells as ``mean ± sd``, show None as an empty cell and
    booleans as yes/no, right-align columns that hold only numbers, and set the cells listed
    in ``bold`` (row, column) in bold. ``caption`` and ``notes`` go under the table. CSV and
    :meth:`records` keep every value at full precision.
    """

    columns: Sequence[str]
    rows: list[list] = field(default_factory=list)
    title: str | None = None
    float_format: str = "{:.2f}"
    formats: Mapping[str, str] = field(default_factory=dict)
    caption: str | None = None
    notes: list[str] = field(default_factory=list)
    bold: set[tuple[int, int]] = field(default_factory=set)
    #: LaTeX column types for wide text columns, e.g. ``{"params": "p{5cm}"}`` (wraps)
    latex_columns: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.columns = list(self.columns)
        rows, self.rows = self.rows, []
        for row in rows:
            self.add(*row)

    def add(self, *cells) -> None:
        """Append one row (one cell per column)."""
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {plural(len(cells), 'cell')} for {plural(len(self.columns), 'column')} "
                             f"({', '.join(self.columns)})")
        self.rows.append(list(cells))

    def markdown(self) -> str:
        """An aligned Markdown table, under the title when there is one, above the caption
        and notes when there are."""
        # a cell is one line: "|" escaped, a line break (a class name from an old labels
        # file) shown as a space
        cells = [[self._emphasis(r, c, " ".join(self._text(column, value).replace("|", "\\|")
                                                .splitlines()), "**", "**")
                  for c, (column, value) in enumerate(zip(self.columns, row, strict=True))]
                 for r, row in enumerate(self.rows)]
        right = self._numeric_columns()
        widths = [max([len(name), 3] + [len(row[i]) for row in cells])
                  for i, name in enumerate(self.columns)]

        def line(values: Sequence[str]) -> str:
            return "| " + " | ".join(v.rjust(w) if r else v.ljust(w)
                                     for v, w, r in zip(values, widths, right, strict=True)) + " |"

        rule = "|" + "|".join("-" * (w + 1) + ":" if r else "-" * (w + 2)
                              for w, r in zip(widths, right, strict=True)) + "|"
        lines = [line(self.columns), rule] + [line(row) for row in cells]
        if self.title:
            lines[:0] = [self.title, ""]
        if self.caption:
            lines += ["", f"*{self.caption}*"]
        if self.notes:
            lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines)

    def latex(self, label: str | None = None) -> str:
        """A ``booktabs`` table (``\\toprule``, ``\\midrule``, ``\\bottomrule``) in a ``table``
        float with the caption (and ``label``); needs ``\\usepackage{booktabs}``."""
        align = "".join(self.latex_columns.get(column, "r" if right else "l")
                        for column, right in zip(self.columns, self._numeric_columns(), strict=True))
        header = " & ".join(latex_escape(c) for c in self.columns) + r" \\"
        body = []
        for r, row in enumerate(self.rows):
            cells = [self._emphasis(r, c, self._latex_text(column, value), r"\textbf{", "}")
                     for c, (column, value) in enumerate(zip(self.columns, row, strict=True))]
            body.append("    " + " & ".join(cells) + r" \\")
        lines = [r"\begin{table}[t]", r"  \centering"]
        if self.caption or self.title:
            lines.append(r"  \caption{" + latex_escape(self.caption or self.title or "") + "}")
        if label:
            lines.append(r"  \label{" + label + "}")
        lines += [r"  \begin{tabular}{" + align + "}", r"    \toprule", "    " + header,
                  r"    \midrule", *body, r"    \bottomrule", r"  \end{tabular}"]
        if self.notes:
            lines.append(r"  \par\smallskip{\footnotesize " + " ".join(
                latex_escape(note) + "." for note in self.notes) + "}")
        lines.append(r"\end{table}")
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        """The same rows as CSV with a header line (full precision; None is empty; an
        :class:`Estimate` as ``mean ± sd``; text cells a spreadsheet would run as a formula
        escaped: :func:`spreadsheet_safe`)."""
        return csv_text([self.columns] + [
            ["" if value is None else value.text("{!r}") if isinstance(value, Estimate) else value
             for value in row] for row in self.rows])

    def records(self) -> list[dict]:
        """The rows as dicts keyed by column (for JSON; an :class:`Estimate` as a dict)."""
        return [{column: ({"mean": value.mean, "sd": value.sd, "n": value.n}
                          if isinstance(value, Estimate) else value)
                 for column, value in zip(self.columns, row, strict=True)} for row in self.rows]

    def _numeric_columns(self) -> list[bool]:
        if not self.rows:
            return [False] * len(self.columns)
        return [all(value is None or _is_number(value) or isinstance(value, Estimate)
                    for value in column) for column in zip(*self.rows, strict=True)]

    def _emphasis(self, row: int, column: int, text: str, start: str, end: str) -> str:
        return f"{start}{text}{end}" if text and (row, column) in self.bold else text

    def _latex_text(self, column: str, value) -> str:
        if isinstance(value, Estimate):
            return value.text(self.formats.get(column, self.float_format), r" $\pm$ ")
        return latex_escape(self._text(column, value))

    def _text(self, column: str, value) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, Estimate):
            return value.text(self.formats.get(column, self.float_format))
        if column in self.formats:
            return self.formats[column].format(value)
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
            return self.float_format.format(value)
        return str(value)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}", "±": r"$\pm$", "<": r"\textless{}",
                  ">": r"\textgreater{}"}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (``ours_1 & 5%`` -> ``ours\\_1 \\& 5\\%``)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def csv_text(rows) -> str:
    """CSV of ``rows`` (``\n`` line ends), every text cell through :func:`spreadsheet_safe`; a
    row with a carriage return in a cell is quoted whole (Python's writer quotes only what
    holds its own line end, and a bare CR breaks the row for every reader)."""
    out = io.StringIO()
    plain = csv.writer(out, lineterminator="\n")
    quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
    for row in rows:
        cells = [spreadsheet_safe(cell) for cell in row]
        writer = quoted if any(isinstance(c, str) and "\r" in c for c in cells) else plain
        writer.writerow(cells)
    return out.getvalue()


#: what starts a formula in a spreadsheet (OWASP's CSV-injection list)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value):
    """A CSV cell that no spreadsheet runs as a formula: text starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return (a class name ``=cmd|' /C calc'!A0``, an image
    named ``+SUM(1+1).jpg``) gets a leading ``'``, as OWASP's CSV-injection rule says; numbers,
    and text that reads as a number (``-0.5``), are written as they are."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
