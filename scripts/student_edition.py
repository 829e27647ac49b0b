"""The student edition: a book without solutions, notebooks without them, and the package.

    python scripts/student_edition.py build OUT [--cache DIR] [--package-url URL]
                                                          # all of it into OUT (make book-student)
    python scripts/student_edition.py config              # print the student _config.yml
    python scripts/student_edition.py notebooks OUT_DIR   # write solution-free notebooks

``build`` runs Jupyter Book in a private folder and keeps only what students may have: the
pages (``OUT/_build/html``), the notebooks to hand out and the package's wheel
(``OUT/notebooks``). Nothing else of the build (its executed notebooks in
``jupyter_execute/``, its doctrees), which still hold every solution, ever lands under
``OUT``; and ``OUT`` is replaced as a whole, so nothing of an older build stays there either.

The pages hide solutions through sphinx-exercise's ``hide_solutions``, and the book's
extension withholds, in the student build only, every output that answers an exercise
(cells marked ``memlab: {reveals: <label>}`` in book/src: the "Show the answer" folds, a
measurement shown after a check, an explorer's points that are an answer). The instructors'
page (grading, the sandbox, how the checks decide) is left out of the student table of
contents, so it is neither built nor linked. The notebooks in the repository keep their
solutions (in dropdowns), so the student edition has no launch, download, repository or
issues buttons that would lead to them; instructors hand out the notebooks this script
writes instead (students open them in Colab with File > Upload notebook).

In those notebooks: no solution, no link into the full book or the repository (a link's
text stays, in italics), a cell whose output answers an exercise comes after that
exercise's check cell, and the set-up cell tells the checks that this is the student
edition (a second wrong try then points to the instructor, not to a solution). The set-up
cell installs the package only, never the repository: from the wheel ``build`` writes beside
the notebooks (``cuda_memory_lab-VERSION-py3-none-any.whl``, the package's modules and
recorded results and nothing of ``book/``), which students upload with the notebook, or
from ``--package-url`` where the course hosts that wheel.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


# The set-up cell of the handed-out notebooks: the package, from its wheel, never the repository.
STUDENT_SETUP = '''\
# Set-up. In Colab (or anywhere the helper package is missing) this installs it from
# {origin}.
# Its torch requirement is only a lower bound (>=2.4): the torch Colab ships stays.
import glob, importlib.metadata
try:
    importlib.metadata.version("{dist}")
except importlib.metadata.PackageNotFoundError:
    _wheel = {source}
    if not _wheel:
        raise SystemExit("The helper package is not installed: upload {wheel} "
                         "(from your instructor) next to this notebook and run this cell again.")
    %pip install --quiet "$_wheel"
import experiments'''
ORIGIN_WHEEL = ("its wheel, which your instructor hands out with this notebook: upload\n"
                "# {wheel} next to it (in Colab: the folder\n# icon on the left, then Upload)")
ORIGIN_URL = "the address your course gives for the package:\n# {url}"
DIST = "cuda-memory-lab"


def wheel_name() -> str:
    """The file name of the package's wheel (pure Python), from pyproject.toml's version."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"cuda_memory_lab-{version}-py3-none-any.whl"


def setup_source(package_url: str | None = None) -> str:
    """The handed-out notebooks' set-up cell (:data:`STUDENT_SETUP`): it installs the wheel
    uploaded beside the notebook, or the one at ``package_url``."""
    wheel = wheel_name()
    if package_url:
        return STUDENT_SETUP.format(origin=ORIGIN_URL.format(url=package_url), dist=DIST, wheel=wheel,
                                    source=repr(f"{DIST} @ {package_url}"))
    return STUDENT_SETUP.format(origin=ORIGIN_WHEEL.format(wheel=wheel), dist=DIST, wheel=wheel,
                                source="next(iter(sorted(glob.glob('cuda_memory_lab-*.whl'))), None)")


