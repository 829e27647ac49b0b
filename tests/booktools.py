"""Helpers for tests that read the book's notebooks and their sources."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def exercise_layout(src: str) -> dict[str, tuple[int, int, int]]:
    """{label: (exercise cell, first code cell after it, solution cell)} of a jupytext source.

    Raises AssertionError when the first code cell after an exercise does not call a check.
    """
    import jupytext

    cells = jupytext.reads(src, fmt="py:percent").cells
    layout = {}
    for i, cell in enumerate(cells):
        m = re.search(r"\{exercise\}.*\n(?:.*\n)*?:label: (\S+)", cell.source)
        if cell.cell_type != "markdown" or not m:
            continue
        label = m.group(1)
        code = next(j for j in range(i + 1, len(cells)) if cells[j].cell_type == "code")
        solution = next(k for k, c in enumerate(cells) if f"{{solution}} {label}" in c.source)
        layout[label] = (i, code, solution)
        assert "check_" in cells[code].source, f"{label}: the first code cell after it should call the check"
    return layout


def hidden_output_cells(notebook: str) -> list[str]:
    """Sources of the generated notebook's cells tagged hide-output."""
    import nbformat

    nb = nbformat.read(ROOT / "book" / notebook, as_version=4)
    return [c.source for c in nb.cells if "hide-output" in c.metadata.get("tags", [])]


# The book's pages in _toc.yml order (the notebooks and instructors.md).
PAGES = ["intro", "measuring", "ch1_caching_allocator", "ch2_cross_stream", "ch3_pinned_memory",
         "ch4_hidden_syncs", "claims", "instructors"]


def panel_count(page: str) -> int:
    """How many ``ex.panel(...)`` calls the page's source makes (0 for a page without a source)."""
    src = ROOT / "book" / "src" / f"{page}.py"
    return len(re.findall(r"^ex\.panel\(", src.read_text(), re.M)) if src.exists() else 0
