"""The student edition leaves solutions out of the pages and of the notebooks handed out, and
leads nowhere near them: no link into the full book or the repository, no output that answers
an exercise before its check (issue 16)."""
import importlib.util
import re
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
student_edition = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_edition)


def test_strip_solutions_keeps_exercises_and_nested_code():
    text = ("```{exercise} Predict\n:label: ex-a\nHow much?\n```\n\n"
            "````{solution} ex-a\n:class: dropdown\nLike this:\n```python\nx = 1\n```\n````\n\nAfter.\n"
            ":::{solution} ex-b\nColons too.\n:::\n")
    out = student_edition.strip_solutions(text)
    assert "{exercise} Predict" in out and "How much?" in out and "After." in out
    assert "solution" not in out and "x = 1" not in out and "Colons" not in out


def test_student_notebooks_have_every_exercise_and_no_solution(tmp_path):
    written = student_edition.write_notebooks(tmp_path)
    assert written, "no notebook written"
    assert {p.name for p in written} == {p.name for p in (ROOT / "book").glob("*.ipynb")}
    for path in written:
        original = nbformat.read(ROOT / "book" / path.name, as_version=4)
        student = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in student.cells)
        assert "{solution}" not in text and "<summary>Solution" not in text
        assert text.count("### Exercise ") == "\n".join(c.source for c in original.cells).count("### Exercise ")
        # every code cell is handed out; only the set-up cell changes (it installs the package's
        # wheel and names the edition)
        theirs = [c.source for c in student.cells if c.cell_type == "code"]
        ours = [c.source for c in original.cells if c.cell_type == "code"]
        assert sorted(theirs[1:]) == sorted(ours[1:]) and theirs[0].startswith(student_edition.setup_source())
        assert 'os.environ["CUDA_MEMLAB_EDITION"] = "student"' in theirs[0]


def test_handed_out_notebooks_link_nowhere_near_the_solutions(tmp_path):
    addresses = student_edition.full_book_addresses()
    assert "https://cuda-memory-lab.github.io/cuda-memory-lab" in addresses
    links = 0
    for path in student_edition.write_notebooks(tmp_path):
        original = nbformat.read(ROOT / "book" / path.name, as_version=4)
        links += sum(md.count(a) for md in (c.source for c in original.cells if c.cell_type == "markdown")
                     for a in addresses[2:])
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                assert not any(a in cell.source for a in addresses), (path.name, cell.source[:200])
    assert links >= 15  # the issue counted 15 links into the full book in the chapters' notebooks


def test_an_output_that_answers_an_exercise_comes_after_its_check(tmp_path):
    """Cells marked `memlab: {reveals: label}` in book/src (the answer folds, the explorer above
    exercise 1.1) run after that exercise's check cell in the handed-out notebooks."""
    marked = 0
    for path in student_edition.write_notebooks(tmp_path):
        nb = nbformat.read(path, as_version=4)
        check = {c.metadata["exercise"]: i for i, c in enumerate(nb.cells) if c.metadata.get("exercise")}
        for i, cell in enumerate(nb.cells):
            label = cell.metadata.get("memlab", {}).get("reveals")
            if label:
                marked += 1
                assert i > check[label], (path.name, label, cell.source[:80])
    sources = [jupytext.read(p) for p in sorted((ROOT / "book" / "src").glob("ch*.py"))]
    in_src = sum(1 for nb in sources for c in nb.cells if c.metadata.get("memlab", {}).get("reveals"))
    assert marked == in_src >= 4
    # exercise 1.1's explorer stood above the exercise in the book: in the notebook it follows the check
    ch1 = nbformat.read(tmp_path / "ch1_caching_allocator.ipynb", as_version=4)
    explorer = [i for i, c in enumerate(ch1.cells) if c.source.strip() == 'ex.panel("alloc.timeline", al.plot_timeline)']
    check = [i for i, c in enumerate(ch1.cells) if c.metadata.get("exercise") == "ex-alloc-predict-timeline"]
    assert explorer == [check[0] + 1]
    assert "comes after the next exercise's check cell" in ch1.cells[explorer[0] - 3].source \
        or any("comes after the next exercise's check cell" in c.source for c in ch1.cells[:check[0]])


def test_the_package_url_can_be_the_courses_own(tmp_path):
    [setup] = [c for c in nbformat.read(student_edition.write_notebooks(
        tmp_path, package_url="https://example.org/course/cuda_memory_lab-0.1.0-py3-none-any.whl")[0],
        as_version=4).cells if "colab-setup" in c.metadata.get("tags", [])]
    assert "cuda-memory-lab @ https://example.org/course/" in setup.source and "github.com" not in setup.source


def test_student_config_hides_solutions_and_the_ways_to_the_full_notebooks():
    config = student_edition.student_config()
    assert config["sphinx"]["config"]["hide_solutions"] is True
    assert config["launch_buttons"] == {}
    assert config["html"]["use_download_button"] is False
    assert config["sphinx"]["config"]["memlab_student"] is True      # the extension drops the button
    assert config["sphinx"]["config"]["html_copy_source"] is False   # no _sources/ with solutions
    assert config["html"]["use_repository_button"] is False and config["html"]["use_issues_button"] is False


def test_handed_out_notebooks_install_the_package_not_the_repository(tmp_path):
    """Issue 27: the handed-out notebooks' set-up cell installed from the repository, whose
    notebooks keep their solutions. It must name the package only (its wheel), never the
    repository, the full book, or a git URL."""
    addresses = student_edition.full_book_addresses()
    for path in student_edition.write_notebooks(tmp_path):
        nb = nbformat.read(path, as_version=4)
        [setup] = [c for c in nb.cells if "colab-setup" in c.metadata.get("tags", [])]
        assert "git+" not in setup.source and not any(a in setup.source for a in addresses), (path.name, setup.source)
        assert "cuda_memory_lab-" in setup.source and ".whl" in setup.source, setup.source
