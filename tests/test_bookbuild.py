"""The order in which `make test` executes the book's notebooks (tests/bookbuild.py)."""
from __future__ import annotations

from pathlib import Path

import nbformat

from tests import bookbuild

ROOT = Path(__file__).resolve().parent.parent


def _page(stem: str, code: str) -> tuple[Path, nbformat.NotebookNode]:
    return ROOT / "book" / f"{stem}.md", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])


def test_the_longest_measured_notebook_starts_first_and_an_unmeasured_one_before_them():
    pages = [_page("claims", "x" * 9000), _page("ch1_caching_allocator", "x"), _page("ch2_cross_stream", "x" * 10),
             _page("new_small", "x"), _page("new_large", "x" * 500), _page("ch4_hidden_syncs", "x" * 20000)]
    order = [p.stem for p, _ in bookbuild.start_order(pages)]
    # unmeasured first, the larger code first; then 111, 96, 48 and 4 s
    assert order == ["new_large", "new_small", "ch2_cross_stream", "ch4_hidden_syncs", "ch1_caching_allocator", "claims"]


def test_every_measured_notebook_is_a_page_of_the_book():
    """A page renamed or removed would leave its time here, and the page that replaced it unlisted."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part["chapters"]]
    assert set(bookbuild.EXECUTE_SECONDS) <= {Path(f).stem for f in files}
