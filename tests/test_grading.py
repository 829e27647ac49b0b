"""The instructors' grader on a set of submissions made from the student notebooks.

Expected rows come from the exercises' solutions (the book's text) and the rules in
the issue: a right answer scores its points, a check redefined in the notebook changes
nothing, a deleted check cell is 'missing', a cell that raises is 'error', the time
limit gives 'timeout' for what had not finished, and grading goes on after an error.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from experiments.core import grading

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
student_edition = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_edition)

CH3 = "ch3_pinned_memory.ipynb"
# Right answers, from the solutions of chapter 3: guard (c), 2.08 GiB pins 4 GiB, 18 and
# 18 MiB owned, the replay delivers 3.
RIGHT = {
    "ex-pinned-guard": ('answer = None', 'answer = "c"'),
    "ex-pinned-rounding": ("answer_gib = None", "answer_gib = 4"),
    "ex-pinned-owned": (("after_e = None", "after_e = 18"),
                        ("after_device_empty_cache = None", "after_device_empty_cache = 18.0")),
    "ex-pinned-graph": ("answer_value = None", "answer_value = 3.0"),
}
WRONG = {
    "ex-pinned-guard": ('answer = None', 'answer = "b"'),
    "ex-pinned-rounding": ("answer_gib = None", "answer_gib = 2.08"),
    "ex-pinned-owned": (("after_e = None", "after_e = 13"),
                        ("after_device_empty_cache = None", "after_device_empty_cache = 0")),
    "ex-pinned-graph": ("answer_value = None", "answer_value = 7.0"),
}
GPU_ROW = ("ex-pinned-loader", 0, 0, "needs_gpu")

CH1 = "ch1_caching_allocator.ipynb"
# Chapter 1's solutions: 80 and 64 MiB; 176 MiB and "group"; the two functions as the
# solutions write them (one with `import math` in its cell: a module the function uses); "b".
CH1_RIGHT = {
    "ex-alloc-predict-timeline": ("al.check_timeline_prediction(None, None)", "al.check_timeline_prediction(80, 64)"),
    "ex-alloc-oom-reading": ("al.check_oom_reading(None, None)", 'al.check_oom_reading(176, "group")'),
    "ex-alloc-frag-index": (("    return None  # your code here",
                             '    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]\n'
                             "    return 0.0 if not free else 1 - max(free) / sum(free)"),
                            ("al.check_frag_index(None)", "al.check_frag_index(frag_index)")),
    "ex-alloc-pages": (("def mapped(k, s):\n    return None  # your code here",
                        "import math\n\ndef mapped(k, s):\n    return 20 * math.ceil(k * s / 20)"),
                       ("al.check_reserved_function(None)", "al.check_reserved_function(mapped)")),
    "ex-alloc-22": ("al.check_pool_boundary_choice(None)", 'al.check_pool_boundary_choice("b")'),
}


def _student(tmp_path: Path, name: str, trim: bool = True) -> nbformat.NotebookNode:
    """The student notebook as handed out; ``trim``: only its set-up and import cells and the
    check cells run (the text stays), which halves the time a grade takes on CI."""
    out = tmp_path / "student"
    if not (out / name).exists():
        student_edition.write_notebooks(out)
    nb = nbformat.read(out / name, as_version=4)
    if trim:
        code = [c for c in nb.cells if c.cell_type == "code"]
        keep = {id(c) for c in code[:2]} | {id(c) for c in code if c.metadata.get("exercise")}
        nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or id(c) in keep]
    return nb


def _cell(nb, label):
    [cell] = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("exercise") == label]
    return cell


def _answer(nb, answers, only=None):
    for label, edits in answers.items():
        if only is not None and label not in only:
            continue
        cell = _cell(nb, label)
        for old, new in (edits if isinstance(edits[0], tuple) else [edits]):
            assert old in cell.source, (label, old)
            cell.source = cell.source.replace(old, new)
    return nb


def _insert_after(nb, label, source):
    i = nb.cells.index(_cell(nb, label))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    """The submission set, graded once (two at a time): {case: rows}."""
    tmp = tmp_path_factory.mktemp("grading")
    folder = tmp / "class"
    folder.mkdir()
    cases = {}

    cases["right"] = _answer(_student(tmp, CH3), RIGHT)
    cases["wrong"] = _answer(_student(tmp, CH3), WRONG)
    cases["blank"] = _student(tmp, CH3)

    raises = _answer(_student(tmp, CH3), RIGHT)
    _cell(raises, "ex-pinned-rounding").source = "answer_gib = 1 / 0\npinned.check_rounding(answer_gib)"
    _insert_after(raises, "ex-pinned-rounding", "raise RuntimeError('a student bug between two exercises')")
    cases["raises"] = raises

    endless = _answer(_student(tmp, CH3), RIGHT)
    _cell(endless, "ex-pinned-owned").source = "while True:\n    pass\n" + _cell(endless, "ex-pinned-owned").source
    cases["endless"] = endless

    # A student who makes every check (and the shared comparisons) pass, then answers wrong,
    # and edits one check call on top.
    cheat = _answer(_student(tmp, CH3), WRONG)
    cheat.cells.insert(3, nbformat.v4.new_code_cell(
        "import experiments.core.checks as _c\n"
        "always = lambda *a, **k: _c.Feedback(True, 'correct!')\n"
        "for _name in dir(pinned):\n"
        "    if _name.startswith('check_'):\n"
        "        setattr(pinned, _name, always)\n"
        "_c.check_number = _c.check_choice = always\n"))
    graph = _cell(cheat, "ex-pinned-graph")
    graph.source = graph.source.replace("pinned.check_graph_replay(answer_value)",
                                        "pinned.check_graph_replay(answer_value) or _c.Feedback(True, 'x')")
    cases["cheat"] = cheat

    deleted = _answer(_student(tmp, CH3), RIGHT)
    deleted.cells.remove(_cell(deleted, "ex-pinned-rounding"))
    renamed = _cell(deleted, "ex-pinned-graph")
    renamed.source = "answer_value = 3.0\nprint(answer_value)"
    cases["deleted"] = deleted

    cases["ch1-right"] = _answer(_student(tmp, CH1), CH1_RIGHT)

    paths = []
    for case, nb in cases.items():
        path = folder / f"{case}.ipynb"
        nbformat.write(nb, path)
        paths.append(path)
    t0 = time.perf_counter()
    rows = grading.grade([folder], timeout_s=30, jobs=2)
    elapsed = time.perf_counter() - t0
    print(f"\ngraded {len(paths)} notebooks in {elapsed:.1f} s (two at a time)\n" + grading.rows_to_csv(rows))
    return {p.stem: [r for r in rows if r.notebook == str(p)] for p in paths}, rows


def _table(rows):
    return [(r.exercise, r.score, r.max_score, r.status) for r in rows]


def test_every_answer_right(submissions):
    rows = submissions[0]["right"]
    assert _table(rows) == [("ex-pinned-guard", 1, 1, "correct"), ("ex-pinned-rounding", 1, 1, "correct"),
                            ("ex-pinned-owned", 2, 2, "correct"), ("ex-pinned-graph", 1, 1, "correct"),
                            GPU_ROW, ("total", 5, 5, "")]
    assert all(r.feedback == "correct" for r in rows[:4])


def test_every_answer_wrong_names_the_wrong_parts_only(submissions):
    rows = submissions[0]["wrong"]
    assert _table(rows) == [("ex-pinned-guard", 0, 1, "wrong"), ("ex-pinned-rounding", 0, 1, "wrong"),
                            ("ex-pinned-owned", 0, 2, "wrong"), ("ex-pinned-graph", 0, 1, "wrong"),
                            GPU_ROW, ("total", 0, 5, "")]
    assert rows[2].feedback == ("wrong: the memory owned right after e is pinned, "
                                "the memory owned after torch.cuda.empty_cache()")
    assert rows[0].feedback == "wrong: your option"


def test_blank_is_unanswered(submissions):
    rows = submissions[0]["blank"]
    assert [r.status for r in rows] == ["unanswered"] * 4 + ["needs_gpu", ""]
    assert rows[-1].score == 0 and rows[-1].max_score == 5


def test_a_raising_cell_is_an_error_and_grading_goes_on(submissions):
    rows = submissions[0]["raises"]
    assert _table(rows) == [("ex-pinned-guard", 1, 1, "correct"), ("ex-pinned-rounding", 0, 1, "error"),
                            ("ex-pinned-owned", 2, 2, "correct"), ("ex-pinned-graph", 1, 1, "correct"),
                            GPU_ROW, ("total", 4, 5, "")]
    assert rows[1].feedback == "its cell raised ZeroDivisionError: division by zero"


def test_an_endless_loop_is_stopped_and_scored_as_far_as_it_ran(submissions):
    rows = submissions[0]["endless"]
    assert _table(rows) == [("ex-pinned-guard", 1, 1, "correct"), ("ex-pinned-rounding", 1, 1, "correct"),
                            ("ex-pinned-owned", 0, 2, "timeout"), ("ex-pinned-graph", 0, 1, "timeout"),
                            GPU_ROW, ("total", 2, 5, "")]
    assert "time limit (30 s)" in rows[2].feedback


def test_a_redefined_check_gains_nothing(submissions):
    rows = submissions[0]["cheat"]
    assert _table(rows) == _table(submissions[0]["wrong"])


def test_a_deleted_check_cell_is_missing(submissions):
    rows = submissions[0]["deleted"]
    # rows in the book's order, as for every other student
    assert _table(rows) == [("ex-pinned-guard", 1, 1, "correct"), ("ex-pinned-rounding", 0, 1, "missing"),
                            ("ex-pinned-owned", 2, 2, "correct"), ("ex-pinned-graph", 0, 1, "missing"), GPU_ROW,
                            ("total", 3, 5, "")]
    assert "no longer calls check_graph_replay" in rows[3].feedback


def test_function_answers_are_scored_from_their_source(submissions):
    rows = submissions[0]["ch1-right"]
    assert _table(rows) == [("ex-alloc-predict-timeline", 2, 2, "correct"), ("ex-alloc-oom-reading", 2, 2, "correct"),
                            ("ex-alloc-frag-index", 3, 3, "correct"), ("ex-alloc-pages", 3, 3, "correct"),
                            ("ex-alloc-22", 1, 1, "correct"), ("total", 11, 11, "")]


def test_a_function_that_never_returns_times_out_in_scoring():
    from experiments.core.checks import EXERCISES
    from experiments.core.grading_answers import encode

    grading.exercises()
    loop = {"$": "function", "name": "frag_index", "globals": {},
            "source": "def frag_index(segments):\n    while True:\n        pass\n"}
    result = grading._score_in_subprocess(EXERCISES["ex-alloc-frag-index"], {"fn": loop}, mode="recorded",
                                          timeout_s=8)
    assert result == {"timeout": "scoring the answer took longer than 8 s"}
    assert encode((1, [2.5, None], {"a": float("nan")}))["$"] == "tuple"


def test_csv_and_json_have_the_columns(submissions):
    rows = submissions[1]
    text = grading.rows_to_csv(rows)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0]) == list(grading.COLUMNS)
    assert len(parsed) == len(rows) == 8 * 6  # five exercises and the total, in each of eight notebooks
    assert parsed[5] == {"notebook": rows[5].notebook, "exercise": "total", "score": "0",
                         "max_score": "5", "status": "", "feedback": rows[5].feedback}


def test_student_notebooks_carry_one_tag_per_exercise_of_their_chapter(tmp_path):
    exs = grading.exercises()
    for path in student_edition.write_notebooks(tmp_path):
        nb = nbformat.read(path, as_version=4)
        tagged = [(i, c.metadata["exercise"]) for i, c in enumerate(nb.cells) if c.metadata.get("exercise")]
        if not tagged:
            continue
        chapter = nb.metadata["memlab"]["chapter"]
        assert sorted(label for _, label in tagged) == sorted(e.label for e in exs.values() if e.chapter == chapter)
        assert nb.metadata["memlab"]["exercises"] == [label for _, label in tagged]  # the book's order
        for i, label in tagged:
            # the check cell calls its check, after the exercise's text
            assert grading.find_check_call(nb.cells[i].source, exs[label].check_name), label
            assert any(label in c.source for c in nb.cells[:i] if c.cell_type == "markdown"), label


def _cli(args, capsys):
    from experiments.core import cli

    code = cli.main(["grade", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a notebook")
    (tmp_path / "broken.ipynb").write_text("{ this is not json")
    (tmp_path / "other.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print(1)")])))
    for bad, words in [(tmp_path / "empty", "without any .ipynb"), (tmp_path / "notes.txt", "not a notebook"),
                       (tmp_path / "broken.ipynb", "not a valid notebook"), (tmp_path / "nothing.ipynb", "does not exist"),
                       (tmp_path / "other.ipynb", "no exercise of the book")]:
        code, out, err = _cli([bad, "--out", tmp_path / "g.csv"], capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, (bad, err)
        assert str(bad) in err and err.startswith("error: ")
    assert not (tmp_path / "g.csv").exists()
    code, out, err = _cli([tmp_path / "other.ipynb", "--timeout", "0"], capsys)
    assert code == 2 and "--timeout must be > 0" in err


def test_cli_writes_the_csv_atomically_and_json(submissions, tmp_path, capsys, monkeypatch):
    rows = submissions[0]["right"]
    monkeypatch.setattr(grading, "grade", lambda paths, **kw: rows)
    out_csv = tmp_path / "grades.csv"
    code, out, err = _cli(["x.ipynb", "--out", out_csv], capsys)
    assert code == 0 and out == "" and "(5 exercise rows)" in err
    lines = out_csv.read_text().splitlines()
    assert lines[0] == "notebook,exercise,score,max_score,status,feedback"
    assert lines[1].endswith(",ex-pinned-guard,1,1,correct,correct")
    assert lines[-1].endswith(",total,5,5,,\"4 correct, 1 needs_gpu\"")
    assert [p.name for p in tmp_path.iterdir()] == ["grades.csv"]  # no temporary file left
    code, out, err = _cli(["x.ipynb", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data[0] == {"notebook": rows[0].notebook, "exercise": "ex-pinned-guard", "score": 1.0,
                                     "max_score": 1.0, "status": "correct", "feedback": "correct"}
    assert [set(d) for d in data] == [set(grading.COLUMNS)] * len(rows)


def test_answers_round_trip_as_json_and_code_stays_out_of_the_grader():
    from experiments.core.grading_answers import Opaque, decode, encode, has_code

    value = {"unprotected": 1, "stall": None, "x": [2.5, "none", (True, float("inf"))]}
    wire = json.loads(json.dumps(encode(value)))
    assert decode(wire) == value
    assert isinstance(decode(json.loads(json.dumps(encode(object())))), Opaque)
    for crafted in ({"$": "module", "name": "antigravity"}, {"$": "import", "module": "os", "name": "system"},
                    {"$": "function", "name": "f", "source": "def f(): pass", "globals": {}}):
        assert has_code(crafted)
        with pytest.raises(ValueError, match="scoring subprocess"):
            decode(crafted)


def _solution_code(src: Path, label: str) -> str:
    """The first python code block of an exercise's solution in a chapter source."""
    text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in src.read_text().splitlines())
    block = re.search(r"\{solution\} " + re.escape(label) + r".*?```python\n(.*?)```", text, re.S)
    assert block, label
    return block.group(1)


