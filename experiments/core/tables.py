"""The one table type of the book: an HTML table in a notebook, aligned text in a terminal."""
from __future__ import annotations

import html
from typing import Any, Sequence


class Table:
    """Rows of cells shown as an HTML table in notebooks (``_repr_html_``) and as aligned
    text by ``print`` or in a terminal (``str``).

    Args:
        columns: the header, one name per column.
        rows: the cells, each row as long as ``columns`` (cells are shown as text).
        caption: shown under the table (several lines allowed).
        highlight: per row, whether to shade it.
        groups: per row, a group name; a group heading is inserted where it changes.
        code_columns: indices of columns shown in a monospace font.
        right: per column, whether to right-align it (figures); default: left.
        summary: if given, the HTML table is folded under this line (a ``<details>``).

    Raises:
        ValueError: a row whose length differs from the header's, or per-row/per-column
            options of the wrong length.
    """

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "",
                 highlight: Sequence[bool] | None = None, *, groups: Sequence[str] | None = None,
                 code_columns: Sequence[int] = (), right: Sequence[bool] | None = None, summary: str = "") -> None:
        self.columns = [str(c) for c in columns]
        self.rows = [[str(c) for c in r] for r in rows]
        for i, r in enumerate(self.rows):
            if len(r) != len(self.columns):
                raise ValueError(f"rows[{i}] has {len(r)} cells; the header has {len(self.columns)}")
        self.caption = caption
        self.highlight = list(highlight) if highlight is not None else [False] * len(self.rows)
        self.groups = list(groups) if groups is not None else [""] * len(self.rows)
        self.right = list(right) if right is not None else [False] * len(self.columns)
        if len(self.highlight) != len(self.rows) or len(self.groups) != len(self.rows):
            raise ValueError("highlight and groups need one entry per row")
        if len(self.right) != len(self.columns):
            raise ValueError("right needs one entry per column")
        self.code_columns = set(code_columns)
        self.summary = summary

    @property
    def header(self) -> list[str]:
        return self.columns

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        widths = [max([len(c)] + [len(r[i]) for r in self.rows]) for i, c in enumerate(self.columns)]

        def line(r: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if ra else c.ljust(w) for c, w, ra in zip(r, widths, self.right)).rstrip()

        lines = [line(self.columns), "  ".join("-" * w for w in widths)]
        group = ""
        for r, g in zip(self.rows, self.groups):
            if g and g != group:
                lines.append(f"-- {g}")
                group = g
            lines.append(line(r))
        if self.caption:
            lines.append(self.caption)
        return "\n".join(lines)

    __repr__ = __str__

    def _cell(self, i: int, text: str, tag: str = "td") -> str:
        body = html.escape(text)
        if tag == "td" and i in self.code_columns:
            body = f"<code>{body}</code>"
        align = "right" if self.right[i] else "left"
        # Short values ('2 MiB − 512 B') stay on one line; long ones may wrap in a narrow column.
        # Headers may wrap between words, so a column is as wide as its figures, not its name.
        nowrap = ";white-space:nowrap" if tag == "td" and len(text) <= 16 else ""
        return f"<{tag} style='text-align:{align};padding:2px 8px;vertical-align:top{nowrap}'>{body}</{tag}>"

    def _repr_html_(self) -> str:
        head = "".join(self._cell(i, c, "th") for i, c in enumerate(self.columns))
        body, group = [], ""
        for r, hi, g in zip(self.rows, self.highlight, self.groups):
            if g and g != group:
                body.append(f"<tr><td colspan='{len(self.columns)}' style='padding:8px 8px 2px;font-weight:bold'>"
                            f"{html.escape(g)}</td></tr>")
                group = g
            # the class lets the book's dark scheme recolour it (book/_static/memlab.css)
            style = " class='memlab-highlight' style='background:#fbeaea'" if hi else ""
            body.append(f"<tr{style}>" + "".join(self._cell(i, c) for i, c in enumerate(r)) + "</tr>")
        cap = ("<caption style='caption-side:bottom;font-size:85%;color:#555;text-align:left'>"
               + html.escape(self.caption).replace("\n", "<br>") + "</caption>") if self.caption else ""
        table = (f"<table class='memlab-table'>{cap}<thead><tr>{head}</tr></thead>"
                 f"<tbody>{''.join(body)}</tbody></table>")
        if self.summary:
            return f"<details><summary>{html.escape(self.summary)}</summary>{table}</details>"
        return table
