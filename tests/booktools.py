"""Helpers for tests that read the book's notebooks and their sources."""
from __future__ import annotations

import os
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


def execute_notebook(path: Path, mode: str, timeout: float = 900):
    """The notebook at ``path`` run top to bottom in a fresh kernel in ``mode`` ('live' or
    'recorded'); returns it with its outputs and nbclient's per-cell timestamps.

    The kernel inherits the environment: the mode, and this checkout's package first on its path
    (the lab GPU runs the tests from a copy of the tree that is not installed). Raises nbclient's
    CellExecutionError on a failing cell.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in ("CUDA_MEMLAB_MODE", "PYTHONPATH")}
    os.environ["CUDA_MEMLAB_MODE"] = mode
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "book")}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


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


def executed_html(build: Path, page: str, source: str) -> str:
    """The HTML that the code cell ``source`` (its whole text) of ``page`` displayed when the book
    build executed it: ``build`` is conftest's ``built_book``. Lets a test read what the book
    already rendered instead of rendering it again. Raises AssertionError when the executed
    notebook has no such cell or the cell displayed no HTML."""
    import nbformat

    nb = nbformat.read(build / "jupyter_execute" / "book" / f"{page}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.strip() == source]
    assert len(cells) == 1, f"{page}: {len(cells)} executed cells are {source!r}"
    html = [o["data"]["text/html"] for o in cells[0].outputs if "text/html" in o.get("data", {})]
    assert len(html) == 1, f"{page}: the cell {source!r} displayed {len(html)} HTML outputs"
    return html[0]
