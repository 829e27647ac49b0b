"""The student edition: a book config without solutions, and notebooks without them.

    python scripts/student_edition.py config              # print the student _config.yml
    python scripts/student_edition.py notebooks OUT_DIR   # write solution-free notebooks

The pages hide solutions through sphinx-exercise's ``hide_solutions``. The notebooks in
the repository keep theirs (in dropdowns), so the student edition has no launch or
download buttons that would lead to them; instructors hand out the notebooks this
script writes instead (students open them in Colab with File > Upload notebook).
"""
from __future__ import annotations

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


def student_config() -> dict:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["title"] += " (student edition)"
    config["sphinx"]["config"]["hide_solutions"] = True
    config["launch_buttons"] = {}          # the repository's notebooks carry the solutions
    config.setdefault("html", {})["use_download_button"] = False
    # Jupyter Book 1 ignores use_download_button: the book's extension drops the button,
    # and no page source (with its solutions) is copied into _sources/.
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


def strip_solutions(text: str) -> str:
    """Markdown without its solutions: MyST {solution} blocks and plain <details> solutions."""
    return DETAILS.sub("", SOLUTION.sub("", text))


def write_notebooks(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = strip_solutions(cell.source)
        nb.cells = [c for c in nb.cells if c.cell_type != "markdown" or c.source.strip()]
        target = out / path.name
        nbformat.write(nb, target)
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "config":
        print(yaml.safe_dump(student_config(), sort_keys=False))
        return 0
    if len(argv) == 3 and argv[1] == "notebooks":
        for p in write_notebooks(Path(argv[2])):
            print(f"wrote {p}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
