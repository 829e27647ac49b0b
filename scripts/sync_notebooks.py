"""Generate the book's notebooks (book/*.ipynb) from their sources (book/src/*.py).

Sources are jupytext percent-format files: readable diffs, one cell per `# %%`.
Each generated notebook gets, after its title cell, the set-up cell that installs the
helper package in Colab from `repository.url` in _config.yml (the one place the URL
lives), and notebook metadata that asks Colab for a GPU runtime. Each exercise's check
cell is tagged for the grader (`experiments.core.grading.tag_exercise_cells`).

    python scripts/sync_notebooks.py          # write notebooks that changed
    python scripts/sync_notebooks.py --check  # exit 1 if any notebook is stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

from experiments.core.grading import tag_exercise_cells

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "book" / "src"
OUT = ROOT / "book"

SETUP = '''\
# Set-up. In Colab (or anywhere the helper package is missing) this installs it from
# the book's repository; its torch requirement is only a lower bound (>=2.4), so the
# torch that Colab ships stays as it is. The check asks for our distribution by name:
# another package called `experiments` exists on PyPI.
import importlib.metadata
try:
    importlib.metadata.version("{dist}")
except importlib.metadata.PackageNotFoundError:
    %pip install --quiet "{dist} @ git+{url}"
import experiments'''

DIST = "cuda-memory-lab"  # [project] name in pyproject.toml


def repo_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"].rstrip("/")
    if not url.startswith("https://"):
        raise SystemExit(f"_config.yml repository.url must be an https URL, got {url!r}")
    return url


def build(src: Path, url: str) -> nbformat.NotebookNode:
    nb = jupytext.read(src)
    if not nb.cells or nb.cells[0].cell_type != "markdown" or not nb.cells[0].source.startswith("# "):
        raise SystemExit(f"{src}: the first cell must be a markdown title ('# ...')")
    setup = nbformat.v4.new_code_cell(SETUP.format(dist=DIST, url=url + ".git" if not url.endswith(".git") else url))
    setup.metadata["tags"] = ["hide-input", "colab-setup"]
    nb.cells.insert(1, setup)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{src.stem[:40]}-{i}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",
        "colab": {"provenance": [], "gpuType": "T4"},
    }
    nb.nbformat, nb.nbformat_minor = 4, 5
    return tag_exercise_cells(nb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    args = parser.parse_args(argv)
    url = repo_url()
    stale = []
    for src in sorted(SRC.glob("*.py")):
        target = OUT / f"{src.stem}.ipynb"
        text = nbformat.writes(build(src, url), version=4) + "\n"
        if not target.exists() or target.read_text() != text:
            stale.append(target)
            if not args.check:
                target.write_text(text)
    for t in stale:
        print(("stale: " if args.check else "wrote ") + str(t.relative_to(ROOT)))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
