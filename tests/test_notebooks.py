"""The book's notebooks: generated from their sources, set up for Colab, and executing cleanly."""
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from .booktools import execute_notebook

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))


def _toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def test_the_book_and_its_sources_are_found():
    """The tests below are parametrised over these globs: an empty one must fail, not skip."""
    chapters = {p.stem for p in BOOK.glob("ch*.ipynb")}
    assert len(chapters) >= 4 and chapters <= {p.stem for p in NOTEBOOKS}
    assert {p.stem for p in (BOOK / "src").glob("ch*.py")} == chapters


def test_american_spelling_of_synchronize():
    """The book's pages, the package and the tests write 'synchronize' (as torch does)."""
    files = [*(BOOK / "src").glob("*.py"), *(ROOT / "experiments").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
    assert len(files) > 40, "the globs found too few files"
    british = [str(p.relative_to(ROOT)) for p in files if re.search(r"synchroni[s]", p.read_text(), re.I)]
    assert not british, british


def test_notebooks_are_generated_from_their_sources():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"run `make notebooks`: {r.stdout}{r.stderr}"
    assert {p.stem for p in NOTEBOOKS} == {p.stem for p in (BOOK / "src").glob("*.py")}


def test_toc_lists_every_page_in_reading_order():
    files = _toc_files()
    for f in files:
        assert (ROOT / f).with_suffix(".ipynb").exists() or (ROOT / f).with_suffix(".md").exists(), f
    chapters = [f for f in files if Path(f).name.startswith("ch")]
    assert chapters == ["book/ch1_caching_allocator", "book/ch2_cross_stream", "book/ch3_pinned_memory",
                        "book/ch4_hidden_syncs"]
    assert {f"book/{p.stem}" for p in NOTEBOOKS} <= set(files)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_ready_for_colab(path):
    nb = json.loads(path.read_text())
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    setup = "".join(nb["cells"][1]["source"])
    assert f"git+{url}" in setup and "%pip install" in setup
    assert nb["metadata"]["accelerator"] == "GPU"
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), "commit notebooks without outputs"


def _texts(nb):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                yield out.get("text", "")
            for value in out.get("data", {}).values():
                yield value if isinstance(value, str) else json.dumps(value)


def _code(nb):
    return [c.source for c in nb.cells if c.cell_type == "code"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_in_recorded_mode(path, built_book):
    """The book build executed the notebook (once, for the whole run; it fails on a cell error):
    its executed copy is this notebook's code, says it shows recorded results, holds no error,
    and a page that runs an experiment shows a figure."""
    executed = built_book / "jupyter_execute" / "book" / path.name
    assert executed.exists(), f"the book build did not execute {path.name}"
    nb = nbformat.read(executed, as_version=4)
    assert _code(nb) == _code(nbformat.read(path, as_version=4)), "the build executed another version of the notebook"
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code" and c.source.strip()), \
        "a code cell was not executed"
    text = "\n".join(_texts(nb))
    assert "Recorded mode" in text
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    if any("ex.run(" in "".join(c.source) for c in nb.cells):
        assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])), "no figure"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_live_on_gpu(path):
    nb = execute_notebook(path, "live")
    text = "\n".join(_texts(nb))
    assert "Live mode" in text


@pytest.mark.parametrize("src", sorted((BOOK / "src").glob("ch*.py")), ids=lambda p: p.stem)
def test_every_exercise_has_a_check_then_a_solution(src):
    """Exercise, then the cell that calls its check, then the solution dropdown, in every chapter."""
    from .booktools import exercise_layout

    text = src.read_text()
    assert text.startswith("# %% [markdown]\n# # "), "the first cell is the chapter's title"
    layout = exercise_layout(text)
    assert len(layout) >= 4, "each chapter has at least four exercises"
    assert len(layout) == text.count(":label: ex-"), "every exercise label belongs to a parsed exercise"
    for label, (exercise, check, solution) in layout.items():
        assert exercise < check < solution, f"{label}: the solution should come after the check cell"
        after = text[text.index(f"{{solution}} {label}"):].splitlines()[1]
        assert after.strip("# ") == ":class: dropdown", f"{label}: the solution should be a dropdown"


def test_colab_setup_looks_for_our_distribution_not_any_experiments_module():
    """A PyPI package also called `experiments` must not pass for ours (the layout issue)."""
    import tomllib

    dist = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        setup = next(c for c in nb.cells if "colab-setup" in c.metadata.get("tags", []))
        assert f'importlib.metadata.version("{dist}")' in setup.source, path.name
        assert "except ImportError" not in setup.source, f"{path.name}: `import experiments` alone proves nothing"
