"""The instructors' grader on a set of submissions made from the student notebooks.

Expected rows come from the exercises' solutions (the book's text), the lab GPU's
recordings, and the rules in the issues: a right answer scores its points, a check
redefined in the notebook changes nothing, a deleted check cell is 'missing', a cell that
raises is 'error', the time limit gives 'timeout' for what had not finished, and grading
goes on after an error. Every notebook runs in the sandbox (tests/test_grading_hostile.py
attacks it).
"""
from __future__ import annotations

import concurrent.futures
import csv
import importlib.util
import io
import json
import re
import time
from pathlib import Path

import nbformat
import pytest

from experiments.grading import grader as grading
from experiments.grading import notebooks, wire
from experiments.grading.sandbox import Limits

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("student_edition", ROOT / "scripts" / "student_edition.py")
student_edition = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_edition)

GENEROUS_S = 600   # the grader's default limit per notebook: no notebook that ends meets it
ENDLESS_S = 90     # the one that never ends: well past its first cells on a loaded 2-core machine

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
# solutions write them (one with `import math` in its cell: a module the function uses); "b";
# neither knob helps the training loop ("d").
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
    "ex-alloc-doctor": ("al.check_doctor_setting(None)", 'al.check_doctor_setting("d")'),
}
CH1_WRONG = {
    "ex-alloc-predict-timeline": ("al.check_timeline_prediction(None, None)", "al.check_timeline_prediction(128, 128)"),
    "ex-alloc-oom-reading": ("al.check_oom_reading(None, None)", 'al.check_oom_reading(240, "empty_cache")'),
    "ex-alloc-frag-index": (("    return None  # your code here", "    return 0.5"),
                            ("al.check_frag_index(None)", "al.check_frag_index(frag_index)")),
    "ex-alloc-pages": (("def mapped(k, s):\n    return None  # your code here", "def mapped(k, s):\n    return k * s"),
                       ("al.check_reserved_function(None)", "al.check_reserved_function(mapped)")),
    "ex-alloc-22": ("al.check_pool_boundary_choice(None)", 'al.check_pool_boundary_choice("a")'),
    "ex-alloc-doctor": ("al.check_doctor_setting(None)", 'al.check_doctor_setting("a")'),
}
CH1_LABELS = list(CH1_RIGHT)

CH2 = "ch2_cross_stream.ipynb"
# Chapter 2's solutions: blocks 1, 1, 4, 2; peak about 1024 MiB; allocated about one 64 MiB
# buffer; the stall comes from waiting on record_stream's events (b); copy_in waits (c); at world
# size 1 limit_all_gathers bounds nothing (b).
CH2_RIGHT = {
    "ex-streams-blocks": ('{"unprotected": None, "stall": None, "record_stream": None, "event": None}',
                          '{"unprotected": 1, "stall": 1, "record_stream": 4, "event": 2}'),
    "ex-streams-peak": ("my_peak_mib = None", "my_peak_mib = 1024"),
    "ex-streams-allocated": ("my_allocated_mib = None", "my_allocated_mib = 64"),
    "ex-streams-cap": ("streams.check_cap_stall(None)", 'streams.check_cap_stall("b")'),
    "ex-streams-alloc-stream": ("streams.check_allocation_stream(None)", 'streams.check_allocation_stream("c")'),
    "ex-streams-fsdp-limit": ("streams.check_fsdp_limit(None)", 'streams.check_fsdp_limit("b")'),
}
CH2_WRONG = {
    "ex-streams-blocks": ('{"unprotected": None, "stall": None, "record_stream": None, "event": None}',
                          '{"unprotected": 4, "stall": 4, "record_stream": 1, "event": 4}'),
    "ex-streams-peak": ("my_peak_mib = None", "my_peak_mib = 2048"),
    "ex-streams-allocated": ("my_allocated_mib = None", "my_allocated_mib = 2048"),
    "ex-streams-cap": ("streams.check_cap_stall(None)", 'streams.check_cap_stall("c")'),
    "ex-streams-alloc-stream": ("streams.check_allocation_stream(None)", 'streams.check_allocation_stream("d")'),
    "ex-streams-fsdp-limit": ("streams.check_fsdp_limit(None)", 'streams.check_fsdp_limit("a")'),
}
CH4 = "ch4_hidden_syncs.ipynb"
# Chapter 4's solutions: 17.5 and 28 ms; the bubble (b); the five syncing operations; the
# threshold read from the lab's sweep (any value between the last staged size, 2 MiB, and the
# first that waited, 3 MiB).
SYNCING = ("loss.item()", "x2[:, (0, 2, 3)]", "torch.tensor(3.0, device='cuda')", "x[mask]", "src_pinned.to('cuda')")