def test_solution_code_is_found_for_the_gpu_loader():
    code = _solution_code(ROOT / "book" / "src" / "ch3_pinned_memory.py", "ex-pinned-loader")
    assert code.startswith("def my_loader(batches, n_buffers=2):") and "yield out" in code


@pytest.mark.gpu
def test_live_grading_scores_the_gpu_exercise(tmp_path):
    """On a GPU: chapter 3 answered as its solutions say, the loader included, graded live."""
    nb = _answer(_student(tmp_path, CH3), RIGHT)
    loader = _cell(nb, "ex-pinned-loader")
    code = _solution_code(ROOT / "book" / "src" / "ch3_pinned_memory.py", "ex-pinned-loader")
    blank = "my_loader = None  # replace with your generator function my_loader(batches, n_buffers)"
    assert blank in loader.source
    loader.source = loader.source.replace(blank, code)
    path = tmp_path / "live.ipynb"
    nbformat.write(nb, path)
    rows = grading.grade_notebook(path, timeout_s=300, live=True)
    assert _table(rows) == [("ex-pinned-guard", 1, 1, "correct"), ("ex-pinned-rounding", 1, 1, "correct"),
                            ("ex-pinned-owned", 2, 2, "correct"), ("ex-pinned-graph", 1, 1, "correct"),
                            ("ex-pinned-loader", 3, 3, "correct"), ("total", 8, 8, "")]
