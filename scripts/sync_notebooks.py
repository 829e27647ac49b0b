"""Generate the book's notebooks from their sources (book/src/*.py), in two forms.

Sources are jupytext percent-format files in MyST Markdown: readable diffs, one cell per
`# %%`; they are the one source of truth. From each this script writes

- book/NAME.md, the MyST form, which Jupyter Book builds the page from (not committed:
  `make book` writes it);
- book/NAME.ipynb, the plain form, which the Colab launch button opens and
  `make book-student` hands out: plain Markdown that Colab and Jupyter render. Each
  exercise becomes a heading with its number and title, each solution a
  `<details><summary>Solution</summary>` block, each `{ref}` a link to the online
  page, and labels and directives disappear (see experiments-free `plain_markdown`).

Both get, after the title cell, the set-up cell that installs the helper package in Colab
from `repository.url` in _config.yml (the one place the URL lives), and metadata that
asks Colab for a GPU runtime. Folded cells get a label that says what they hide.
Each exercise's check cell is tagged for the grader
(`experiments.grading.notebooks.tag_exercise_cells`), and the instructors' table of
objectives, exercises and points is written to book/generated/exercises.md from the
exercises' declarations.

    python scripts/sync_notebooks.py          # write notebooks that changed
    python scripts/sync_notebooks.py --check  # exit 1 if any plain notebook is stale
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

from experiments.grading.notebooks import exercise_table, tag_exercise_cells

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
MYST_PAGES = ("snapshot_check",)  # book/*.md pages without a notebook that {ref} may point at


def repo_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"].rstrip("/")
    if not url.startswith("https://"):
        raise SystemExit(f"_config.yml repository.url must be an https URL, got {url!r}")
    return url


def pages_url(url: str) -> str:
    """The online book's address (GitHub Pages) from the repository's: https://ORG.github.io/REPO/."""
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", url)
    if not m:
        raise SystemExit(f"_config.yml repository.url must be https://github.com/ORG/REPO, got {url!r}")
    return f"https://{m.group(1)}.github.io/{m.group(2)}/"


# Folds that say what they hide; a cell can set its own with mystnb code_prompt_show.
FOLDS = {"hide-input": ("Show the code", "Hide the code"),
         "hide-output": ("Show the measurement", "Hide the measurement"),
         "hide-cell": ("Show the cell", "Hide the cell")}


def label_folds(cell: nbformat.NotebookNode) -> None:
    for tag in cell.metadata.get("tags", []):
        if tag in FOLDS:
            prompts = cell.metadata.setdefault("mystnb", {})
            prompts.setdefault("code_prompt_show", FOLDS[tag][0])
            prompts.setdefault("code_prompt_hide", FOLDS[tag][1])


def chapter_numbers() -> dict[str, int]:
    """{page stem: chapter number} for the numbered chapters of _toc.yml, in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    numbers = {}
    for part in toc.get("parts", []):
        if part.get("numbered"):
            for ch in part["chapters"]:
                numbers[Path(ch["file"]).stem] = len(numbers) + 1
    return numbers


FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[a-z-]+)\}[ \t]*(?P<arg>.*?)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                   re.M | re.S)
OPTION = re.compile(r"^:(\w+):[ \t]*(.*)\n", re.M)
TARGET = re.compile(r"^\(([\w-]+)\)=[ \t]*(?:\n|\Z)", re.M)
REF = re.compile(r"\{ref\}`(?:([^`<]+?)\s*<([\w-]+)>|([\w-]+))`")


def _options(body: str) -> tuple[dict[str, str], str]:
    """A directive body's leading `:name: value` options, and the rest."""
    opts = {}
    while True:
        m = OPTION.match(body)
        if not m:
            return opts, body.lstrip("\n")
        opts[m.group(1)] = m.group(2).strip()
        body = body[m.end():]


def ref_targets(sources: list[Path], numbers: dict[str, int]) -> dict[str, tuple[str, str]]:
    """{label: (page stem, link text)} for every `(label)=` target and exercise label."""
    targets = {}
    for src in sources:
        text = src.read_text()
        for m in re.finditer(r"^# \(([\w-]+)\)=\n(?:#?\n|# %% \[markdown\]\n)*# #+ (.+)$", text, re.M):
            targets[m.group(1)] = (src.stem, m.group(2).strip())
        k = 0
        for m in re.finditer(r"\{exercise\}[ \t]*(.*)\n# :label: ([\w-]+)", text):
            k += 1
            n = numbers.get(src.stem)
            targets[m.group(2)] = (src.stem, f"Exercise {n}.{k}" if n else f"Exercise {k}")
    # Pages written in MyST directly (no notebook): their labelled headings.
    for page in MYST_PAGES:
        for m in re.finditer(r"^\(([\w-]+)\)=\n+#+ (.+)$", (OUT / f"{page}.md").read_text(), re.M):
            targets[m.group(1)] = (page, m.group(2).strip())
    return targets


