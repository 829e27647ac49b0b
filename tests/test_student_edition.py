"""The student edition leaves solutions out of the pages and of the notebooks handed out."""
import importlib.util
from pathlib import Path

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
        assert [c.source for c in student.cells if c.cell_type == "code"] == \
            [c.source for c in original.cells if c.cell_type == "code"]


def test_student_config_hides_solutions_and_the_ways_to_the_full_notebooks():
    config = student_edition.student_config()
    assert config["sphinx"]["config"]["hide_solutions"] is True
    assert config["launch_buttons"] == {}
    assert config["html"]["use_download_button"] is False
    assert config["sphinx"]["config"]["memlab_student"] is True      # the extension drops the button
    assert config["sphinx"]["config"]["html_copy_source"] is False   # no _sources/ with solutions
