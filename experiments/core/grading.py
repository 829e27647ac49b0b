"""Grade a class's submitted notebooks: ``python -m experiments grade SUBMISSION... --out grades.csv``.

Each notebook runs top to bottom in a fresh kernel (recorded mode unless ``live``), under
one time limit for the whole notebook, and errors do not stop it (a later exercise may
not depend on the cell that raised). After each exercise's check cell the grader adds
one cell that reads the answers the check call was given and shows them as JSON
(:mod:`experiments.core.grading_answers`). The score then comes from the *installed*
package's check, called in the grader (or, for answers that are functions, in a fresh
scoring subprocess) on those answers; nothing the notebook defined, including a
redefined check, takes part.

A check cell is the code cell tagged ``exercise: <label>`` in its metadata (the book's
notebook generator tags them with :func:`tag_exercise_cells`), or failing that the first
code cell that calls the exercise's check function. The answers are the arguments bound
to the check's answer parameters (:class:`experiments.core.checks.Exercise`); other arguments
(``result=``) are the check's own and ignored.

Statuses: ``correct``, ``wrong``, ``unanswered`` (the check's ``None``), ``missing`` (no
check cell, or its check call gone), ``error`` (its cell raised, the answer could not be
read, or the kernel died first), ``timeout`` (the time limit ran out before the exercise
finished), and ``needs_gpu`` (an exercise that runs the student's code on a GPU, graded
only with ``live=True``; 0 of 0 points otherwise).

Why not otter-grader (7.0) or nbgrader (0.9): both score with test code that runs in the
student's executed kernel (where a redefined check would answer), and each needs its
own assignment format (otter's assign notebooks and test files, whose results travel as
pickles; nbgrader's course directory, database and exchange). otter's local grading
runs in Docker unless told otherwise. The book already runs notebooks with nbclient,
so the layer here is that plus scoring.
"""
from __future__ import annotations

import ast
import copy
import csv
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import nbformat

from . import registry
from .checks import EXERCISES, Exercise, Feedback, graded_feedback
from .grading_answers import MIME, RESULT_MARK, decode, has_code

STATUSES = ("correct", "wrong", "unanswered", "missing", "error", "timeout", "needs_gpu")
COLUMNS = ("notebook", "exercise", "score", "max_score", "status", "feedback")
TOTAL = "total"
TAG = "exercise"  # cell metadata key: the exercise label of a check cell


class GradeInputError(ValueError):
    """A submission that is not a readable notebook, or a folder without notebooks."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the grades: an exercise of a notebook, or its total (``exercise='total'``,
    empty status). Points are floats; ``feedback`` is one line."""

    notebook: str
    exercise: str
    score: float
    max_score: float
    status: str
    feedback: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def exercises() -> dict[str, Exercise]:
    """Every declared exercise, by label (chapters loaded through the registry)."""
    registry.load_chapters()
    return dict(EXERCISES)


# ----------------------------------------------------------------------------- finding the check calls

def _parse(source: str) -> ast.Module | None:
    """The cell's code as Python (IPython magics turned into calls), or None."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return None


def find_check_call(source: str, check_name: str) -> tuple[str, ast.Call] | None:
    """The first call of ``check_name`` (``check(...)`` or ``mod.check(...)``) in a cell,
    with the parsed source it belongs to; None when there is none or the cell does not parse."""
    tree = _parse(source)
    if tree is None:
        return None
    from IPython.core.inputtransformer2 import TransformerManager

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and ((isinstance(n.func, ast.Name) and n.func.id == check_name)
                  or (isinstance(n.func, ast.Attribute) and n.func.attr == check_name))]
    if not calls:
        return None
    return TransformerManager().transform_cell(source), min(calls, key=lambda n: (n.lineno, n.col_offset))


def answer_expressions(source: str, call: ast.Call, ex: Exercise) -> dict[str, str] | str:
    """{answer parameter: expression source} for a check call, or a reason it cannot be read."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return "the check call uses * or ** arguments; pass the answers directly"
    out = {}
    for name, arg in zip(ex.answers, call.args):
        out[name] = ast.get_source_segment(source, arg)
    for k in call.keywords:
        if k.arg in ex.answers and k.arg not in out:
            out[k.arg] = ast.get_source_segment(source, k.value)
    for name in ex.answers:
        out.setdefault(name, "None")  # an answer left out is not answered
    return out