def plain_markdown(text: str, page: str, base: str, targets: dict[str, tuple[str, str]], numbers: dict[str, int],
                   counter: list[int]) -> str:
    """One MyST markdown cell as plain Markdown (CommonMark + HTML) for Colab and Jupyter.

    Args:
        counter: [exercises numbered so far on this page], advanced in place.
    Raises:
        SystemExit: a directive or role this conversion does not know (so none slips through).
    """
    def directive(m: re.Match) -> str:
        name, arg = m.group("name"), m.group("arg").strip()
        opts, body = _options(m.group("body"))
        body = FENCE.sub(directive, body).rstrip()
        if name == "exercise":
            counter[0] += 1
            n = numbers.get(page)
            num = f"{n}.{counter[0]}" if n else f"{counter[0]}"
            # An HTML anchor keeps the label (the grader and in-notebook links find the exercise by it).
            anchor = f'<a id="{opts["label"]}"></a>\n\n' if "label" in opts else ""
            return f"### Exercise {num}: {arg}\n\n{anchor}{body}\n"
        if name == "solution":
            return f"<details><summary>Solution</summary>\n\n{body}\n\n</details>\n"
        if name in ("warning", "note", "tip", "important", "caution", "attention"):
            return "\n".join(f"> {line}" if line else ">" for line in [f"**{name.capitalize()}**", ""] + body.splitlines()) + "\n"
        raise SystemExit(f"{page}: no plain-Markdown form for the {{{name}}} directive; add one to {__file__}")

    def ref(m: re.Match) -> str:
        text, label = (m.group(1), m.group(2)) if m.group(2) else (None, m.group(3))
        if label not in targets:
            raise SystemExit(f"{page}: {{ref}} to unknown label {label!r}")
        where, title = targets[label]
        return f"[{text or title}]({base}book/{where}.html#{label})"

    out = TARGET.sub("", FENCE.sub(directive, text))
    out = REF.sub(ref, out)
    left = re.search(r"\{[a-z]+\}`|^(`{3,}|:{3,})\{", out, re.M)
    if left:
        raise SystemExit(f"{page}: MyST syntax left in the plain notebook: {out[left.start():left.start() + 40]!r}")
    return out


def plain(nb: nbformat.NotebookNode, page: str, base: str, targets: dict, numbers: dict) -> nbformat.NotebookNode:
    """The plain-Markdown form of a built notebook (a copy)."""
    nb = nbformat.from_dict(nbformat.v4.upgrade(nb) if nb.nbformat < 4 else nb)
    nb = nbformat.reads(nbformat.writes(nb), as_version=4)
    counter = [0]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = plain_markdown(cell.source, page, base, targets, numbers, counter)
        cell.metadata.pop("mystnb", None)
    nb.cells = [c for c in nb.cells if c.cell_type != "markdown" or c.source.strip()]
    return nb


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
            label_folds(cell)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",
        "colab": {"provenance": [], "gpuType": "T4"},
    }
    nb.nbformat, nb.nbformat_minor = 4, 5
    return tag_exercise_cells(nb)


def _write(path: Path, text: str) -> None:
    """Write atomically: a reader (or an interrupted run) never sees half a notebook."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    args = parser.parse_args(argv)
    url = repo_url()
    base, numbers = pages_url(url), chapter_numbers()
    sources = sorted(SRC.glob("*.py"))
    targets = ref_targets(sources, numbers)
    stale = []
    in_book_order = []
    for src in sources:
        nb = build(src, url)
        in_book_order += [c.metadata["exercise"] for c in nb.cells if c.metadata.get("exercise")]
        myst = OUT / f"{src.stem}.md"
        myst_text = jupytext.writes(nb, fmt="md:myst")
        if not args.check and (not myst.exists() or myst.read_text() != myst_text):
            _write(myst, myst_text)  # build-only (not committed), so never "stale"
        target = OUT / f"{src.stem}.ipynb"
        text = nbformat.writes(plain(nb, src.stem, base, targets, numbers), version=4) + "\n"
        if not target.exists() or target.read_text() != text:
            stale.append(target)
            if not args.check:
                _write(target, text)
    # The instructors' page includes the exercises' table, generated from their declarations.
    table = OUT / "generated" / "exercises.md"
    text = ("<!-- Generated by scripts/sync_notebooks.py from the @exercise declarations; do not edit. -->\n"
            + exercise_table(order=in_book_order))
    if not table.exists() or table.read_text() != text:
        stale.append(table)
        if not args.check:
            table.parent.mkdir(exist_ok=True)
            _write(table, text)
    for t in stale:
        print(("stale: " if args.check else "wrote ") + str(t.relative_to(ROOT)))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
