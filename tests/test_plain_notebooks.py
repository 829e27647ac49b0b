"""The notebooks Colab opens (book/*.ipynb) are plain Markdown: no MyST syntax left in any cell."""
import re
from pathlib import Path

import nbformat
import pytest

from .booktools import ROOT

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
# What Colab and Jupyter would print as raw text: directive fences, roles, options, targets.
MYST = [
    (re.compile(r"^\s*(`{3,}|:{3,})\{[\w-]+\}", re.M), "a directive fence"),
    (re.compile(r"\{(ref|numref|doc|term|eq|download|prf:ref)\}`"), "a role"),
    (re.compile(r"^:(label|class|name|nonumber):", re.M), "a directive option"),
    (re.compile(r"^\([\w-]+\)=\s*$", re.M), "a target label"),
]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_launch_notebook_has_no_myst_syntax(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for pattern, what in MYST:
            m = pattern.search(cell.source)
            assert not m, f"{path.name} cell {i}: {what} left: {cell.source[m.start():m.start() + 50]!r}"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem.startswith("ch")], ids=lambda p: p.stem)
def test_exercises_are_numbered_headings_with_their_solutions_folded(path):
    src = (ROOT / "book" / "src" / f"{path.stem}.py").read_text()
    titles = re.findall(r"\{exercise\}[ \t]*(.+)", src)
    chapter = int(path.stem[2])
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    headings = re.findall(r"^### Exercise (\d+)\.(\d+): (.+)$", text, re.M)
    assert headings == [(str(chapter), str(k), t.strip()) for k, t in enumerate(titles, 1)]
    assert text.count("<details><summary>Solution</summary>") == src.count("{solution}")


def test_cross_references_link_to_the_online_pages():
    text = (ROOT / "book" / "ch2_cross_stream.ipynb").read_text()
    assert "https://cuda-memory-lab.github.io/cuda-memory-lab/book/ch2_cross_stream.html#ch2-handoff" in text


def test_every_fold_says_what_it_hides():
    """Folded cells carry a label ("Show the measurement", "Show the answer"), never the generic one."""
    import jupytext

    for src in sorted((ROOT / "book" / "src").glob("*.py")):
        for cell in jupytext.read(src).cells:
            if "hide-output" in cell.metadata.get("tags", []) and "check_" in cell.source:
                raise AssertionError(f"{src.stem}: a check's feedback is folded: {cell.source[:60]!r}")
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_notebooks", ROOT / "scripts" / "sync_notebooks.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    nb = sync.build(ROOT / "book" / "src" / "ch1_caching_allocator.py", sync.repo_url())
    folded = [c for c in nb.cells if {"hide-output", "hide-input"} & set(c.metadata.get("tags", []))]
    assert folded and all(c.metadata["mystnb"]["code_prompt_show"].startswith("Show the ") for c in folded)
    assert any(c.metadata["mystnb"]["code_prompt_show"] == "Show the answer" for c in folded)