def student_toc() -> dict:
    """The table of contents without the instructors' page."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())

    def keep(entries: list) -> list:
        out = []
        for e in entries:
            if isinstance(e, dict) and e.get("file", "").endswith("instructors"):
                continue
            if isinstance(e, dict):
                e = {**e, **{k: keep(v) for k, v in e.items() if k in ("chapters", "sections", "parts")}}
            out.append(e)
        return out

    toc["parts"] = [p for p in keep(toc.get("parts", [])) if p.get("chapters")]
    return toc


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
    """Write the handed-out notebooks (one per page of the book) into ``out``; their set-up
    cell installs the package's wheel (:func:`setup_source`)."""
    out.mkdir(parents=True, exist_ok=True)
    addresses = full_book_addresses()
    setup = setup_source(package_url)
    written = []
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = strip_book_links(strip_solutions(cell.source), addresses)
            elif "colab-setup" in cell.metadata.get("tags", []):
                cell.source = setup + "\n" + EDITION
        nb.cells = [c for c in nb.cells if c.cell_type != "markdown" or c.source.strip()]
        after_their_check(nb)
        target = out / path.name
        nbformat.write(nb, target)
        written.append(target)
    return written


def write_wheel(out: Path) -> Path:
    """Build the package's wheel into ``out`` (pip, no dependencies, no network); its path.

    Raises:
        RuntimeError: pip failed (its last lines are the message).
    """
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True)
    path = out / wheel_name()
    if r.returncode != 0 or not path.exists():
        raise RuntimeError("building the wheel failed: " + (r.stderr or r.stdout)[-2000:])
    for leftover in ROOT.glob("build"):  # setuptools' build folder, not ours to keep
        if (leftover / "lib").exists():
            shutil.rmtree(leftover, ignore_errors=True)
    return path


def build(out: Path, *, cache: Path | None = None, package_url: str | None = None) -> Path:
    """Build the whole student edition into ``out`` (replaced): ``_build/html`` (the pages),
    ``notebooks/`` (the notebooks to hand out, and the package's wheel). Jupyter Book runs in
    a private folder beside ``out``, removed afterwards: nothing else of its build reaches
    ``out``. Returns ``out``.

    Raises:
        RuntimeError: the book or the wheel did not build (the log's end is the message).
    """
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
    try:
        config = student_config()
        if cache is not None:
            config["execute"]["cache"] = str(cache)
        (work / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        (work / "_toc.yml").write_text(yaml.safe_dump(student_toc(), sort_keys=False))
        env = {**os.environ, "CUDA_MEMLAB_STATIC": "1"}
        env.setdefault("CUDA_MEMLAB_MODE", "recorded")
        jb = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--path-output", str(work / "out"),
              "--config", str(work / "_config.yml"), "--toc", str(work / "_toc.yml"), "--warningiserror", "--keep-going"]
        r = subprocess.run(jb, capture_output=True, text=True, env=env, cwd=ROOT)
        if r.returncode != 0:
            raise RuntimeError("the student book did not build:\n" + r.stdout[-4000:] + r.stderr[-4000:])
        staged = work / "staged"
        (staged / "_build").mkdir(parents=True)
        shutil.move(str(work / "out" / "_build" / "html"), str(staged / "_build" / "html"))
        write_notebooks(staged / "notebooks", package_url=package_url)
        write_wheel(staged / "notebooks")
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(staged), str(out))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help="the whole student edition: pages, notebooks, the package's wheel")
    b.add_argument("out", type=Path)
    b.add_argument("--cache", type=Path, help="an execution cache to reuse (default: the full book's)")
    b.add_argument("--package-url", help="where the set-up cell installs the package from (pip's URL form)")
    sub.add_parser("config", help="print the student _config.yml")
    nbs = sub.add_parser("notebooks", help="write solution-free notebooks to hand out")
    nbs.add_argument("out", type=Path)
    nbs.add_argument("--package-url", help="where the set-up cell installs the package from (pip's URL form)")
    args = parser.parse_args(argv[1:])
    if args.what == "build":
        out = build(args.out, cache=args.cache, package_url=args.package_url)
        print(f"The student book is at file://{out}/_build/html/index.html")
        print(f"Notebooks without solutions, and the package's wheel, to hand out: {out}/notebooks")
        return 0
    if args.what == "config":
        print(yaml.safe_dump(student_config(), sort_keys=False))
        return 0
    for p in write_notebooks(args.out, package_url=args.package_url):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