def _classification(flip: bool) -> tuple[str, str]:
    from experiments.syncs import classification_template

    codes = list(classification_template())
    lines = "".join(f"    {code!r}: {(code in SYNCING) != flip},\n" for code in codes)
    return ("answers = {", "answers = {\n" + lines + "}\n_unused = {")


CH4_RIGHT = {
    "ex-syncs-runahead": (("no_sync_ms = None", "no_sync_ms = 17.5"), ("every_step_ms = None", "every_step_ms = 28")),
    "ex-syncs-bubble": ("bubble_answer = None", 'bubble_answer = "b"'),
    "ex-syncs-threshold": ("threshold_mib = None", "threshold_mib = 2.5"),
}
CH4_WRONG = {
    "ex-syncs-runahead": (("no_sync_ms = None", "no_sync_ms = 16"), ("every_step_ms = None", "every_step_ms = 16")),
    "ex-syncs-bubble": ("bubble_answer = None", 'bubble_answer = "a"'),
    "ex-syncs-threshold": ("threshold_mib = None", "threshold_mib = 0.0625"),
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

    # A loop that never ends (it sleeps: the 2-core test machine's other work keeps its CPU).
    endless = _answer(_student(tmp, CH3), RIGHT)
    _cell(endless, "ex-pinned-owned").source = ("import time\nwhile True:\n    time.sleep(0.5)\n"
                                                + _cell(endless, "ex-pinned-owned").source)

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
    cases["ch1-wrong"] = _answer(_student(tmp, CH1), CH1_WRONG)
    cases["ch1-blank"] = _student(tmp, CH1)
    cases["ch2-right"] = _answer(_student(tmp, CH2), CH2_RIGHT)
    cases["ch2-wrong"] = _answer(_student(tmp, CH2), CH2_WRONG)
    cases["ch2-blank"] = _student(tmp, CH2)
    cases["ch4-right"] = _answer(_answer(_student(tmp, CH4), CH4_RIGHT), {"ex-syncs-classify": _classification(False)})
    cases["ch4-wrong"] = _answer(_answer(_student(tmp, CH4), CH4_WRONG), {"ex-syncs-classify": _classification(True)})
    cases["ch4-blank"] = _student(tmp, CH4)

    paths = []
    for case, nb in cases.items():
        path = folder / f"{case}.ipynb"
        nbformat.write(nb, path)
        paths.append(path)
    (tmp / "endless").mkdir()
    paths.append(tmp / "endless" / "endless.ipynb")
    nbformat.write(endless, paths[-1])
    # Every notebook that ends gets a limit it never meets, however loaded the machine (the 2-core
    # CI machine runs two test workers); the endless one, graded beside them, a short one.
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp, concurrent.futures.ThreadPoolExecutor(1) as pool:
        mp.setenv("CUDA_MEMLAB_MODE", "recorded")   # for the endless notebook's scoring, whenever it ends
        stopper = grading.Grader(limits=Limits(timeout_s=ENDLESS_S))
        try:
            stopper.prepare()
            stopped = pool.submit(stopper.grade_notebook, paths[-1])
            rows = grading.grade([folder], timeout_s=GENEROUS_S, jobs=2)
            rows += stopped.result()
        finally:
            stopper.close()
    elapsed = time.perf_counter() - t0
    print(f"\ngraded {len(paths)} notebooks in {elapsed:.1f} s (three at a time)\n" + grading.rows_to_csv(rows))
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
    assert f"time limit ({ENDLESS_S} s)" in rows[2].feedback


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
    assert _table(rows) == [(label, pts, pts, "correct") for label, pts in zip(CH1_LABELS, (2, 2, 3, 3, 1, 1))] \
        + [("total", 12, 12, "")]


@pytest.mark.parametrize("chapter, labels, gpu", [
    ("ch1", CH1_LABELS, []),
    ("ch2", ["ex-streams-blocks", "ex-streams-peak", "ex-streams-allocated", "ex-streams-cap", "ex-streams-handoff",
             "ex-streams-alloc-stream", "ex-streams-fsdp-limit"], ["ex-streams-handoff"]),
    ("ch4", ["ex-syncs-runahead", "ex-syncs-bubble", "ex-syncs-classify", "ex-syncs-threshold", "ex-syncs-rewrite"],
     ["ex-syncs-rewrite"]),
])
def test_right_wrong_and_blank_of_a_chapter(submissions, chapter, labels, gpu):
    from experiments.core.checks import EXERCISES

    got = {case: _table(submissions[0][f"{chapter}-{case}"]) for case in ("right", "wrong", "blank")}
    points = {label: 0 if label in gpu else EXERCISES[label].points for label in labels}
    total = sum(points.values())
    expect = {
        "right": [(lb, points[lb], points[lb], "needs_gpu" if lb in gpu else "correct") for lb in labels],
        "wrong": [(lb, 0, points[lb], "needs_gpu" if lb in gpu else "wrong") for lb in labels],
        "blank": [(lb, 0, points[lb], "needs_gpu" if lb in gpu else "unanswered") for lb in labels],
    }
    for case, rows in expect.items():
        assert got[case][:-1] == rows, (case, got[case])
        assert got[case][-1] == ("total", total if case == "right" else 0, total, "")


def test_wrong_feedback_names_no_item_of_a_list_answer(submissions):
    rows = {r.exercise: r for r in submissions[0]["ch4-wrong"]}
    assert rows["ex-syncs-classify"].feedback == "wrong: answers"
    assert {r.exercise: r.feedback for r in submissions[0]["ch2-wrong"]}["ex-streams-blocks"] == "wrong: my_blocks"


@pytest.mark.slow  # spins for its 8-s limit: make test runs it, the developer loop does not
def test_a_function_that_never_returns_times_out_in_scoring():
    from experiments.core.checks import EXERCISES

    grader = grading.Grader()
    grader.prepare()
    try:
        notebooks.exercises()
        loop = wire.FunctionAnswer({"name": "frag_index", "globals": {},
                                    "source": "def frag_index(segments):\n    while True:\n        pass\n"})
        t0 = time.monotonic()
        status, text, _ = grader._function(EXERCISES["ex-alloc-frag-index"], loop, deadline=time.monotonic() + 8)
        assert (status, time.monotonic() - t0 < 20) == ("timeout", True), text
    finally:
        grader.close()


def test_csv_and_json_have_the_columns(submissions):
    rows = submissions[1]
    text = grading.rows_to_csv(rows)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0]) == list(grading.COLUMNS)
    ch3 = [r for r in rows if Path(r.notebook).stem in ("right", "wrong", "blank", "raises", "endless", "cheat",
                                                      "deleted")]
    assert len(parsed) == len(rows) and len(ch3) == 7 * 6  # five exercises and the total, in each chapter 3 notebook
    assert parsed[5] == {"notebook": rows[5].notebook, "chapter": "3", "exercise": "total", "score": "0",
                         "max_score": "5", "status": "", "feedback": rows[5].feedback}