def tag_exercise_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Tag each exercise's check cell (``cell.metadata['exercise'] = label``) and record the
    chapter and the exercises' order in ``nb.metadata['memlab']``, for the grader. The check cell is the first code
    cell that calls the exercise's declared check. Returns ``nb`` (changed in place).

    Raises:
        ValueError: a check is called in the notebook for exercises of several chapters.
    """
    found: dict[str, Exercise] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop(TAG, None)
        for ex in exercises().values():
            if ex.label not in found and find_check_call(cell.source, ex.check_name):
                cell.metadata[TAG] = ex.label
                found[ex.label] = ex
                break
    chapters = sorted({ex.chapter for ex in found.values()})
    if len(chapters) > 1:
        raise ValueError(f"checks of chapters {chapters} in one notebook")
    if chapters:
        # the order lets every student's rows come in the book's order, whatever they deleted
        nb.metadata["memlab"] = {"chapter": chapters[0], "exercises": list(found)}
    return nb


# ----------------------------------------------------------------------------- submissions

def find_notebooks(submissions: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The notebooks to grade: each SUBMISSION is a .ipynb file or a folder (searched
    recursively, checkpoints left out), in the order given.

    Raises:
        GradeInputError: nothing given, a path that does not exist, a file that is not a
            .ipynb notebook, or a folder without one.
    """
    if not submissions:
        raise GradeInputError("no SUBMISSION given: pass notebooks (.ipynb) or folders of them")
    out: list[Path] = []
    for s in submissions:
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
            if not found:
                raise GradeInputError(f"SUBMISSION {str(p)!r} is a folder without any .ipynb notebook")
            out.extend(found)
        elif p.is_file():
            if p.suffix != ".ipynb":
                raise GradeInputError(f"SUBMISSION {str(p)!r} is not a notebook: expected a .ipynb file or a folder")
            out.append(p)
        else:
            raise GradeInputError(f"SUBMISSION {str(p)!r} does not exist")
    return out


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``.

    Raises:
        GradeInputError: unreadable, not JSON, or not a valid notebook.
    """
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except (OSError, UnicodeDecodeError) as e:
        raise GradeInputError(f"{path}: cannot read the file ({type(e).__name__}: {e})") from None
    except Exception as e:  # JSON errors and nbformat's validation errors have no common base
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GradeInputError(f"{path}: not a valid notebook ({first})") from None
    return nb


def notebook_exercises(nb: nbformat.NotebookNode, path: Path) -> list[Exercise]:
    """The exercises a notebook is graded on: every exercise of its chapter(s), in the
    book's order where the notebook's metadata records it.

    The chapter comes from the notebook's ``memlab`` metadata, else from its tagged
    cells, else from the checks it calls.

    Raises:
        GradeInputError: no exercise of the book found.
    """
    exs = exercises()
    chapters: set[int] = set()
    meta = nb.metadata.get("memlab", {})
    if isinstance(meta, Mapping) and meta.get("chapter") in (1, 2, 3, 4):
        chapters.add(meta["chapter"])
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not chapters:
        chapters = {exs[c.metadata[TAG]].chapter for c in code if c.metadata.get(TAG) in exs}
    if not chapters:
        chapters = {ex.chapter for ex in exs.values()
                    if any(re.search(rf"\b{ex.check_name}\s*\(", c.source) for c in code)}
    if not chapters:
        raise GradeInputError(f"{path}: no exercise of the book in it (hand out the notebooks that "
                              "`make book-student` writes)")
    mine = [ex for ex in exs.values() if ex.chapter in chapters]
    order = meta.get("exercises", []) if isinstance(meta, Mapping) else []
    rank = {label: i for i, label in enumerate(order)} if isinstance(order, list) else {}
    return sorted(mine, key=lambda ex: rank.get(ex.label, len(rank)))


# ----------------------------------------------------------------------------- running a notebook

@dataclasses.dataclass
class _Plan:
    ex: Exercise
    cell: int | None = None           # index of the check cell in the student's notebook
    problem: str | None = None        # why it is 'missing' or 'error' before running
    status: str | None = None
    expressions: dict[str, str] | None = None


def _plan(nb: nbformat.NotebookNode, exs: Sequence[Exercise]) -> list[_Plan]:
    plans = []
    for ex in exs:
        plan = _Plan(ex)
        tagged = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.metadata.get(TAG) == ex.label]
        calling = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and find_check_call(c.source, ex.check_name)]
        plan.cell = tagged[0] if tagged else (calling[0] if calling else None)
        if plan.cell is None:
            plan.status, plan.problem = "missing", "its check cell is missing (deleted, or its check call renamed)"
        else:
            found = find_check_call(nb.cells[plan.cell].source, ex.check_name)
            if found is None:
                plan.status, plan.problem = "missing", f"its check cell no longer calls {ex.check_name}"
            else:
                exprs = answer_expressions(found[0], found[1], ex)
                if isinstance(exprs, str):
                    plan.status, plan.problem = "error", exprs
                else:
                    plan.expressions = exprs
        plans.append(plan)
    return plans


def _capture_source(label: str, expressions: Mapping[str, str]) -> str:
    thunks = ", ".join(f"{name!r}: lambda: ({expr}\n)" for name, expr in expressions.items())
    return f"_memlab_capture({label!r}, {{{thunks}}})"


def _error_text(outputs: Iterable[Mapping[str, Any]]) -> str | None:
    for out in outputs:
        if out.get("output_type") == "error":
            return f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip()[:300]
    return None


def _captured(outputs: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for out in outputs:
        if out.get("output_type") == "display_data" and MIME in out.get("data", {}):
            data = out["data"][MIME]
            return json.loads(data) if isinstance(data, str) else data
    return None


def _execute(nb: nbformat.NotebookNode, plans: Sequence[_Plan], *, timeout_s: float, mode: str
             ) -> tuple[nbformat.NotebookNode, dict[int, int], dict[int, int], int | None, str | None]:
    """Run the student's cells with a capture cell after each check cell.

    Returns the executed notebook, {student cell index: its index there}, {student cell
    index of a check cell: index of its capture cell there}, the
    index of the first executed cell that did not finish in time (or None) and, when
    the kernel died, a line saying so.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    run = nbformat.v4.new_notebook(metadata=copy.deepcopy(nb.metadata))
    setup = nbformat.v4.new_code_cell(f"from {__package__}.grading_answers import capture as _memlab_capture")
    run.cells.append(setup)
    capture_at: dict[int, int] = {}
    student_at: dict[int, int] = {}
    by_cell = {p.cell: p for p in plans if p.expressions is not None}
    for i, cell in enumerate(nb.cells):
        c = copy.deepcopy(cell)
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        student_at[i] = len(run.cells)
        run.cells.append(c)
        if i in by_cell:
            capture_at[i] = len(run.cells)
            run.cells.append(nbformat.v4.new_code_cell(_capture_source(by_cell[i].ex.label, by_cell[i].expressions)))
    env = dict(os.environ, CUDA_MEMLAB_MODE=mode, MPLBACKEND="Agg")
    stopped, dead = None, None
    with tempfile.TemporaryDirectory(prefix="memlab-grade-") as work:
        client = NotebookClient(run, timeout=max(1, int(timeout_s)), kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": work}}, record_timing=False)
        deadline = time.monotonic() + timeout_s
        # The kernel's cwd is resources' path. Its own stderr (a transport warning, a traceback
        # when it is stopped mid-reply) is no business of the grade; cell output comes by messages.
        with client.setup_kernel(env=env, stderr=subprocess.DEVNULL):
            for index, cell in enumerate(run.cells):
                if cell.cell_type != "code":
                    continue
                left = deadline - time.monotonic()
                if left < 1:
                    stopped = index
                    break
                client.timeout = max(1, int(left))
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    stopped = index
                    break
                except DeadKernelError:
                    dead, stopped = "the kernel died", index
                    break
    return run, student_at, capture_at, stopped, dead


# ----------------------------------------------------------------------------- scoring

def _score_in_subprocess(ex: Exercise, answers: Mapping[str, Any], *, mode: str, timeout_s: float
                         ) -> Mapping[str, Any]:
    env = dict(os.environ, CUDA_MEMLAB_MODE=mode, MPLBACKEND="Agg")
    request = json.dumps({"label": ex.label, "answers": answers})
    with tempfile.TemporaryDirectory(prefix="memlab-score-") as work:
        try:
            proc = subprocess.run([sys.executable, "-m", f"{__package__}.grading_answers"], input=request,
                                  capture_output=True, text=True, timeout=timeout_s, env=env, cwd=work)
        except subprocess.TimeoutExpired:
            return {"timeout": f"scoring the answer took longer than {timeout_s:g} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return {"error": f"scoring the answer failed: {tail[0][:200]}"}
    return json.loads(lines[-1][len(RESULT_MARK):])


def _score(ex: Exercise, captured: Mapping[str, Any], *, mode: str, score_timeout_s: float
           ) -> tuple[str, str, str]:
    """(status, graded feedback, full feedback) for one exercise's captured answers."""
    answers = captured.get("answers", {})
    for name in ex.answers:
        entry = answers.get(name)
        if not isinstance(entry, Mapping) or ("value" not in entry and "raised" not in entry):
            return "error", f"the answer {name} could not be read", ""
        if "raised" in entry:
            return "error", f"evaluating the answer {name} raised {entry['raised']}", ""
    encoded = {name: answers[name]["value"] for name in ex.answers}
    if any(has_code(v) for v in encoded.values()):
        result = _score_in_subprocess(ex, encoded, mode=mode, timeout_s=score_timeout_s)
        if "timeout" in result:
            return "timeout", result["timeout"], ""
        if "error" in result:
            return "error", result["error"], ""
        fb = Feedback(result["correct"], result["message"], {"wrong_parts": result["wrong_parts"]})
    else:
        try:
            fb = ex.check(**{k: decode(v) for k, v in encoded.items()})
        except Exception as e:  # the check refused the answer (a bug of ours or a value it cannot take)
            return "error", f"the check raised {type(e).__name__}: {e}"[:300], ""
    status = {True: "correct", False: "wrong", None: "unanswered"}[fb.correct]
    return status, graded_feedback(fb), fb.message


def grade_notebook(path: str | os.PathLike[str], *, timeout_s: float = 600.0, live: bool = False,
                   feedback: str = "graded", score_timeout_s: float = 120.0, name: str | None = None) -> list[Row]:
    """Grade one notebook: one row per exercise of its chapter, then the total row.

    Args:
        timeout_s: time limit for running the whole notebook, in seconds (> 0).
        live: run on this machine's GPU (``CUDA_MEMLAB_MODE=live``) and grade the GPU
            exercises too; default recorded mode, which needs no GPU.
        feedback: 'graded' (correct / wrong / which part) or 'full' (the check's message,
            as a student would see it, for returning to students).
        score_timeout_s: time limit for scoring one answer that is a function.
        name: the notebook's name in the rows (default: the path).

    Raises:
        GradeInputError: not a readable notebook, or no exercise of the book in it.
        ValueError: timeout_s <= 0 or an unknown feedback style.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if feedback not in ("graded", "full"):
        raise ValueError(f"feedback must be 'graded' or 'full', got {feedback!r}")
    path = Path(path)
    nb = read_notebook(path)
    exs = notebook_exercises(nb, path)
    plans = _plan(nb, exs)
    mode = "live" if live else "recorded"
    run, shift, capture_at, stopped, dead = _execute(nb, plans, timeout_s=timeout_s, mode=mode)
    nb_name = name if name is not None else str(path)
    rows = []
    saved = os.environ.get("CUDA_MEMLAB_MODE")
    os.environ["CUDA_MEMLAB_MODE"] = mode  # the checks look up recorded (or live) results
    try:
        for plan in plans:
            ex = plan.ex
            points = 0.0 if (ex.needs_gpu and not live) else float(ex.points)
            status, text, full = _row(plan, run, shift, capture_at, stopped, dead, live=live, mode=mode,
                                      timeout_s=timeout_s, score_timeout_s=score_timeout_s)
            shown = full if (feedback == "full" and full) else text
            rows.append(Row(nb_name, ex.label, points if status == "correct" else 0.0, points, status, shown))
    finally:
        if saved is None:
            os.environ.pop("CUDA_MEMLAB_MODE", None)
        else:
            os.environ["CUDA_MEMLAB_MODE"] = saved
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if stopped is not None or dead:
        summary += f"; stopped early: {dead or 'the time limit ran out'}"
    rows.append(Row(nb_name, TOTAL, sum(r.score for r in rows), sum(r.max_score for r in rows), "", summary))
    return rows


def _row(plan: _Plan, run: nbformat.NotebookNode, shift: Mapping[Any, int], capture_at: Mapping[int, int],
         stopped: int | None, dead: str | None, *, live: bool, mode: str, timeout_s: float,
         score_timeout_s: float) -> tuple[str, str, str]:
    ex = plan.ex
    if ex.needs_gpu and not live:
        return "needs_gpu", "runs the student's code on a GPU: grade with --live on a GPU machine", ""
    if plan.status is not None:
        return plan.status, plan.problem or "", ""
    check_index = shift[plan.cell]
    capture_index = capture_at[plan.cell]
    if stopped is not None and stopped <= capture_index:
        if dead:
            return "error", f"{dead} before this exercise finished", ""
        return "timeout", f"the notebook's time limit ({timeout_s:g} s) ran out before this exercise finished", ""
    raised = _error_text(run.cells[check_index].get("outputs", []))
    if raised:
        return "error", f"its cell raised {raised}", ""
    captured = _captured(run.cells[capture_index].get("outputs", []))
    if captured is None or captured.get("label") != ex.label:
        why = _error_text(run.cells[capture_index].get("outputs", [])) or "no answers came back"
        return "error", f"its answers could not be read ({why})", ""
    return _score(ex, captured, mode=mode, score_timeout_s=score_timeout_s)


def grade(submissions: Sequence[str | os.PathLike[str]], *, jobs: int = 1, **kwargs: Any) -> list[Row]:
    """Grade every notebook of ``submissions`` (files or folders), checked up front.

    Args:
        jobs: notebooks graded at once (1 to 64), each in its own process and kernel;
            rows keep the order of the notebooks.
        kwargs: go to :func:`grade_notebook`.

    Raises:
        GradeInputError: see :func:`find_notebooks`, :func:`read_notebook`.
        ValueError: jobs outside 1-64.
    """
    if not (isinstance(jobs, int) and 1 <= jobs <= 64):
        raise ValueError(f"jobs must be an integer in [1, 64], got {jobs!r}")
    paths = find_notebooks(submissions)
    for p in paths:
        notebook_exercises(read_notebook(p), p)  # every input is checked before anything runs
    if jobs == 1 or len(paths) == 1:
        return [row for p in paths for row in grade_notebook(p, **kwargs)]
    import concurrent.futures
    import functools
    import multiprocessing

    # spawn: a fresh interpreter per worker (no forked state of a caller's threads)
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(paths)),
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        per_notebook = list(pool.map(functools.partial(grade_notebook, **kwargs), paths))
    return [row for rows in per_notebook for row in rows]


# ----------------------------------------------------------------------------- output

def exercise_table(order: Sequence[str] = ()) -> str:
    """The instructors' table, objectives -> exercises -> points, as MyST Markdown (one row
    per exercise, by chapter, with each chapter's total), from the exercises' declarations.

    Args:
        order: exercise labels in the book's order (the generator passes them); labels
            not in it follow in the order they were declared.
    """
    from .chapters import by_number

    lines = ["| chapter | learning objective | exercise | check | points | graded without a GPU |",
             "|---|---|---|---|---|---|"]
    rank = {label: i for i, label in enumerate(order)}
    exs = sorted(exercises().values(), key=lambda e: (e.chapter, rank.get(e.label, len(rank))))
    for chapter in sorted({e.chapter for e in exs}):
        mine = [e for e in exs if e.chapter == chapter]
        for e in mine:
            objective = e.objective.replace("|", "\\|")
            face = e.check.__module__.split(".")[1]  # experiments.<chapter>.checks
            lines.append(f"| {chapter} | {objective} | {{ref}}`{e.label}` | `{face}.{e.check_name}` | {_num(e.points)} | "
                         f"{'no: `--live` on a GPU' if e.needs_gpu else 'yes'} |")
        lines.append(f"| {chapter} | **{by_number(chapter).title}: total** | | | "
                     f"**{_num(sum(e.points for e in mine))}** | |")
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    return f"{x:g}"


def rows_to_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([r.notebook, r.exercise, _num(r.score), _num(r.max_score), r.status, r.feedback])
    return buf.getvalue()


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
