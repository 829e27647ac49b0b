"""The student edition: a book config without solutions, and notebooks without them.

    python scripts/student_edition.py config              # print the student _config.yml
    python scripts/student_edition.py notebooks OUT_DIR   # write solution-free notebooks

The pages hide solutions through sphinx-exercise's ``hide_solutions``, and the book's
extension withholds, in the student build only, every output that answers an exercise
(cells marked ``memlab: {reveals: <label>}`` in book/src: the "Show the answer" folds, a
measurement shown after a check, an explorer's points that are an answer). The notebooks
in the repository keep their solutions (in dropdowns), so the student edition has no
launch, download, repository or issues buttons that would lead to them; instructors hand
out the notebooks this script writes instead (students open them in Colab with File >
Upload notebook).

In those notebooks: no solution, no link into the full book or the repository (a link's
text stays, in italics), a cell whose output answers an exercise comes after that
exercise's check cell, and the set-up cell tells the checks that this is the student
edition (a second wrong try then points to the instructor, not to a solution). The set-up
cell still installs the package from the repository unless ``--package-url`` names
another place: a course that must not show the repository's address hosts a copy.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent

# A MyST solution block: an opening fence of 3+ backticks or colons with {solution},
# up to the matching closing fence of the same characters.
SOLUTION = re.compile(r"^(?P<fence>`{3,}|:{3,})\{solution\}.*?^(?P=fence)[ \t]*$\n?", re.M | re.S)
# The same in the plain notebooks (scripts/sync_notebooks.py writes solutions this way).
DETAILS = re.compile(r"^<details><summary>Solution</summary>.*?^</details>[ \t]*$\n?", re.M | re.S)
LINK = re.compile(r"\[([^\]\n]*)\]\((https?://[^)\s]+)\)")
EDITION = ('import os\nos.environ["CUDA_MEMLAB_EDITION"] = "student"  '
           '# the checks then point to your instructor, not to solutions')


def student_config() -> dict:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["title"] += " (student edition)"
    config["sphinx"]["config"]["hide_solutions"] = True
    config["launch_buttons"] = {}          # the repository's notebooks carry the solutions
    html = config.setdefault("html", {})
    html["use_download_button"] = False
    html["use_repository_button"] = False  # the repository holds the full book, solutions and all
    html["use_issues_button"] = False
    html["use_edit_page_button"] = False
    # Jupyter Book 1 ignores use_download_button: the book's extension drops the button,
    # withholds the outputs that answer exercises, and no page source (with its solutions)
    # is copied into _sources/.
    config["sphinx"]["config"]["memlab_student"] = True
    config["sphinx"]["config"]["html_copy_source"] = False
    # The code cells are the same as the full book's: reuse its execution cache instead of
    # running every notebook again.
    config.setdefault("execute", {})["cache"] = str(ROOT / "_build" / ".jupyter_cache")
    # Jupyter Book resolves local extensions against the config file's folder, and this
    # config is written elsewhere (.venv/, _build/).
    local = config["sphinx"].get("local_extensions") or {}
    config["sphinx"]["local_extensions"] = {name: str(ROOT / path) for name, path in local.items()}
    return config


def full_book_addresses() -> tuple[str, ...]:
    """The URL prefixes of the full book and of the repository (from _config.yml)."""
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    out = [url, url.removesuffix(".git")]
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url)
    if m:
        out.append(f"https://{m.group(1)}.github.io/{m.group(2)}")
    return tuple(out)


def strip_solutions(text: str) -> str:
    """Markdown without its solutions: MyST {solution} blocks and plain <details> solutions."""
    return DETAILS.sub("", SOLUTION.sub("", text))


def strip_book_links(text: str, addresses: tuple[str, ...]) -> str:
    """Markdown whose links into the full book or the repository are plain (italic) text."""
    def unlink(m: re.Match) -> str:
        label, url = m.group(1), m.group(2)
        return f"*{label}*" if url.startswith(addresses) else m.group(0)

    return LINK.sub(unlink, text)


def after_their_check(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Move each cell marked ``memlab.reveals`` that comes before its exercise's check cell
    to just after it (a note stays where it was). Returns ``nb``, changed in place."""
    check_of = {c.metadata.get("exercise"): c for c in nb.cells if c.cell_type == "code" and c.metadata.get("exercise")}
    for cell in list(nb.cells):
        label = cell.metadata.get("memlab", {}).get("reveals") if cell.cell_type == "code" else None
        check = check_of.get(label)
        if check is None or nb.cells.index(cell) > nb.cells.index(check):
            continue
        i = nb.cells.index(cell)
        nb.cells[i] = nbformat.v4.new_markdown_cell(
            "*(In this edition the explorer that stood here comes after the next exercise's check cell: one of its "
            "settings is the exercise's answer.)*")
        nb.cells.insert(nb.cells.index(check) + 1, cell)
    return nb


def write_notebooks(out: Path, *, package_url: str | None = None) -> list[Path]:
    """Write the handed-out notebooks (one per page of the book) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    addresses = full_book_addresses()
    written = []
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = strip_book_links(strip_solutions(cell.source), addresses)
            elif "colab-setup" in cell.metadata.get("tags", []):
                if package_url:
                    cell.source = re.sub(r'"cuda-memory-lab @ [^"]*"', f'"cuda-memory-lab @ {package_url}"', cell.source)
                cell.source = cell.source + "\n" + EDITION
        nb.cells = [c for c in nb.cells if c.cell_type != "markdown" or c.source.strip()]
        after_their_check(nb)
        target = out / path.name
        nbformat.write(nb, target)
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("config", help="print the student _config.yml")
    nbs = sub.add_parser("notebooks", help="write solution-free notebooks to hand out")
    nbs.add_argument("out", type=Path)
    nbs.add_argument("--package-url", help="where the set-up cell installs the package from (pip's URL form)")
    args = parser.parse_args(argv[1:])
    if args.what == "config":
        print(yaml.safe_dump(student_config(), sort_keys=False))
        return 0
    for p in write_notebooks(args.out, package_url=args.package_url):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