def test_student_notebooks_carry_one_tag_per_exercise_of_their_chapter(tmp_path):
    exs = notebooks.exercises()
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
            assert notebooks.find_check_call(nb.cells[i].source, exs[label].check_name), label
            assert any(label in c.source for c in nb.cells[:i] if c.cell_type == "markdown"), label


def _cli(args, capsys):
    from experiments.core import cli

    code = cli.main(["grade", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a notebook")
    for bad, words in [(tmp_path / "empty", "without any .ipynb"), (tmp_path / "notes.txt", "not a notebook"),
                       (tmp_path / "nothing.ipynb", "does not exist")]:
        code, out, err = _cli([bad, "--out", tmp_path / "g.csv"], capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, (bad, err)
        assert str(bad) in err and err.startswith("error: ")
    assert not (tmp_path / "g.csv").exists()
    code, out, err = _cli([tmp_path / "notes.txt", "--timeout", "0"], capsys)
    assert code == 2 and "--timeout must be > 0" in err


def test_a_broken_notebook_gets_an_unreadable_row(tmp_path, capsys):
    (tmp_path / "broken.ipynb").write_text("{ this is not json")
    (tmp_path / "other.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print(1)")])))
    code, out, err = _cli([tmp_path / "broken.ipynb", tmp_path / "other.ipynb", "--out", tmp_path / "g.csv"], capsys)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "g.csv").read_text())))
    assert [(r["exercise"], r["status"], r["score"]) for r in rows] == [("total", "unreadable", "0")] * 2
    assert "not a valid notebook" in rows[0]["feedback"] and "no exercise of the book" in rows[1]["feedback"]


def test_without_a_sandbox_grade_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    from experiments.grading import sandbox

    (tmp_path / "other.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(tmp_path / "no-bwrap"))  # `make test` names one
    code, out, err = _cli([tmp_path / "other.ipynb"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "refusing to run untrusted notebooks unsandboxed: bubblewrap is not installed" in err
    assert "--unsafe-no-sandbox" in err


def test_cli_writes_the_csv_atomically_and_json(submissions, tmp_path, capsys, monkeypatch):
    rows = submissions[0]["right"]
    monkeypatch.setattr(grading, "grade", lambda paths, **kw: rows)
    out_csv = tmp_path / "grades.csv"
    code, out, err = _cli(["x.ipynb", "--out", out_csv], capsys)
    assert code == 0 and out == "" and "(5 exercise rows)" in err
    lines = out_csv.read_text().splitlines()
    assert lines[0] == "notebook,chapter,exercise,score,max_score,status,feedback"
    assert lines[1].endswith(",3,ex-pinned-guard,1,1,correct,correct")
    assert lines[-1].endswith(",total,5,5,,\"4 correct, 1 needs_gpu\"")
    assert [p.name for p in tmp_path.iterdir()] == ["grades.csv"]  # no temporary file left
    code, out, err = _cli(["x.ipynb", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data[0] == {"notebook": rows[0].notebook, "chapter": 3, "exercise": "ex-pinned-guard",
                                     "score": 1.0, "max_score": 1.0, "status": "correct", "feedback": "correct"}
    assert [set(d) for d in data] == [set(grading.COLUMNS)] * len(rows)


def test_answers_cross_as_plain_data_and_code_stays_out_of_the_grader():
    from experiments.grading.capture import encode_answer

    value = {"unprotected": 1, "stall": None, "x": [2.5, "none", (True, float("inf"))]}
    entry = encode_answer(value)
    text = json.dumps({"label": "ex-x", "answers": {"a": entry}})
    assert wire.parse_answers(text, "ex-x", ("a",)) == {"a": {"unprotected": 1, "stall": None,
                                                             "x": [2.5, "none", [True, float("inf")]]}}
    assert encode_answer(object()) == {"not_data": "object"}
    # what used to mean code is a plain dict now: never imported, never run
    for crafted in ({"$": "module", "name": "antigravity"}, {"$": "import", "module": "os", "name": "system"}):
        got = wire.parse_answers(json.dumps({"label": "ex-x", "answers": {"a": {"value": crafted}}}), "ex-x", ("a",))
        assert got == {"a": crafted}
    fn = wire.parse_answers(json.dumps({"label": "ex-x", "answers": {"a": {"function": {
        "name": "f", "source": "import os; os.system('x')", "globals": {}}}}}), "ex-x", ("a",))["a"]
    assert isinstance(fn, wire.FunctionAnswer) and fn.record["source"].startswith("import os")
    for bad in ('{"label": "ex-x", "answers": [1]}', "[1, 2]", "{not json", '{"label": "ex-y", "answers": {}}',
                '{"label": "ex-x", "answers": {"a": {"value": 1, "raised": "E"}}}',
                '{"label": "ex-x", "answers": {"a": {"value": ' + "[" * 50 + "]" * 50 + "}}}",
                '{"label": "ex-x", "answers": {"a": {"value": 1' + "0" * 30 + "}}}",
                '{"label": "ex-x", "answers": {"a": {"function": {"name": "f", "source": 1, "globals": {}}}}}'):
        with pytest.raises(wire.WireError):
            wire.parse_answers(bad, "ex-x", ("a",))
    with pytest.raises(wire.WireError, match="larger than"):
        wire.loads("[" + "1," * (1 << 20) + "1]")


def _solution_code(src: Path, label: str) -> str:
    """The first python code block of an exercise's solution in a chapter source."""
    text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in src.read_text().splitlines())
    block = re.search(r"\{solution\} " + re.escape(label) + r".*?```python\n(.*?)```", text, re.S)
    assert block, label
    return block.group(1)


def test_solution_code_is_found_for_the_gpu_exercises():
    code = _solution_code(ROOT / "book" / "src" / "ch3_pinned_memory.py", "ex-pinned-loader")
    assert code.startswith("def my_loader(batches, n_buffers=2):") and "yield out" in code
    code = _solution_code(ROOT / "book" / "src" / "ch2_cross_stream.py", "ex-streams-handoff")
    assert code.startswith("def my_handoff(") and "producer.wait_event(kept[1])" in code
    code = _solution_code(ROOT / "book" / "src" / "ch4_hidden_syncs.py", "ex-syncs-rewrite")
    assert "def reduce_grad_stats_sync_free(local):" in code and "torch.cat" in code


def _live(tmp_path, name, answers, code_answers):
    """A chapter's notebook answered with ``answers``, and for each GPU exercise the solution's
    code inserted before its check call (``call_old`` becomes ``call_new``), graded live."""
    nb = _answer(_student(tmp_path, name), answers)
    src = ROOT / "book" / "src" / name.replace(".ipynb", ".py")
    for label, (call_old, call_new) in code_answers.items():
        cell = _cell(nb, label)
        assert call_old in cell.source, (label, call_old)
        cell.source = cell.source.replace(call_old, _solution_code(src, label) + "\n\n" + call_new)
    path = tmp_path / f"live-{name}"
    nbformat.write(nb, path)
    return grading.grade_notebook(path, timeout_s=600, live=True)


@pytest.mark.gpu
def test_live_grading_scores_the_gpu_exercise(tmp_path):
    """On a GPU: chapter 3 answered as its solutions say, the loader included, graded live
    (each notebook in the sandbox, with the GPU's device nodes)."""
    rows = _live(tmp_path, CH3, RIGHT, {"ex-pinned-loader": ("pinned.check_loader(my_loader)",
                                                             "pinned.check_loader(my_loader)")})
    assert _table(rows) == [("ex-pinned-guard", 1, 1, "correct"), ("ex-pinned-rounding", 1, 1, "correct"),
                            ("ex-pinned-owned", 2, 2, "correct"), ("ex-pinned-graph", 1, 1, "correct"),
                            ("ex-pinned-loader", 3, 3, "correct"), ("total", 8, 8, "")], \
        [(r.exercise, r.status, r.feedback) for r in rows]


def _all_correct(rows):
    assert [r.status for r in rows[:-1]] == ["correct"] * (len(rows) - 1), [(r.exercise, r.status, r.feedback) for r in rows]
    assert rows[-1].score == rows[-1].max_score > 0


@pytest.mark.gpu
def test_live_grading_scores_chapter_1_with_its_fresh_processes(tmp_path):
    """On a GPU: chapter 1 answered with its solutions, graded live. Its experiments start fresh
    processes (two settings at once, the knobs, the reader's own snapshot) inside the sandbox,
    under its process, memory and time limits."""
    _all_correct(_live(tmp_path, CH1, CH1_RIGHT, {}))


@pytest.mark.gpu
def test_live_grading_scores_chapter_2_with_the_event_handoff(tmp_path):
    """On a GPU: chapter 2 answered with its solutions, the event handoff included, graded live."""
    _all_correct(_live(tmp_path, CH2, CH2_RIGHT, {"ex-streams-handoff": (
        "streams.check_event_handoff(None)", "streams.check_event_handoff(my_handoff)")}))


@pytest.mark.gpu
def test_live_grading_scores_chapter_4_with_the_sync_free_rewrite(tmp_path):
    """On a GPU: chapter 4 answered with its solutions, the sync-free rewrite included, graded live."""
    _all_correct(_live(tmp_path, CH4, {**CH4_RIGHT, "ex-syncs-classify": _classification(False)}, {"ex-syncs-rewrite": (
        "syncs.check_sync_free_rewrite(None)", "syncs.check_sync_free_rewrite(reduce_grad_stats_sync_free)")}))


def test_judges_refuse_data_no_harness_returns():
    """A harness's data comes out of a sandbox the student's function ran in: a judge checks
    its shape and raises ReportError (an 'error' row), never anything else (a grader bug)."""
    from experiments.core.checks import EXERCISES, ReportError

    notebooks.exercises()
    judged = [ex for ex in EXERCISES.values() if ex.takes_function]
    assert {ex.label for ex in judged} == {"ex-alloc-frag-index", "ex-alloc-pages", "ex-streams-handoff",
                                           "ex-pinned-loader", "ex-syncs-rewrite"}
    forged = [None, 1, "correct", [], {}, {"correct": True}, {"outputs": "x"}, {"outputs": [{"value": "1"}] * 6},
              {"outputs": [{"value": 0.5, "raised": "x"}] * 36}, {"gpu": True}, {"gpu": "yes"},
              {"gpu": True, "error": None, "error_kind": None, "trials": "three"},
              {"gpu": True, "n_batches": 8, "n_buffers": 2, "yielded": [8], "wrong_batches": [[]], "ahead_ms": 1.0,
               "queued_ms": 200.0},
              {"gpu": True, "findings": [], "raised": None, "diff": ""}]
    for ex in judged:
        for report in forged:
            try:
                fb = ex.judge(report)
            except ReportError:
                continue
            assert fb.correct is not True, (ex.label, report, fb)


def test_a_cell_that_breaks_the_parser_is_a_cell_without_a_check_call():
    """Issue 16: a cell that makes Python's parser raise (RecursionError, MemoryError) stopped
    grading for the class. Here: no check call in it, and a check cell like it is an error."""
    from experiments.core.checks import EXERCISES

    notebooks.exercises()
    for bomb in ("x = " + "1+" * 20_000 + "1", "x = " + "-" * 50_000 + "1", "x = " + "[" * 300 + "]" * 300,
                 "x = 1\n" * 20_000):
        assert notebooks.parse_cell(bomb) is None or len(bomb) <= notebooks.MAX_PARSE_CHARS
        assert notebooks.find_check_call(bomb + "\npinned.check_rounding(4)", "check_rounding") is None
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y = " + "1+" * 20_000 + "1\npinned.check_rounding(4)")])
    nb.cells[0].metadata["exercise"] = "ex-pinned-rounding"
    [p] = notebooks.plan(nb, [EXERCISES["ex-pinned-rounding"]])
    assert (p.status, "does not parse" in p.problem) == ("error", True)
